// Golden-state test (llm.c style): an independent float64 PyTorch implementation of the same model
// (tools/reference/) dumped inputs, parameters, logits, loss, every parameter gradient and a 10-step
// AdamW loss curve; the C++ engine must reproduce them from the same parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "model/model.h"
#include "testing.h"
#include "train/optimizer.h"

using namespace hlm;

namespace {

// The bounds of the golden checks (relative RMS error for tensors, absolute for losses), the same for every file.
// Measured on the five files: logits 1.3e-7 - 2.5e-7, parameter gradients (sums over all B*T tokens, through
// every layer) at most 8.2e-7.
struct GoldenTol {
  double logits = 2e-6;
  double loss = 2e-6;
  double grads = 1e-5;
  double curve_per_step = 2e-5;  // the AdamW loss curve: errors grow with each step
};

// The file's config and parameters in the C++ model: logits, loss and every parameter gradient on its batch,
// then its 10-step AdamW loss curve.
void check_golden(const std::string& name, const GoldenTol& tol = {}) {
  const std::string path = std::string(HLM_SOURCE_DIR) + "/tests/data/golden_" + name + ".safetensors";
  SafeTensorsFile f = SafeTensorsFile::read(path);
  ModelConfig cfg = ModelConfig::from_json(nlohmann::json::parse(f.meta("config")), path);
  auto oj = nlohmann::json::parse(f.meta("optimizer"));
  Model m(cfg);
  for (const auto& p : m.registry().all()) {
    const float* src = f.get_f32(p.name, p.shape);
    std::copy(src, src + p.shape.numel(), m.params() + p.offset);
  }
  const SafeTensor& ids = f.get("input_ids");
  const i64 B = ids.shape[0], T = ids.shape[1], V = cfg.vocab_size;
  const int32_t* in = ids.i32();
  const int32_t* tg = f.get("targets").i32();

  m.plan(B, T);
  std::vector<float> logits = hlm::testing::nan_vec(static_cast<size_t>(B * T * V));
  m.forward_logits(in, nullptr, B, T, logits.data());
  const float* want_logits = f.get_f32("logits", {B, T, V});
  EXPECT_TRUE(hlm::testing::close_rel(logits, std::vector<float>(want_logits, want_logits + B * T * V), tol.logits,
                                      name + " logits"));

  i64 n = 0;
  m.zero_grad();
  const double loss = m.forward(in, tg, nullptr, B, T, &n) / static_cast<double>(n);
  EXPECT_NEAR(loss, f.get_f32("loss", {1})[0], tol.loss) << name;
  m.backward(1.0f / static_cast<float>(n));
  for (const auto& p : m.registry().all()) {
    const float* want = f.get_f32("grad." + p.name, p.shape);
    std::vector<float> got(m.grads() + p.offset, m.grads() + p.offset + p.shape.numel());
    EXPECT_TRUE(hlm::testing::close_rel(got, std::vector<float>(want, want + p.shape.numel()), tol.grads,
                                        name + " grad " + p.name));
  }

  AdamWConfig ac;
  ac.lr = oj.at("lr");
  ac.beta1 = oj.at("beta1");
  ac.beta2 = oj.at("beta2");
  ac.eps = oj.at("eps");
  ac.weight_decay = oj.at("weight_decay");
  ac.grad_clip = oj.at("grad_clip");
  AdamW opt(m.registry(), ac);
  const SafeTensor& losses = f.get("losses");
  for (i64 s = 0; s < losses.numel(); ++s) {
    m.zero_grad();
    const double l = m.forward(in, tg, nullptr, B, T, &n) / static_cast<double>(n);
    EXPECT_NEAR(l, losses.f32()[s], tol.curve_per_step * (1 + s)) << name << " loss after " << s << " AdamW steps";
    m.backward(1.0f / static_cast<float>(n));
    opt.clip(m.grads());
    opt.step(m.params(), m.grads(), ac.lr);
  }
}

}  // namespace

TEST(Golden, SlidingWindowWithNoPEFullLayers) { check_golden("swa_nope"); }
TEST(Golden, FullAttentionRoPEWithQKNorm) { check_golden("full_rope_qknorm"); }
TEST(Golden, LightningHybrid) { check_golden("lightning"); }
TEST(Golden, Mamba2Hybrid) { check_golden("mamba2"); }
TEST(Golden, GatedDeltaNetHybrid) { check_golden("gdn"); }
