// MQAR (associative recall, src/data/mqar.*): the generator's format and determinism, and the task doing
// its job: a tiny 2-layer hybrid whose second layer carries long-range state (SWA + Lightning) learns
// recall in a few seconds, while a purely local model (two window-4 SWA layers) stays at chance. The Mamba-2
// and Gated DeltaNet hybrids do not learn the 8-pair task at this budget; on 4 pairs they get well above
// chance where the local model does not (the >0.9 targets are the disabled tests below).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "core/timer.h"
#include "data/mqar.h"
#include "model/config.h"
#include "model/model.h"
#include "train/trainer.h"

using namespace hlm;

namespace {

class MqarStream final : public BatchStream {
 public:
  MqarStream(const data::MqarConfig& c, std::uint64_t seed, i64 B) : gen_(c, seed), B_(B) {}
  void next(Batch& b) override {
    gen_.next(B_, tmp_);
    b.B = tmp_.B;
    b.T = tmp_.T;
    b.inputs = tmp_.inputs;
    b.targets = tmp_.targets;
    b.doc_start.clear();
  }
  nlohmann::json state() const override { return {{"position", gen_.position()}}; }
  void set_state(const nlohmann::json& s) override { gen_.set_position(s.at("position").get<std::uint64_t>()); }

 private:
  data::MqarGenerator gen_;
  i64 B_;
  data::MqarBatch tmp_;
};

data::MqarConfig task(i64 kv_pairs = 8) {
  data::MqarConfig c;
  c.vocab_size = 128;
  c.seq_len = 64;
  c.num_kv_pairs = kv_pairs;
  return c;
}

ModelConfig recall_model(const std::string& pattern) {
  json j = {{"d_model", 64},       {"n_layers", 2},     {"n_heads", 2},       {"n_kv_heads", 2},
            {"head_dim", 32},      {"d_ff", 128},       {"vocab_size", 128},  {"max_seq_len", 64},
            {"pattern", pattern},  {"window", 4},       {"chunk_size", 32},   {"mamba_d_state", 32},
            {"layer_types", {{"S", {{"rope", true}}}}}};
  return ModelConfig::from_json(j, "recall test");
}

double accuracy(Model& m, const data::MqarConfig& c, std::uint64_t seed, int batches) {
  data::MqarGenerator gen(c, seed);
  data::MqarBatch b;
  double acc = 0;
  for (int i = 0; i < batches; ++i) {
    gen.next(64, b);
    std::vector<float> logits(static_cast<size_t>(b.B * b.T * 128));
    m.forward_logits(b.inputs.data(), nullptr, b.B, b.T, logits.data());
    acc += data::mqar_accuracy(logits.data(), b.targets.data(), b.B * b.T, 128);
  }
  return acc / batches;
}

// Trains `pattern` on MQAR for `steps` steps of 32 rows; returns the recall accuracy on 256 held-out rows.
// The N(0, 0.02) init of the large models is scaled by 3 (std 0.06, about 0.5/sqrt(d_model)): at
// d_model 64 the 0.02 init starts with such weak signals that even full attention needs thousands of
// steps to leave the plateau, with 0.06 the L and F hybrids solve the task in a few hundred.
double train_recall(const std::string& pattern, long steps, double* seconds, i64 kv_pairs = 8) {
  const data::MqarConfig c = task(kv_pairs);
  ModelConfig cfg = recall_model(pattern);
  Model m(cfg);
  m.init(1);
  for (const auto& p : m.registry().all())
    if (p.init == Init::Normal)
      for (i64 i = 0; i < p.shape.numel(); ++i) m.params()[p.offset + i] *= 3.0f;
  MqarStream s(c, 11, 32);
  TrainConfig tc;
  tc.steps = steps;
  tc.batch = 32;
  tc.seq_len = 64;
  tc.schedule.kind = "constant";
  tc.schedule.lr = 3e-3;
  tc.schedule.warmup = 20;
  tc.adamw.weight_decay = 0.1;
  tc.eval_every = 0;
  tc.quiet = true;
  // One thread: at this size (2048 tokens x d 64 per step) the work per parallel region is tiny, and on a
  // shared, oversubscribed machine every OpenMP barrier can cost a scheduler time slice (measured: the same
  // 400 steps took 56 s with 2 threads under load, 6 s with 1).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Timer t;
  Trainer tr(m, tc, s, nullptr);
  tr.run();
  *seconds = t.seconds();
  const double acc = accuracy(m, c, 999, 4);
  omp_set_num_threads(threads);
  return acc;
}

// Trains and checks accuracy > bound (above) or < bound, recording accuracy and seconds.
void expect_recall(const std::string& pattern, long steps, i64 kv_pairs, double bound, bool above) {
  double sec = 0;
  const double acc = train_recall(pattern, steps, &sec, kv_pairs);
  ::testing::Test::RecordProperty("accuracy", fmt::format("{:.3f}", acc));
  ::testing::Test::RecordProperty("seconds", fmt::format("{:.1f}", sec));
  if (above)
    EXPECT_GT(acc, bound) << pattern << " recall accuracy (" << kv_pairs << " pairs) after " << sec << " s";
  else
    EXPECT_LT(acc, bound) << pattern << " recall accuracy (" << kv_pairs << " pairs) after " << sec << " s";
}

}  // namespace

TEST(Mqar, RowsHaveTheZoologyFormat) {
  const data::MqarConfig c = task();
  data::MqarGenerator gen(c, 5);
  data::MqarBatch b;
  gen.next(200, b);
  ASSERT_EQ(b.inputs.size(), 200u * 64u);
  const i64 kv = c.num_kv_pairs, half = c.vocab_size / 2;
  std::map<i64, int> gap_hist;
  for (i64 r = 0; r < b.B; ++r) {
    const int32_t* in = b.inputs.data() + r * b.T;
    const int32_t* tg = b.targets.data() + r * b.T;
    std::map<int32_t, int32_t> kvmap;
    std::set<int32_t> vals;
    for (i64 i = 0; i < kv; ++i) {
      ASSERT_GE(in[2 * i], 1);
      ASSERT_LT(in[2 * i], half);
      ASSERT_GE(in[2 * i + 1], half);
      ASSERT_LT(in[2 * i + 1], c.vocab_size);
      ASSERT_TRUE(kvmap.emplace(in[2 * i], in[2 * i + 1]).second) << "keys repeat within a row";
      ASSERT_TRUE(vals.insert(in[2 * i + 1]).second) << "values repeat within a row";
      ASSERT_EQ(tg[2 * i], -1);
      ASSERT_EQ(tg[2 * i + 1], -1);
    }
    int queries = 0;
    for (i64 t = 2 * kv; t < b.T; ++t) {
      ASSERT_GE(in[t], 0);
      ASSERT_LT(in[t], c.vocab_size);
      if (tg[t] >= 0) {
        ++queries;
        ASSERT_EQ((t - 2 * kv) % 2, 0) << "queries sit at even offsets of the query region";
        ASSERT_EQ(kvmap.count(in[t]), 1u);
        ASSERT_EQ(tg[t], kvmap[in[t]]) << "target = the queried key's value";
        gap_hist[(t - 2 * kv) / 2]++;
      }
    }
    ASSERT_EQ(queries, kv) << "every key is queried exactly once";
  }
  // power_a = 0.01 favours early slots: slot 0 is used far more often than the last slot.
  EXPECT_GT(gap_hist[0], 4 * std::max(1, gap_hist[(64 - 16) / 2 - 1]));
}

TEST(Mqar, DeterministicBySeedAndResumable) {
  data::MqarGenerator a(task(), 3), b(task(), 3), c(task(), 4);
  data::MqarBatch x, y, z;
  a.next(8, x);
  b.next(8, y);
  c.next(8, z);
  EXPECT_EQ(x.inputs, y.inputs);
  EXPECT_EQ(x.targets, y.targets);
  EXPECT_NE(x.inputs, z.inputs);
  a.next(8, x);  // second batch
  b.set_position(8);
  b.next(8, y);
  EXPECT_EQ(x.inputs, y.inputs);
  EXPECT_EQ(a.position(), 16u);
}

TEST(Mqar, BadConfigsAreErrorsNamingTheField) {
  data::MqarConfig c = task();
  c.vocab_size = 16;  // keys [1, 8) hold only 7
  EXPECT_THROW(data::MqarGenerator(c, 1), Error);
  c = task();
  c.seq_len = 30;  // 16 context + 7 query slots < 8
  try {
    data::MqarGenerator g(c, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seq_len"), std::string::npos) << e.what();
  }
}

TEST(Mqar, AccuracyScorer) {
  const float logits[3 * 4] = {0, 1, 0, 0, /**/ 5, 0, 0, 0, /**/ 0, 0, 0, 9};
  const int32_t targets[3] = {1, -1, 2};
  EXPECT_DOUBLE_EQ(data::mqar_accuracy(logits, targets, 3, 4), 0.5);
  const int32_t pred[3] = {1, 0, 2};
  EXPECT_DOUBLE_EQ(data::mqar_accuracy_from_predictions(pred, targets, 3), 1.0);
}

// Chance is 1/64 (the value range); knowing which 8 values the row holds gives 1/8.
TEST(Recall, LightningHybridLearnsMqar) {
  double sec = 0;
  const double acc = train_recall("SL", 400, &sec);
  RecordProperty("accuracy", fmt::format("{:.3f}", acc));
  RecordProperty("seconds", fmt::format("{:.1f}", sec));
  EXPECT_GT(acc, 0.9) << "SL recall accuracy after " << sec << " s";
}

// Mamba-2 and Gated DeltaNet at the same size and budget, on the easier 4-pair task (same length and
// vocabulary, so the query gaps are as long): their long-range layer must carry the pairs well above chance
// (1/64) while the window-4 control trained identically stays near it. Measured (1 thread, Release, on the
// shared 2-core machine under load): SG 0.13-0.17 (13-20 s), SM 0.13 (17 s), SS 0.04 (9 s). They learn much
// more slowly than SL (see the disabled tests below for the >0.9 target and what was tried).
TEST(Recall, Mamba2HybridBeatsChanceOnFourPairs) { expect_recall("SM", 400, 4, 0.08, true); }

TEST(Recall, GatedDeltaNetHybridBeatsChanceOnFourPairs) { expect_recall("SG", 400, 4, 0.08, true); }

// The presets' kinds of hybrid (efficient layer + full attention, as `mamba2` = MMMF and `gdn` = GGGF) on
// the full 8-pair task: here the full-attention layer looks up the key, and the M / G layer below it must bind
// each value to its key (its short conv and recurrence are the model's only local mixing), so a broken M / G
// forward or backward shows as a failure to learn. MF: > 0.9 after 400 steps (7 s). Compare
// LocalOnlyModelStaysNearChance (SS, 400 steps).
TEST(Recall, Mamba2PlusFullAttentionHybridLearnsMqar) { expect_recall("MF", 400, 8, 0.9, true); }

// G binds more slowly than M here (measured, 1 thread: 0.12 after 400 steps, 0.88 after 800, > 0.9 after
// 1000 in 23 s on the shared machine, load ~3), so it gets 1000 steps.
TEST(Recall, GatedDeltaNetPlusFullAttentionHybridLearnsMqar) { expect_recall("GF", 1000, 8, 0.9, true); }

TEST(Recall, LocalOnlyModelStaysNearChanceOnFourPairs) { expect_recall("SS", 400, 4, 0.06, false); }

// Disabled targets: SM and SG above 0.9 on the 8-pair task. With this recipe both stay at chance (0.02) after
// 400-1200 steps. Looked for and not found (engine, 400 steps unless said): every parameter of the G layer
// gets a gradient of sensible size on a real batch (rms 2e-3 .. 2e-2, none zero); an independent float32
// PyTorch GDN (WY form, same model, torch AdamW) behaves the same, also without the q/k L2 norm, without
// o_norm, with a sigmoid or no output gate, without the 1/sqrt(K) q scale, with beta biased to 0.9, and with
// fla's model-level N(0, 0.02) conv init; recipe variations: no decay (A_log = -6), identity conv + no decay
// (0.06; 0.10 after 1200 steps), lr 1e-2, init boost 1 / 6, d_model 128 with 4 heads, 4x16 or 1x64 heads,
// batch 64. On 4 pairs SG / SM reach 0.22 / 0.24 after 800 steps. Before: SM variations (lr 1e-3..1e-2,
// init scale 1..6, d_model 128 / d_state 64, long-memory dt_bias / A_log, D = 0, identity conv, no weight
// decay, vocab 32) reach at most 0.17 in 600 steps. A PyTorch ablation (docs/mixers.md) finds a combination
// of features, the SiLU output gate and the delta rule the largest: an L-like G layer (identity conv, no
// decay, no q/k norm, sigmoid gate, additive rule) reaches 0.89; with the SiLU gate 0.07, with the delta
// rule 0.12. Run with --gtest_also_run_disabled_tests.
TEST(Recall, DISABLED_Mamba2HybridLearnsMqar) {
  double sec = 0;
  const double acc = train_recall("SM", 2000, &sec);
  RecordProperty("accuracy", fmt::format("{:.3f}", acc));
  EXPECT_GT(acc, 0.9) << "SM recall accuracy after " << sec << " s";
}

TEST(Recall, DISABLED_GatedDeltaNetHybridLearnsMqar) {
  double sec = 0;
  const double acc = train_recall("SG", 2000, &sec);
  RecordProperty("accuracy", fmt::format("{:.3f}", acc));
  EXPECT_GT(acc, 0.9) << "SG recall accuracy after " << sec << " s";
}

TEST(Recall, LocalOnlyModelStaysNearChance) {
  double sec = 0;
  const double acc = train_recall("SS", 400, &sec);
  RecordProperty("accuracy", fmt::format("{:.3f}", acc));
  EXPECT_LT(acc, 0.1) << "SS (window 4) recall accuracy after " << sec << " s";
}
