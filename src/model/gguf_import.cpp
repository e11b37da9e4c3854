#include "model/gguf_import.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "model/hf_weights.h"

namespace hlm {

namespace {

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

// The `<arch>.` keys each architecture's import reads; any other key of that prefix changes the function
// (soft-capping, RoPE scaling, experts, ...) or is unknown, and is refused by name.
const std::map<std::string, std::set<std::string>> kArchKeys = {
    {"gemma3",
     {"context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
      "attention.head_count_kv", "attention.key_length", "attention.value_length", "attention.layer_norm_rms_epsilon",
      "rope.freq_base", "rope.freq_base_swa", "attention.sliding_window", "attention.sliding_window_pattern"}},
    {"qwen3",
     {"context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
      "attention.head_count_kv", "attention.key_length", "attention.value_length", "attention.layer_norm_rms_epsilon",
      "rope.freq_base"}},
};

// A GGUF tensor's name -> the Hugging Face name llama.cpp's converter made it from (per architecture).
std::string hf_name_of(const std::string& arch, const std::string& gguf) {
  static const std::map<std::string, std::string> top = {{"token_embd.weight", "model.embed_tokens.weight"},
                                                         {"output_norm.weight", "model.norm.weight"},
                                                         {"output.weight", "lm_head.weight"}};
  if (auto it = top.find(gguf); it != top.end()) return it->second;
  if (!starts_with(gguf, "blk.")) return "";
  const size_t dot = gguf.find('.', 4);
  if (dot == std::string::npos) return "";
  const std::string layer = gguf.substr(4, dot - 4), part = gguf.substr(dot + 1);
  if (layer.empty() || !std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return "";
  std::map<std::string, std::string> parts = {
      {"attn_norm.weight", "input_layernorm.weight"},   {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},     {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"}, {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"}, {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},           {"ffn_down.weight", "mlp.down_proj.weight"}};
  if (arch == "gemma3") {  // Gemma's sandwich: post-attention, pre- and post-feed-forward norms
    parts["post_attention_norm.weight"] = "post_attention_layernorm.weight";
    parts["ffn_norm.weight"] = "pre_feedforward_layernorm.weight";
    parts["post_ffw_norm.weight"] = "post_feedforward_layernorm.weight";
  } else {
    parts["ffn_norm.weight"] = "post_attention_layernorm.weight";
  }
  auto it = parts.find(part);
  return it == parts.end() ? "" : "model.layers." + layer + "." + it->second;
}

// The layers' kinds of a gemma3 file, as llama.cpp reads them: `attention.sliding_window_pattern` as one bool
// per layer, or as a period n (layer l slides unless l % n == n - 1; 6 when absent), all full without a window.
nlohmann::json gemma3_layer_types(const GgufFile& f, i64 n_layers, bool has_window) {
  nlohmann::json types = nlohmann::json::array();
  const std::string key = "gemma3.attention.sliding_window_pattern";
  std::vector<bool> sliding(static_cast<size_t>(n_layers), false);
  if (has_window) {
    const GgufValue* v = f.find(key);
    if (v && v->type == GgufValueType::ARRAY) {
      const std::vector<std::int64_t> flags = f.get_int_array(key);
      if (static_cast<i64>(flags.size()) != n_layers)
        fail("{}: key '{}' holds {} layers, the model has {}", f.path(), key, flags.size(), n_layers);
      for (i64 l = 0; l < n_layers; ++l) sliding[static_cast<size_t>(l)] = flags[static_cast<size_t>(l)] != 0;
    } else {
      const std::int64_t n = v ? f.get_int(key) : 6;
      if (n < 0 || n > n_layers + 1) fail("{}: key '{}' = {} is not a layer period", f.path(), key, n);
      for (i64 l = 0; l < n_layers; ++l) sliding[static_cast<size_t>(l)] = n == 0 || l % n < n - 1;
    }
  }
  for (bool s : sliding) types.push_back(s ? "sliding_attention" : "full_attention");
  return types;
}

// A FLOAT32 value as the config it was converted from wrote it: the shortest decimal that rounds to the float
// (1e-06, not 9.999999974752427e-07).
double as_written(double f32_value) { return std::stod(fmt::format("{}", static_cast<float>(f32_value))); }

}  // namespace

GgufImport gguf_import_config(const GgufFile& f) {
  GgufImport imp;
  const std::string arch = f.get_string("general.architecture");
  imp.gguf_architecture = arch;
  const auto known = kArchKeys.find(arch);
  if (known == kArchKeys.end()) {
    std::string names;
    for (const auto& [a, keys] : kArchKeys) names += (names.empty() ? "" : ", ") + a;
    fail("{}: key 'general.architecture' = '{}' is not an architecture hybridlm imports from GGUF ({})", f.path(),
         arch, names);
  }
  const std::string pre = arch + ".";
  for (const auto& kv : f.metadata()) {
    if (starts_with(kv.key, pre) && !known->second.count(kv.key.substr(pre.size())))
      fail("{}: key '{}' is not read by hybridlm's {} import (it would change what the model computes, or is "
           "unknown); refusing rather than ignoring it", f.path(), kv.key, arch);
    if (!starts_with(kv.key, pre) && !starts_with(kv.key, "general.") && !starts_with(kv.key, "tokenizer.") &&
        !starts_with(kv.key, "quantize."))
      fail("{}: key '{}' belongs to no part hybridlm reads (general, tokenizer, quantize, {})", f.path(), kv.key,
           arch);
  }
  for (const GgufTensor& t : f.tensors()) {
    if (hf_name_of(arch, t.name).empty())
      fail("{}: tensor '{}' has no place in a {} model", f.path(), t.name, arch);
    if (!ggml_type_info(t.type).dequantizable)
      fail("{}: tensor '{}' has type {}, which hybridlm does not dequantize ({})", f.path(), t.name, t.type_name(),
           ggml_dequantizable_type_names());
  }
  auto i = [&](const std::string& k) { return f.get_int(pre + k); };
  const GgufTensor& embed = f.tensor("token_embd.weight");
  if (embed.dims.size() != 2) fail("{}: tensor 'token_embd.weight' must be a matrix", f.path());
  const i64 n_layers = i("block_count"), head_dim = i("attention.key_length");
  if (f.has(pre + "attention.value_length") && i("attention.value_length") != head_dim)
    fail("{}: key '{}attention.value_length' = {} differs from key_length {}; hybridlm's heads have one size",
         f.path(), pre, i("attention.value_length"), head_dim);
  nlohmann::json hf = {{"vocab_size", embed.dims[1]},
                       {"hidden_size", i("embedding_length")},
                       {"intermediate_size", i("feed_forward_length")},
                       {"num_hidden_layers", n_layers},
                       {"num_attention_heads", i("attention.head_count")},
                       {"num_key_value_heads", i("attention.head_count_kv")},
                       {"head_dim", head_dim},
                       {"rms_norm_eps", as_written(f.get_float(pre + "attention.layer_norm_rms_epsilon"))},
                       {"max_position_embeddings", i("context_length")},
                       {"rope_theta", as_written(f.get_float(pre + "rope.freq_base"))},
                       {"tie_word_embeddings", !f.has_tensor("output.weight")}};
  if (arch == "gemma3") {
    const bool has_window = f.has(pre + "attention.sliding_window") && i("attention.sliding_window") > 0;
    hf["architectures"] = {"Gemma3ForCausalLM"};
    hf["model_type"] = "gemma3_text";
    hf["hidden_activation"] = "gelu_pytorch_tanh";
    // llama.cpp's local base when the file names none, and its query scale: 1/sqrt(head_dim), except for the
    // 62-layer (27B) model, which scales by 1/sqrt(d_model / heads).
    hf["rope_local_base_freq"] =
        f.has(pre + "rope.freq_base_swa") ? as_written(f.get_float(pre + "rope.freq_base_swa")) : 10000.0;
    hf["query_pre_attn_scalar"] = n_layers == 62 ? i("embedding_length") / i("attention.head_count") : head_dim;
    hf["sliding_window"] = has_window ? nlohmann::json(i("attention.sliding_window")) : nlohmann::json(nullptr);
    hf["layer_types"] = gemma3_layer_types(f, n_layers, has_window);
    hf["final_logit_softcapping"] = nullptr;
    hf["attn_logit_softcapping"] = nullptr;
  } else {  // qwen3: full attention with QK-norm on every layer
    hf["architectures"] = {"Qwen3ForCausalLM"};
    hf["model_type"] = "qwen3";
    hf["hidden_act"] = "silu";
    hf["use_sliding_window"] = false;
    hf["attention_bias"] = false;
  }
  imp.hf_config = hf;
  imp.hf = hf_import_config(hf, f.path() + " (its metadata read as a Hugging Face config)");
  return imp;
}

void load_gguf_weights(const GgufFile& f, const GgufImport& imp, Model& model) {
  const ParamRegistry& reg = model.registry();
  std::map<std::string, int> index;  // the Hugging Face name -> registry index
  for (size_t k = 0; k < reg.all().size(); ++k)
    index[hf_tensor_name(imp.hf.architecture, reg.all()[k].name)] = static_cast<int>(k);
  std::vector<bool> loaded(reg.all().size(), false);
  for (const GgufTensor& t : f.tensors()) {
    const std::string hf = hf_name_of(imp.gguf_architecture, t.name);
    const auto it = index.find(hf);
    if (it == index.end()) fail("{}: tensor '{}' ({}) has no place in the imported model", f.path(), t.name, hf);
    const ParamInfo& p = reg.info(it->second);
    if (t.row_major_shape() != p.shape)
      fail("{}: tensor '{}' has shape {} (row-major), the metadata implies {}", f.path(), t.name,
           t.row_major_shape().str(), p.shape.str());
    // Norm weights are stored as the factor they multiply by (the converter adds Gemma's 1 to its w), which is
    // how hybridlm holds them too: copied as they are.
    const std::vector<float> v = dequantize(t);
    for (float x : v)
      if (!std::isfinite(x)) fail("{}: tensor '{}' holds a non-finite value", f.path(), t.name);
    std::copy(v.begin(), v.end(), model.params() + p.offset);
    loaded[static_cast<size_t>(it->second)] = true;
  }
  if (imp.hf.tied_embeddings) fill_tied_head(model, loaded);  // a tied file has no output.weight
  for (size_t k = 0; k < loaded.size(); ++k)
    if (!loaded[k])
      fail("{}: no tensor for parameter '{}' (the metadata implies it)", f.path(),
           hf_tensor_name(imp.hf.architecture, reg.info(static_cast<int>(k)).name));
}

}  // namespace hlm
