#include "model/hf_weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
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
  const std::string text = read_text_file(index.string(), "weight index");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
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

// Where each hybridlm parameter lives in Qwen3Next's tensors (G layers only), used by export (gather) and import
// (scatter). Its Gated DeltaNet fuses the projections per key head: in_proj_qkvz rows are, for each head h,
// q_h | k_h | v_h | z_h (K rows each; z is hybridlm's gate g_proj), in_proj_ba rows b_h | a_h; conv1d is the q, k
// and v convs stacked; o_norm is `norm`, o_proj `out_proj`. Its block and final norms are zero-centred (it
// multiplies by 1 + w), so they are stored as w - 1.
struct Piece {
  std::string hf;          // the Qwen3Next tensor
  i64 hf_at, at, count;    // `count` floats at hf_at in it <-> at `at` in the parameter
};
struct Qwen3NextPlace {
  std::vector<Piece> pieces;
  bool zero_centred = false;
};

Qwen3NextPlace qwen3next_place(const ParamRegistry& reg, const ParamInfo& p) {
  const i64 n = p.shape.numel();
  const size_t at = p.name.find(".linear_attn.");
  if (at == std::string::npos) {
    const bool norm = ends_with(p.name, "layernorm.weight") || p.name == "model.norm.weight";
    return {{{p.name, 0, 0, n}}, norm};
  }
  const std::string pre = p.name.substr(0, at + std::strlen(".linear_attn.")), part = p.name.substr(pre.size());
  const i64 H = reg.info(reg.find(pre + "a_proj.weight")).shape[0];
  const Shape& qs = reg.info(reg.find(pre + "q_proj.weight")).shape;
  const i64 D = qs[1], K = qs[0] / H;
  const std::vector<std::string> qkvz = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "g_proj.weight"},
                                 ba = {"b_proj.weight", "a_proj.weight"},
                                 conv = {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"};
  Qwen3NextPlace place;
  if (auto j = std::find(qkvz.begin(), qkvz.end(), part); j != qkvz.end()) {
    for (i64 h = 0; h < H; ++h)
      place.pieces.push_back({pre + "in_proj_qkvz.weight", (h * 4 + (j - qkvz.begin())) * K * D, h * K * D, K * D});
  } else if (auto b = std::find(ba.begin(), ba.end(), part); b != ba.end()) {
    for (i64 h = 0; h < H; ++h) place.pieces.push_back({pre + "in_proj_ba.weight", (h * 2 + (b - ba.begin())) * D, h * D, D});
  } else if (auto c = std::find(conv.begin(), conv.end(), part); c != conv.end()) {
    place.pieces.push_back({pre + "conv1d.weight", (c - conv.begin()) * n, 0, n});
  } else {
    const std::string hf = part == "o_norm.weight" ? "norm.weight" : part == "o_proj.weight" ? "out_proj.weight" : part;
    place.pieces.push_back({pre + hf, 0, 0, n});
  }
  return place;
}

// The shapes of Qwen3Next's tensors, in the order export writes them.
std::vector<std::pair<std::string, Shape>> qwen3next_shapes(const ParamRegistry& reg) {
  std::vector<std::pair<std::string, Shape>> out;
  std::set<std::string> seen;
  for (const ParamInfo& p : reg.all()) {
    const size_t at = p.name.find(".linear_attn.");
    if (at == std::string::npos) {
      out.emplace_back(p.name, p.shape);
      continue;
    }
    const std::string pre = p.name.substr(0, at + std::strlen(".linear_attn."));
    if (!seen.insert(pre).second) continue;
    const i64 H = reg.info(reg.find(pre + "a_proj.weight")).shape[0];
    const Shape& qs = reg.info(reg.find(pre + "q_proj.weight")).shape;
    const Shape& cs = reg.info(reg.find(pre + "q_conv1d.weight")).shape;
    out.emplace_back(pre + "in_proj_qkvz.weight", Shape{4 * qs[0], qs[1]});
    out.emplace_back(pre + "in_proj_ba.weight", Shape{2 * H, qs[1]});
    out.emplace_back(pre + "conv1d.weight", Shape{3 * cs[0], cs[1], cs[2]});
    for (const char* part : {"A_log", "dt_bias", "o_norm.weight", "o_proj.weight"}) {
      const ParamInfo& q = reg.info(reg.find(pre + part));
      out.emplace_back(qwen3next_place(reg, q).pieces[0].hf, q.shape);
    }
  }
  return out;
}

void write_qwen3next(const Model& m, const std::string& path) {
  const ParamRegistry& reg = m.registry();
  std::map<std::string, std::vector<float>> bufs;
  const auto shapes = qwen3next_shapes(reg);
  for (const auto& [name, shape] : shapes) bufs[name].assign(static_cast<size_t>(shape.numel()), 0.0f);
  for (const ParamInfo& p : reg.all()) {
    const Qwen3NextPlace place = qwen3next_place(reg, p);
    const float* src = m.params() + p.offset;
    for (const Piece& c : place.pieces)
      for (i64 i = 0; i < c.count; ++i) bufs.at(c.hf)[static_cast<size_t>(c.hf_at + i)] = src[c.at + i] - (place.zero_centred ? 1.0f : 0.0f);
  }
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  for (const auto& [name, shape] : shapes) w.add_f32(name, shape, bufs.at(name).data());
  w.write(path);
}

// Reads every tensor of a folder's weight files as fp32, checking the names are unique.
std::map<std::string, std::pair<Shape, std::vector<float>>> read_all_f32(const std::string& hf_dir) {
  std::map<std::string, std::pair<Shape, std::vector<float>>> out;
  for (const std::string& path : weight_files(hf_dir)) {
    SafeTensorsFile f = SafeTensorsFile::read(path);
    for (const SafeTensor& t : f.tensors()) {
      if (is_rotary_buffer(t.name)) continue;
      std::vector<float> v(static_cast<size_t>(t.numel()));
      copy_as_f32(t, v.data());
      if (!out.emplace(t.name, std::pair{t.shape, std::move(v)}).second) fail("{}: tensor '{}' appears twice", path, t.name);
    }
  }
  return out;
}

void load_qwen3next(const std::string& hf_dir, Model& m, bool tied_embeddings) {
  const ParamRegistry& reg = m.registry();
  auto tensors = read_all_f32(hf_dir);
  if (tied_embeddings && !tensors.count("lm_head.weight") && tensors.count("model.embed_tokens.weight"))
    tensors["lm_head.weight"] = tensors.at("model.embed_tokens.weight");
  const auto shapes = qwen3next_shapes(reg);
  std::set<std::string> expected;
  for (const auto& [name, shape] : shapes) {
    expected.insert(name);
    auto it = tensors.find(name);
    if (it == tensors.end()) fail("{}: tensor '{}' is missing from the weight files", hf_dir, name);
    if (it->second.first != shape)
      fail("{}: tensor '{}' has shape {}, the config implies {}", hf_dir, name, it->second.first.str(), shape.str());
  }
  for (const auto& [name, t] : tensors)
    if (!expected.count(name))
      fail("{}: tensor '{}' has no place in the imported model", hf_dir, name);
  for (const ParamInfo& p : reg.all()) {
    const Qwen3NextPlace place = qwen3next_place(reg, p);
    float* dst = m.params() + p.offset;
    for (const Piece& c : place.pieces) {
      const std::vector<float>& src = tensors.at(c.hf).second;
      for (i64 i = 0; i < c.count; ++i) dst[c.at + i] = src[static_cast<size_t>(c.hf_at + i)] + (place.zero_centred ? 1.0f : 0.0f);
    }
  }
}

// Gemma 3's RMSNorms (block, QK and final) multiply by 1 + w: its files hold hybridlm's norm weights minus 1, as
// Qwen3Next's block norms (llama.cpp's GGUF files hold them with the 1 added, as hybridlm does).
bool zero_centred(const std::string& architecture, const std::string& name) {
  return architecture == "Gemma3ForCausalLM" && ends_with(name, "norm.weight");
}

}  // namespace

void write_hf_weights(const Model& model, const std::string& architecture, const std::string& path) {
  if (architecture == "Qwen3NextForCausalLM") return write_qwen3next(model, path);
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  for (const auto& p : model.registry().all()) {
    const float* src = model.params() + p.offset;
    if (!zero_centred(architecture, p.name)) {
      w.add_f32(hf_tensor_name(architecture, p.name), p.shape, src);
      continue;
    }
    std::vector<float> shifted(src, src + p.shape.numel());
    for (float& x : shifted) x -= 1.0f;
    w.add_f32(hf_tensor_name(architecture, p.name), p.shape, shifted.data());
  }
  w.write(path);
}

void fill_tied_head(Model& model, std::vector<bool>& loaded) {
  const ParamRegistry& reg = model.registry();
  const int head = reg.find("lm_head.weight"), embed = reg.find("model.embed_tokens.weight");
  if (head < 0 || embed < 0 || loaded[static_cast<size_t>(head)] || !loaded[static_cast<size_t>(embed)]) return;
  const ParamInfo &h = reg.info(head), &e = reg.info(embed);
  std::copy(model.params() + e.offset, model.params() + e.offset + e.shape.numel(), model.params() + h.offset);
  loaded[static_cast<size_t>(head)] = true;
}

void load_hf_weights(const std::string& hf_dir, const std::string& architecture, Model& model, bool tied_embeddings) {
  if (architecture == "Qwen3NextForCausalLM") return load_qwen3next(hf_dir, model, tied_embeddings);
  const ParamRegistry& reg = model.registry();
  std::vector<bool> loaded(reg.all().size(), false);
  std::map<std::string, int> index;  // the architecture's tensor name -> registry index
  for (size_t i = 0; i < reg.all().size(); ++i) index[hf_tensor_name(architecture, reg.all()[i].name)] = static_cast<int>(i);
  const int head = reg.find("lm_head.weight"), embed = reg.find("model.embed_tokens.weight");
  // A model that ties its head has no lm_head.weight; a file may still hold one, which must then be the embedding.
  std::vector<float> file_head;
  std::string file_head_path;
  for (const std::string& path : weight_files(hf_dir)) {
    SafeTensorsFile f = SafeTensorsFile::read(path);
    for (const SafeTensor& t : f.tensors()) {
      const auto it = index.find(t.name);
      if (it == index.end()) {
        if (is_rotary_buffer(t.name)) continue;
        if (t.name == "lm_head.weight" && head < 0) {
          t.expect_shape(reg.info(embed).shape);
          file_head.resize(static_cast<size_t>(t.numel()));
          copy_as_f32(t, file_head.data());
          file_head_path = path;
          continue;
        }
        fail("{}: tensor '{}' has no place in the imported model", path, t.name);
      }
      const ParamInfo& p = reg.info(it->second);
      t.expect_shape(p.shape);
      float* dst = model.params() + p.offset;
      copy_as_f32(t, dst);
      if (zero_centred(architecture, p.name))
        for (i64 i = 0; i < p.shape.numel(); ++i) dst[i] += 1.0f;
      loaded[static_cast<size_t>(it->second)] = true;
    }
  }
  if (!file_head.empty() && loaded[static_cast<size_t>(embed)] &&
      !std::equal(file_head.begin(), file_head.end(), model.params() + reg.info(embed).offset))
    fail("{}: tensor 'lm_head.weight' differs from model.embed_tokens.weight, but the model ties them "
         "(tie_word_embeddings)", file_head_path);
  if (tied_embeddings) fill_tied_head(model, loaded);
  for (size_t i = 0; i < loaded.size(); ++i)
    if (!loaded[i])
      fail("{}: tensor '{}' is missing from the weight files", hf_dir,
           hf_tensor_name(architecture, reg.info(static_cast<int>(i)).name));
}

}  // namespace hlm
