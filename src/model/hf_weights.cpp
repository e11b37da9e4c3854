#include "model/hf_weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
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

}  // namespace

void write_hf_weights(const Model& model, const std::string& architecture, const std::string& path) {
  Model& m = const_cast<Model&>(model);
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  for (const auto& p : model.registry().all())
    w.add_f32(hf_tensor_name(architecture, p.name), p.shape, m.params() + p.offset);
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
