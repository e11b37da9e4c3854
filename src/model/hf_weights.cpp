#include "model/hf_weights.h"

#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "mixers/gdn.h"
#include "model/hf_config.h"

namespace hlm {

namespace fs = std::filesystem;

namespace {

float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// IEEE half -> float, including subnormals, infinities and NaN.
float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void copy_as_f32(const SafeTensor& t, float* dst) {
  const i64 n = t.numel();
  if (t.dtype == "F32" || t.dtype == "F64") {
    std::vector<float> v = t.to_f32();
    std::copy(v.begin(), v.end(), dst);
    return;
  }
  if (t.dtype != "BF16" && t.dtype != "F16")
    fail("{}: tensor '{}' has dtype {} (import reads F32, BF16, F16, F64)", t.file, t.name, t.dtype);
  if (static_cast<i64>(t.nbytes) != 2 * n) fail("{}: tensor '{}' holds {} bytes for {} values", t.file, t.name, t.nbytes, n);
  const bool bf = t.dtype == "BF16";
  for (i64 i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, t.data + 2 * i, 2);
    dst[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
  }
}

// The weight files of a folder: model.safetensors, or the shards its index names.
std::vector<std::string> weight_files(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single)) return {single.string()};
  if (!fs::exists(index)) fail("{}: neither model.safetensors nor model.safetensors.index.json", dir);
  std::ifstream f(index);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number too large
    fail("{}: malformed JSON: {}", index.string(), e.what());
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    fail("{}: missing object 'weight_map'", index.string());
  std::set<std::string> files;
  for (auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) fail("{}: weight_map.{} must be a file name", index.string(), name);
    const std::string fname = file.get<std::string>();
    if (fname.find('/') != std::string::npos || fname == "..")
      fail("{}: weight_map.{} names '{}' outside the folder", index.string(), name, fname);
    files.insert((fs::path(dir) / fname).string());
  }
  return {files.begin(), files.end()};
}

bool is_rotary_buffer(const std::string& name) {
  const std::string tail = "rotary_emb.inv_freq";
  return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Qwen3Next's tensors for a model of G layers. Its Gated DeltaNet fuses the projections per key head:
// in_proj_qkvz rows are, for each head h, q_h | k_h | v_h | z_h (K rows each; z is hybridlm's gate g_proj), and
// in_proj_ba rows b_h | a_h; conv1d is hybridlm's q | k | v convs stacked; its block norms are zero-centred
// (it multiplies by 1 + w), so they are written as w - 1. `keep` owns the new buffers until the write.
void add_qwen3next_tensors(Model& m, SafeTensorsWriter& w, std::deque<std::vector<float>>& keep) {
  const ParamRegistry& reg = m.registry();
  auto data = [&](const std::string& name) -> std::pair<const ParamInfo*, const float*> {
    const ParamInfo& p = reg.info(reg.find(name));
    return {&p, m.params() + p.offset};
  };
  std::set<std::string> fused;
  for (const ParamInfo& p : reg.all()) {
    const float* src = m.params() + p.offset;
    const size_t at = p.name.find(".linear_attn.");
    if (at == std::string::npos) {
      if (ends_with(p.name, "layernorm.weight") || p.name == "model.norm.weight") {
        std::vector<float>& v = keep.emplace_back(src, src + p.shape.numel());
        for (float& x : v) x -= 1.0f;
        w.add_f32(p.name, p.shape, v.data());
      } else {
        w.add_f32(p.name, p.shape, src);
      }
      continue;
    }
    const std::string pre = p.name.substr(0, at + std::strlen(".linear_attn."));
    if (!fused.insert(pre).second) continue;
    auto [qi, q] = data(pre + "q_proj.weight");
    const i64 H = data(pre + "a_proj.weight").first->shape[0], D = qi->shape[1], K = qi->shape[0] / H;
    std::vector<float>& qkvz = keep.emplace_back();
    std::vector<float>& ba = keep.emplace_back();
    for (i64 h = 0; h < H; ++h) {
      for (const char* part : {"q_proj", "k_proj", "v_proj", "g_proj"}) {
        const float* rows = data(pre + part + ".weight").second + h * K * D;
        qkvz.insert(qkvz.end(), rows, rows + K * D);
      }
      for (const char* part : {"b_proj", "a_proj"}) {
        const float* row = data(pre + part + ".weight").second + h * D;
        ba.insert(ba.end(), row, row + D);
      }
    }
    std::vector<float>& conv = keep.emplace_back();
    for (const char* part : {"q_conv1d", "k_conv1d", "v_conv1d"}) {
      auto [ci, c] = data(pre + part + ".weight");
      conv.insert(conv.end(), c, c + ci->shape.numel());
    }
    w.add_f32(pre + "in_proj_qkvz.weight", {4 * H * K, D}, qkvz.data());
    w.add_f32(pre + "in_proj_ba.weight", {2 * H, D}, ba.data());
    w.add_f32(pre + "conv1d.weight", {3 * H * K, 1, GatedDeltaNetMixer::kConv}, conv.data());
    for (auto [from, to] : {std::pair{"A_log", "A_log"}, {"dt_bias", "dt_bias"}, {"o_norm.weight", "norm.weight"},
                            {"o_proj.weight", "out_proj.weight"}}) {
      auto [info, d] = data(pre + from);
      w.add_f32(pre + to, info->shape, d);
    }
  }
}

}  // namespace

void write_hf_weights(const Model& model, const std::string& architecture, const std::string& path) {
  Model& m = const_cast<Model&>(model);
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  std::deque<std::vector<float>> keep;
  if (architecture == "Qwen3NextForCausalLM") {
    add_qwen3next_tensors(m, w, keep);
  } else {
    for (const auto& p : model.registry().all())
      w.add_f32(hf_tensor_name(architecture, p.name), p.shape, m.params() + p.offset);
  }
  w.write(path);
}

void load_hf_weights(const std::string& hf_dir, const std::string& architecture, Model& model, bool tied_embeddings) {
  const ParamRegistry& reg = model.registry();
  std::vector<bool> loaded(reg.all().size(), false);
  std::map<std::string, int> index;  // the architecture's tensor name -> registry index
  for (size_t i = 0; i < reg.all().size(); ++i) index[hf_tensor_name(architecture, reg.all()[i].name)] = static_cast<int>(i);
  for (const std::string& path : weight_files(hf_dir)) {
    SafeTensorsFile f = SafeTensorsFile::read(path);
    for (const SafeTensor& t : f.tensors()) {
      const auto it = index.find(t.name);
      if (it == index.end()) {
        if (is_rotary_buffer(t.name)) continue;
        fail("{}: tensor '{}' has no place in the imported model", path, t.name);
      }
      const ParamInfo& p = reg.info(it->second);
      t.expect_shape(p.shape);
      copy_as_f32(t, model.params() + p.offset);
      loaded[static_cast<size_t>(it->second)] = true;
    }
  }
  const int head = reg.find("lm_head.weight"), embed = reg.find("model.embed_tokens.weight");
  if (tied_embeddings && !loaded[static_cast<size_t>(head)] && loaded[static_cast<size_t>(embed)]) {
    const ParamInfo &h = reg.info(head), &e = reg.info(embed);
    std::copy(model.params() + e.offset, model.params() + e.offset + e.shape.numel(), model.params() + h.offset);
    loaded[static_cast<size_t>(head)] = true;
  }
  for (size_t i = 0; i < loaded.size(); ++i)
    if (!loaded[i])
      fail("{}: tensor '{}' is missing from the weight files", hf_dir,
           hf_tensor_name(architecture, reg.info(static_cast<int>(i)).name));
}

}  // namespace hlm
