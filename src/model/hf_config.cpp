#include "model/hf_config.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "mixers/gdn.h"
#include "mixers/mamba2.h"

namespace hlm {

namespace {

// hybridlm's per-head QK RMSNorm and Mamba-2 output norm have fixed eps (mixers/attention.h, mixers/mamba2.h);
// Qwen3 and Bamba use rms_norm_eps for them.
constexpr double kQkNormEps = 1e-6;
constexpr float kMambaNormEps = Mamba2Mixer::kNormEps;  // compared in fp32, as both frameworks add it
constexpr i64 kMambaConv = Mamba2Mixer::kConv;

// Why a layer letter has no transformers architecture that computes the same block (docs/hf.md).
std::string refusal(char letter, const std::string& layers) {
  const bool has_attention = layers.find_first_of("FS") != std::string::npos;
  switch (letter) {
    case 'L':
      return "layer type L (Lightning): MiniMax, the transformers architecture with Lightning layers, adds the "
             "mixer output to the normed stream (x = a*norm(x) + b*attn(norm(x))) where hybridlm adds it to x, "
             "and needs a mixture-of-experts MLP where hybridlm has a dense SwiGLU";
    case 'G':
      return has_attention
                 ? "layer type G (Gated DeltaNet): Qwen3Next, the transformers architecture with Gated DeltaNet and "
                   "attention layers, gates the output of its full-attention layers (q_proj yields a query and a "
                   "sigmoid gate) and always applies QK-norm; hybridlm's F and S layers have no output gate"
                 : "layer type G (Gated DeltaNet)";
    default:
      return fmt::format("layer type {}: no transformers architecture", letter);
  }
}

json token_id(int id) { return id >= 0 ? json(id) : json(nullptr); }

// Keys every exported config.json carries.
json common_keys(const ModelConfig& c, const LayerTypeOptions& a, const HfSpecialTokens& special) {
  for (auto [name, id] : {std::pair{"bos", special.bos}, {"eos", special.eos}})
    if (id >= c.vocab_size)
      fail("export --format hf: the tokenizer's {} id {} is outside the model's vocabulary ({})", name, id,
           c.vocab_size);
  return {{"vocab_size", c.vocab_size},
          {"hidden_size", c.d_model},
          {"intermediate_size", c.d_ff},
          {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", a.n_heads},
          {"num_key_value_heads", a.n_kv_heads},
          {"head_dim", a.head_dim},
          {"hidden_act", "silu"},
          {"max_position_embeddings", c.max_seq_len},
          {"rms_norm_eps", c.norm_eps},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"tie_word_embeddings", c.tie_embeddings},
          {"bos_token_id", token_id(special.bos)},
          {"eos_token_id", token_id(special.eos)},
          {"pad_token_id", nullptr},
          {"initializer_range", 0.02},
          {"use_cache", true},
          {"dtype", "float32"}};
}

// F and S layers only: SmolLM3 (RoPE or NoPE per layer, no QK-norm) or Qwen3 (QK-norm, RoPE everywhere).
HfExport export_attention(const ModelConfig& c, const std::string& layers, const HfSpecialTokens& special) {
  const bool has_f = layers.find('F') != std::string::npos, has_s = layers.find('S') != std::string::npos;
  const LayerTypeOptions& a = c.type(has_f ? 'F' : 'S');
  if (has_f && has_s) {
    const LayerTypeOptions& s = c.type('S');
    for (auto [key, fv, sv] : {std::tuple{"n_heads", a.n_heads, s.n_heads}, {"n_kv_heads", a.n_kv_heads, s.n_kv_heads},
                               {"head_dim", a.head_dim, s.head_dim}})
      if (fv != sv)
        fail("export --format hf: layer_types.S.{} ({}) differs from layer_types.F.{} ({}); transformers' "
             "SmolLM3 and Qwen3 use one head layout for every layer",
             key, sv, key, fv);
    if (a.qk_norm != s.qk_norm)
      fail("export --format hf: QK-norm is on for {} layers only; Qwen3 applies it on every layer and SmolLM3 on "
           "none",
           a.qk_norm ? "F" : "S");
  }
  std::vector<int> rope_flags;
  json layer_types = json::array();
  bool any_nope = false;
  for (char ch : layers) {
    const bool rope = c.type(ch).rope;
    any_nope |= !rope;
    rope_flags.push_back(rope ? 1 : 0);
    layer_types.push_back(ch == 'S' ? "sliding_attention" : "full_attention");
  }
  if (a.qk_norm && any_nope)
    fail("export --format hf: QK-norm together with NoPE layers: Qwen3 (the architecture with per-head QK-norm "
         "and sliding/full layers) applies RoPE on every layer, SmolLM3 has no QK-norm");
  if (a.qk_norm && c.norm_eps != kQkNormEps)
    fail("export --format hf: norm_eps {} with QK-norm: Qwen3's q_norm/k_norm use rms_norm_eps, hybridlm's use {}",
         c.norm_eps, kQkNormEps);
  const std::string arch = a.qk_norm ? "Qwen3ForCausalLM" : "SmolLM3ForCausalLM";
  json j = common_keys(c, a, special);
  j["architectures"] = {arch};
  j["model_type"] = a.qk_norm ? "qwen3" : "smollm3";
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  j["layer_types"] = layer_types;
  j["use_sliding_window"] = has_s;
  j["sliding_window"] = has_s ? json(c.type('S').window) : json(nullptr);
  if (a.qk_norm)
    j["max_window_layers"] = c.n_layers;  // unused: layer_types is explicit
  else
    j["no_rope_layers"] = rope_flags;
  return {arch, j};
}

// M and F layers: Bamba (Mamba-2 blocks and RoPE attention blocks, the same pre-norm SwiGLU block around both).
HfExport export_bamba(const ModelConfig& c, const std::string& layers, const HfSpecialTokens& special) {
  const bool has_f = layers.find('F') != std::string::npos;
  const LayerTypeOptions& m = c.type('M');
  const LayerTypeOptions a = has_f ? c.type('F') : LayerTypeOptions{true, 0, c.n_heads, c.n_kv_heads, c.head_dim};
  if (!a.rope) fail("export --format hf: F layers with NoPE next to M layers: Bamba applies RoPE on every attention layer");
  if (a.qk_norm) fail("export --format hf: QK-norm next to M layers: Bamba's attention has no QK-norm");
  if (static_cast<float>(c.norm_eps) != kMambaNormEps)
    fail("export --format hf: norm_eps {} next to M layers: Bamba's Mamba-2 output norm uses rms_norm_eps, "
         "hybridlm's uses {} (set norm_eps={} to export)",
         c.norm_eps, kMambaNormEps, kMambaNormEps);
  json attn = json::array();
  for (size_t l = 0; l < layers.size(); ++l)
    if (layers[l] == 'F') attn.push_back(l);
  const i64 inner = c.mamba_expand * c.d_model;
  json j = common_keys(c, a, special);
  j["architectures"] = {"BambaForCausalLM"};
  j["model_type"] = "bamba";
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}, {"partial_rotary_factor", 1.0}};
  j["attn_layer_indices"] = attn;
  j["mamba_n_heads"] = inner / m.head_dim;
  j["mamba_d_head"] = m.head_dim;
  j["mamba_n_groups"] = 1;
  j["mamba_d_state"] = c.mamba_d_state;
  j["mamba_d_conv"] = kMambaConv;
  j["mamba_expand"] = c.mamba_expand;
  j["mamba_chunk_size"] = c.chunk_size;
  j["mamba_conv_bias"] = true;
  j["mamba_proj_bias"] = false;
  j["z_loss_coefficient"] = 0.0;
  return {"BambaForCausalLM", j};
}

// G layers only: Qwen3Next with every layer `linear_attention` and a dense MLP (no experts). Its Gated DeltaNet
// is hybridlm's with the projections fused per key head (hf_weights.cpp) and zero-centred block norms (1 + w).
HfExport export_qwen3next(const ModelConfig& c, const HfSpecialTokens& special) {
  const LayerTypeOptions& g = c.type('G');
  if (static_cast<float>(c.norm_eps) != GatedDeltaNetMixer::kNormEps)
    fail("export --format hf: norm_eps {} with G layers: Qwen3Next's Gated DeltaNet output norm uses rms_norm_eps, "
         "hybridlm's uses {} (set norm_eps={} to export)",
         c.norm_eps, GatedDeltaNetMixer::kNormEps, GatedDeltaNetMixer::kNormEps);
  json j = common_keys(c, g, special);
  j["architectures"] = {"Qwen3NextForCausalLM"};
  j["model_type"] = "qwen3_next";
  j["num_attention_heads"] = g.n_heads;  // unused (no attention layers), but checked by the config
  j["num_key_value_heads"] = g.n_heads;
  j["layer_types"] = std::vector<std::string>(static_cast<size_t>(c.n_layers), "linear_attention");
  j["linear_conv_kernel_dim"] = GatedDeltaNetMixer::kConv;
  j["linear_key_head_dim"] = g.head_dim;
  j["linear_value_head_dim"] = g.head_dim;
  j["linear_num_key_heads"] = g.n_heads;
  j["linear_num_value_heads"] = g.n_heads;
  j["num_experts"] = 0;  // every MLP dense
  j["mlp_only_layers"] = json::array();
  for (i64 l = 0; l < c.n_layers; ++l) j["mlp_only_layers"].push_back(l);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}, {"partial_rotary_factor", 1.0}};
  // transformers 5.24's cache asks an attention layer for the sequence length, and this model has none.
  j["use_cache"] = false;
  return {"Qwen3NextForCausalLM", j};
}

// The block options only Gemma 3 has among the architectures hybridlm maps to (docs/hf.md).
bool uses_gemma_block(const ModelConfig& c) {
  return c.sandwich_norm || c.scale_embeddings || c.mlp_activation != MlpActivation::swiglu;
}

// query_pre_attn_scalar as Gemma 3's config holds it: an integer (0: head_dim, hybridlm's default scale).
i64 gemma_query_scalar(const LayerTypeOptions& t) {
  const double q = t.query_pre_attn_scalar > 0 ? t.query_pre_attn_scalar : static_cast<double>(t.head_dim);
  if (q != std::floor(q) || q > 1e9)
    fail("export --format hf: query_pre_attn_scalar {} is not an integer; Gemma 3's config holds an integer", q);
  return static_cast<i64>(q);
}

// F and S layers with Gemma 3's block: Gemma3ForCausalLM (text-only, model_type gemma3_text). Its RMSNorms multiply
// by 1 + w, so the weights file holds every norm weight minus 1 (hf_weights.cpp).
HfExport export_gemma3(const ModelConfig& c, const std::string& layers, const HfSpecialTokens& special) {
  for (char ch : layers)
    if (ch != 'F' && ch != 'S')
      fail("export --format hf: layer type {} with Gemma 3's block options (sandwich_norm, scale_embeddings, "
           "mlp_activation): Gemma 3 has attention layers only", ch);
  if (!c.sandwich_norm || !c.scale_embeddings || c.mlp_activation != MlpActivation::geglu_tanh)
    fail("export --format hf: sandwich_norm = {}, scale_embeddings = {}, mlp_activation = {}: Gemma3ForCausalLM, the "
         "transformers architecture with any of them, has all three (true, true, geglu_tanh)",
         c.sandwich_norm, c.scale_embeddings, c.mlp_activation == MlpActivation::geglu_tanh ? "geglu_tanh" : "swiglu");
  const bool has_f = layers.find('F') != std::string::npos, has_s = layers.find('S') != std::string::npos;
  const LayerTypeOptions& a = c.type(has_f ? 'F' : 'S');
  const LayerTypeOptions& sl = c.type(has_s ? 'S' : 'F');
  for (char ch : {'F', 'S'}) {
    if (layers.find(ch) == std::string::npos) continue;
    const LayerTypeOptions& t = c.type(ch);
    if (!t.qk_norm)
      fail("export --format hf: layer_types.{}.qk_norm is off; Gemma 3 applies QK-norm on every layer", ch);
    if (!t.rope) fail("export --format hf: layer_types.{}.rope is off; Gemma 3 applies RoPE on every layer", ch);
  }
  for (auto [key, fv, sv] : {std::tuple{"n_heads", a.n_heads, sl.n_heads}, {"n_kv_heads", a.n_kv_heads, sl.n_kv_heads},
                             {"head_dim", a.head_dim, sl.head_dim}})
    if (fv != sv)
      fail("export --format hf: layer_types.S.{} ({}) differs from layer_types.F.{} ({}); Gemma 3 uses one head "
           "layout for every layer", key, sv, key, fv);
  if (c.d_model % a.n_heads != 0)
    fail("export --format hf: d_model {} is not a multiple of n_heads {}; transformers' Gemma 3 config requires it",
         c.d_model, a.n_heads);
  if (gemma_query_scalar(a) != gemma_query_scalar(sl))
    fail("export --format hf: query_pre_attn_scalar differs between F and S layers; Gemma 3 has one");
  if (c.norm_eps != kQkNormEps)
    fail("export --format hf: norm_eps {}: Gemma 3's q_norm/k_norm use rms_norm_eps, hybridlm's QK-norm uses {}",
         c.norm_eps, kQkNormEps);
  json layer_types = json::array();
  for (char ch : layers) layer_types.push_back(ch == 'S' ? "sliding_attention" : "full_attention");
  json j = common_keys(c, a, special);
  j.erase("hidden_act");  // Gemma 3 names it hidden_activation
  j.erase("mlp_bias");
  j["architectures"] = {"Gemma3ForCausalLM"};
  j["model_type"] = "gemma3_text";
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["query_pre_attn_scalar"] = gemma_query_scalar(a);
  j["sliding_window"] = has_s ? c.type('S').window : c.window;
  j["layer_types"] = layer_types;
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", a.rope_theta}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", sl.rope_theta}}}};
  j["final_logit_softcapping"] = nullptr;
  j["attn_logit_softcapping"] = nullptr;
  j["use_bidirectional_attention"] = false;
  return {"Gemma3ForCausalLM", j};
}

}  // namespace

HfExport hf_export_config(const ModelConfig& c, const HfSpecialTokens& special) {
  const std::string layers = c.layer_pattern();
  if (uses_gemma_block(c)) return export_gemma3(c, layers, special);
  if (layers.find_first_not_of('G') == std::string::npos) return export_qwen3next(c, special);
  for (char ch : layers)
    if (ch == 'L' || ch == 'G') fail("export --format hf: {}", refusal(ch, layers));
  const bool has_m = layers.find('M') != std::string::npos;
  if (!has_m) return export_attention(c, layers, special);
  if (layers.find('S') != std::string::npos)
    fail("export --format hf: S layers next to M layers: Bamba, the transformers architecture with Mamba-2 and "
         "attention layers, has no sliding-window attention");
  return export_bamba(c, layers, special);
}

std::string hf_tensor_name(const std::string& architecture, const std::string& name) {
  if (architecture != "BambaForCausalLM") return name;
  if (name == "model.norm.weight") return "model.final_layernorm.weight";
  std::string n = name;
  for (auto [from, to] : {std::pair{".mixer.", ".mamba."}, {".mlp.", ".feed_forward."},
                          {".post_attention_layernorm.", ".pre_ff_layernorm."}}) {
    const size_t at = n.find(from);
    if (at != std::string::npos) n.replace(at, std::strlen(from), to);
  }
  return n;
}

namespace {

// Keys import reads or knows to leave the computed function unchanged (ids, dtype, init, dropout, cache).
const std::set<std::string> kKnownKeys = {
    "architectures", "model_type", "initializer_range", "use_cache", "bos_token_id", "eos_token_id",
    "pad_token_id", "dtype", "torch_dtype", "transformers_version", "_name_or_path", "attention_dropout",
    "pretraining_tp", "output_attentions", "output_hidden_states", "return_dict", "tie_word_embeddings",
    "rope_parameters", "rope_theta", "rope_scaling", "head_dim", "num_key_value_heads", "attention_bias", "mlp_bias",
    "hidden_act", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "max_position_embeddings", "rms_norm_eps"};
const std::set<std::string> kAttentionKeys = {"max_window_layers", "no_rope_layer_interval", "use_sliding_window",
                                              "sliding_window", "layer_types", "no_rope_layers"};
const std::set<std::string> kBambaKeys = {
    "attn_layer_indices", "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv",
    "mamba_expand", "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias", "time_step_limit",
    "z_loss_coefficient", "num_logits_to_keep", "layer_types"};
const std::set<std::string> kGemma3Keys = {
    "query_pre_attn_scalar", "sliding_window", "layer_types", "sliding_window_pattern", "_sliding_window_pattern",
    "final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention", "rope_local_base_freq",
    "cache_implementation", "hidden_activation"};
const std::set<std::string> kQwen3NextKeys = {
    "layer_types", "full_attention_interval", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "decoder_sparse_step", "moe_intermediate_size",
    "shared_expert_intermediate_size", "num_experts_per_tok", "num_experts", "norm_topk_prob", "output_router_logits",
    "router_aux_loss_coef", "mlp_only_layers", "partial_rotary_factor"};

struct Reader {
  const json& j;
  const std::string& src;
  const json& at(const char* key) const {
    if (!j.contains(key)) fail("{}: missing key '{}'", src, key);
    return j.at(key);
  }
  i64 integer(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_integer() || v.get<i64>() < 1) fail("{}: key '{}' must be a positive integer, got {}", src, key, v.dump());
    return v.get<i64>();
  }
  double number(const char* key) const {
    const json& v = at(key);
    if (!v.is_number()) fail("{}: key '{}' must be a number, got {}", src, key, v.dump());
    return v.get<double>();
  }
  bool flag(const char* key, bool def) const {
    if (!j.contains(key) || j.at(key).is_null()) return def;
    if (!j.at(key).is_boolean()) fail("{}: key '{}' must be true or false, got {}", src, key, j.at(key).dump());
    return j.at(key).get<bool>();
  }
  // A key that hybridlm computes only with one value (absent or null also accepted).
  void require(const char* key, const json& want, const char* why) const {
    if (j.contains(key) && !j.at(key).is_null() && j.at(key) != want)
      fail("{}: key '{}' = {} is not supported ({})", src, key, j.at(key).dump(), why);
  }
};

void refuse_rope_scaling(const Reader& r) {
  if (r.j.contains("rope_scaling") && !r.j.at("rope_scaling").is_null())
    fail("{}: key 'rope_scaling' = {} is not supported (hybridlm computes plain RoPE)", r.src,
         r.j.at("rope_scaling").dump());
}

// The theta of one rope_parameters object (`key` names it in errors), `theta` where it has none.
double theta_of_rope_parameters(const json& p, const std::string& key, const std::string& src, double theta) {
  if (!p.is_object()) fail("{}: key '{}' must be an object", src, key);
  // The type first: a scaled RoPE is refused by its name rather than by one of its parameters.
  if (p.contains("rope_type") && p.at("rope_type") != "default")
    fail("{}: key '{}.rope_type' = {} is not supported (hybridlm computes plain RoPE)", src, key,
         p.at("rope_type").dump());
  for (auto& [k, v] : p.items()) {
    if (k == "rope_theta") {
      if (!v.is_number()) fail("{}: key '{}.rope_theta' must be a number", src, key);
      theta = v.get<double>();
    } else if (k == "rope_type") {
    } else if (k == "partial_rotary_factor") {
      if (!v.is_number() || v.get<double>() != 1.0)
        fail("{}: key '{}.partial_rotary_factor' = {} is not supported (RoPE on all head dims)", src, key, v.dump());
    } else {
      fail("{}: key '{}.{}' is not supported (hybridlm computes plain RoPE)", src, key, k);
    }
  }
  return theta;
}

double rope_theta_of(const Reader& r, double def) {
  refuse_rope_scaling(r);
  double theta = r.j.contains("rope_theta") ? r.number("rope_theta") : def;
  if (r.j.contains("rope_parameters") && !r.j.at("rope_parameters").is_null())
    theta = theta_of_rope_parameters(r.j.at("rope_parameters"), "rope_parameters", r.src, theta);
  return theta;
}

}  // namespace

namespace {

const std::map<std::string, std::string> kArchitectures = {
    {"smollm3", "SmolLM3ForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"}, {"bamba", "BambaForCausalLM"},
    {"qwen3_next", "Qwen3NextForCausalLM"}, {"gemma3_text", "Gemma3ForCausalLM"}};

// What the per-architecture readers decide: one letter per layer, RoPE per layer, the S window, and the
// options of the letters' layer types.
struct Layout {
  std::string pattern;
  std::vector<bool> rope;
  i64 window = 0;
  json types = json::object();
  json extra = json::object();  // further top-level hybridlm keys
};

// Key layer_types, where present and not null: whether each of the L layers is a sliding one.
std::optional<std::vector<bool>> sliding_layers(const Reader& r, i64 L) {
  if (!r.j.contains("layer_types") || r.j.at("layer_types").is_null()) return std::nullopt;
  const json& lt = r.j.at("layer_types");
  if (!lt.is_array() || static_cast<i64>(lt.size()) != L)
    fail("{}: key 'layer_types' must name each of the {} layers", r.src, L);
  std::vector<bool> sliding(static_cast<size_t>(L));
  for (i64 l = 0; l < L; ++l) {
    if (lt[l] != "sliding_attention" && lt[l] != "full_attention")
      fail("{}: key 'layer_types[{}]' = {} is not supported (sliding_attention or full_attention)", r.src, l,
           lt[l].dump());
    sliding[l] = lt[l] == "sliding_attention";
  }
  return sliding;
}

// SmolLM3 / Qwen3: sliding or full, RoPE or NoPE per layer (transformers' defaults where keys are absent).
Layout attention_layout(const Reader& r, const std::string& model_type, i64 L, i64 max_len, HfImport& out) {
  const json& hf = r.j;
  const std::string& src = r.src;
  const bool use_sw = r.flag("use_sliding_window", false);
  Layout lay;
  if (use_sw) lay.window = r.integer("sliding_window");
  std::vector<bool> sliding(static_cast<size_t>(L), false), rope(static_cast<size_t>(L), true);
  if (model_type == "smollm3") {
    if (hf.contains("no_rope_layers") && !hf.at("no_rope_layers").is_null()) {
      const json& nr = hf.at("no_rope_layers");
      if (!nr.is_array() || static_cast<i64>(nr.size()) < L)
        fail("{}: key 'no_rope_layers' must list 0/1 for each of the {} layers", src, L);
      for (i64 l = 0; l < L; ++l) {
        if (!nr[l].is_number_integer() || (nr[l] != 0 && nr[l] != 1))
          fail("{}: key 'no_rope_layers[{}]' must be 0 or 1, got {}", src, l, nr[l].dump());
        rope[l] = nr[l] == 1;
      }
    } else {
      const i64 every = hf.contains("no_rope_layer_interval") ? r.integer("no_rope_layer_interval") : 4;
      for (i64 l = 0; l < L; ++l) rope[l] = (l + 1) % every != 0;
    }
  }
  if (const auto named = sliding_layers(r, L)) {
    for (i64 l = 0; l < L; ++l) sliding[l] = use_sw && (*named)[l];
  } else if (use_sw) {
    const i64 first = model_type == "qwen3" && hf.contains("max_window_layers") ? r.integer("max_window_layers") : 28;
    for (i64 l = 0; l < L; ++l) sliding[l] = model_type == "smollm3" ? !rope[l] : l >= first;
  }

  // hybridlm has one rope flag per letter: F and S. Sliding layers are S; full layers are F. Where full layers
  // mix RoPE and NoPE (SmolLM3-3B) and no layer slides, the RoPE ones become S with a window of
  // max_position_embeddings, which is full attention for every length the model accepts.
  std::set<bool> full_rope, slide_rope;
  for (i64 l = 0; l < L; ++l) (sliding[l] ? slide_rope : full_rope).insert(rope[l]);
  if (slide_rope.size() > 1)
    fail("{}: sliding layers mix RoPE and NoPE (key 'no_rope_layers'); hybridlm has one rope flag for S layers", src);
  bool full_as_window = false;
  if (full_rope.size() > 1) {
    if (!slide_rope.empty())
      fail("{}: full layers mix RoPE and NoPE (key 'no_rope_layers') next to sliding layers; hybridlm has one rope "
           "flag per layer letter",
           src);
    full_as_window = true;
    lay.window = max_len;
    out.notes.push_back(fmt::format(
        "full-attention RoPE layers are S layers with window = max_position_embeddings ({}): the same function "
        "up to that length (NoPE layers are F)",
        max_len));
  }
  for (i64 l = 0; l < L; ++l) lay.pattern += sliding[l] || (full_as_window && rope[l]) ? 'S' : 'F';
  lay.rope = rope;
  for (char ch : {'F', 'S'})
    lay.types[std::string(1, ch)] = {{"qk_norm", model_type == "qwen3"}};
  return lay;
}

// Bamba: Mamba-2 layers except those in attn_layer_indices (RoPE attention).
Layout bamba_layout(const Reader& r, i64 L, i64 D) {
  const json& hf = r.j;
  const std::string& src = r.src;
  r.require("mamba_n_groups", 1, "hybridlm's Mamba-2 has one B/C group");
  r.require("mamba_d_conv", kMambaConv, "hybridlm's Mamba-2 conv is 4 wide");
  r.require("mamba_conv_bias", true, "hybridlm's Mamba-2 conv has a bias");
  r.require("mamba_proj_bias", false, "hybridlm's projections have no bias");
  r.require("z_loss_coefficient", 0.0, "a training loss term");
  if (hf.contains("time_step_limit") && !hf.at("time_step_limit").is_null()) {
    const json& t = hf.at("time_step_limit");
    const json inf = {{"__float__", "Infinity"}};
    if (!t.is_array() || t.size() != 2 || t[0] != 0.0 || t[1] != inf)
      fail("{}: key 'time_step_limit' = {} is not supported (hybridlm does not clamp dt)", src, t.dump());
  }
  if (static_cast<float>(r.number("rms_norm_eps")) != kMambaNormEps)
    fail("{}: key 'rms_norm_eps' = {} is not supported for bamba: its Mamba-2 output norm uses it, hybridlm's uses {}",
         src, r.number("rms_norm_eps"), kMambaNormEps);
  const json& rp = r.at("rope_parameters");
  if (!rp.is_object() || !rp.contains("partial_rotary_factor"))
    fail("{}: key 'rope_parameters.partial_rotary_factor' is absent: Bamba then rotates half of each head, hybridlm "
         "all of it",
         src);
  const i64 expand = r.integer("mamba_expand"), P = r.integer("mamba_d_head"), nh = r.integer("mamba_n_heads");
  if (P * nh != expand * D)
    fail("{}: keys 'mamba_n_heads' ({}) x 'mamba_d_head' ({}) must equal mamba_expand x hidden_size ({})", src, nh, P,
         expand * D);
  Layout lay;
  lay.pattern.assign(static_cast<size_t>(L), 'M');
  if (hf.contains("attn_layer_indices") && !hf.at("attn_layer_indices").is_null()) {
    for (const json& i : hf.at("attn_layer_indices")) {
      if (!i.is_number_integer() || i.get<i64>() < 0 || i.get<i64>() >= L)
        fail("{}: key 'attn_layer_indices' holds {}, not a layer index below {}", src, i.dump(), L);
      lay.pattern[i.get<size_t>()] = 'F';
    }
  }
  lay.rope.assign(static_cast<size_t>(L), true);
  lay.types = {{"F", {{"qk_norm", false}}}, {"M", {{"head_dim", P}}}};
  lay.extra = {{"mamba_d_state", r.integer("mamba_d_state")}, {"mamba_expand", expand}};
  return lay;
}

// Gemma 3 (text): sliding and full attention with QK-norm and RoPE everywhere, a RoPE base per layer type, sandwich
// norms, GeGLU, the embedding scaled by sqrt(hidden_size), the query scale from query_pre_attn_scalar. Reads the
// keys transformers 4.5x writes (rope_theta, rope_local_base_freq, sliding_window_pattern) and 5.x writes
// (rope_parameters per layer type, layer_types), with transformers' defaults where keys are absent.
Layout gemma3_layout(const Reader& r, i64 L, bool tied) {
  const json& hf = r.j;
  const std::string& src = r.src;
  r.require("final_logit_softcapping", nullptr, "hybridlm's LM head has no soft-capping");
  r.require("attn_logit_softcapping", nullptr, "hybridlm's attention has no soft-capping");
  r.require("use_bidirectional_attention", false, "hybridlm's attention is causal");
  r.require("hidden_activation", "gelu_pytorch_tanh", "hybridlm's GeGLU uses the tanh-approximated GELU");
  refuse_rope_scaling(r);
  double full_theta = hf.contains("rope_theta") ? r.number("rope_theta") : 1000000.0;
  double local_theta = hf.contains("rope_local_base_freq") ? r.number("rope_local_base_freq") : 10000.0;
  if (hf.contains("rope_parameters") && !hf.at("rope_parameters").is_null()) {
    const json& p = hf.at("rope_parameters");
    if (!p.is_object()) fail("{}: key 'rope_parameters' must be an object", src);
    for (auto& [k, v] : p.items()) {
      if (k == "full_attention")
        full_theta = theta_of_rope_parameters(v, "rope_parameters.full_attention", src, full_theta);
      else if (k == "sliding_attention")
        local_theta = theta_of_rope_parameters(v, "rope_parameters.sliding_attention", src, local_theta);
      else
        fail("{}: key 'rope_parameters.{}' is not supported (Gemma 3 keys its RoPE by full_attention and "
             "sliding_attention)", src, k);
    }
  }
  Layout lay;
  if (const auto named = sliding_layers(r, L)) {
    for (i64 l = 0; l < L; ++l) lay.pattern += (*named)[l] ? 'S' : 'F';
  } else {
    // transformers reads sliding_window_pattern (its _sliding_window_pattern, written back, it does not read).
    const i64 every = hf.contains("sliding_window_pattern") ? r.integer("sliding_window_pattern") : 6;
    for (i64 l = 0; l < L; ++l) lay.pattern += (l + 1) % every != 0 ? 'S' : 'F';  // 6: five sliding, then a full one
  }
  lay.window = hf.contains("sliding_window") && !hf.at("sliding_window").is_null() ? r.integer("sliding_window") : 4096;
  lay.rope.assign(static_cast<size_t>(L), true);
  const double scalar = hf.contains("query_pre_attn_scalar") ? r.number("query_pre_attn_scalar") : 256.0;
  if (!(scalar > 0)) fail("{}: key 'query_pre_attn_scalar' must be > 0, got {}", src, scalar);
  lay.types = {{"F", {{"qk_norm", true}, {"rope_theta", full_theta}, {"query_pre_attn_scalar", scalar}}},
               {"S", {{"qk_norm", true}, {"rope_theta", local_theta}, {"query_pre_attn_scalar", scalar}}}};
  lay.extra = {{"rope_theta", full_theta}, {"mlp_activation", "geglu_tanh"}, {"sandwich_norm", true},
               {"scale_embeddings", true}, {"tie_embeddings", tied}};
  return lay;
}

// Qwen3Next with Gated DeltaNet layers only and dense MLPs: G layers (its gated full attention is not computed).
Layout qwen3next_layout(const Reader& r, i64 L) {
  const json& hf = r.j;
  const std::string& src = r.src;
  if (!hf.contains("layer_types") || !hf.at("layer_types").is_array() || static_cast<i64>(hf.at("layer_types").size()) != L)
    fail("{}: key 'layer_types' must name each of the {} layers (without it Qwen3Next has full-attention layers)", src, L);
  for (i64 l = 0; l < L; ++l)
    if (hf.at("layer_types")[l] != "linear_attention")
      fail("{}: key 'layer_types[{}]' = {} is not supported: Qwen3Next's full attention gates its output and "
           "applies QK-norm, which hybridlm's does not (only linear_attention layers import)",
           src, l, hf.at("layer_types")[l].dump());
  r.require("linear_conv_kernel_dim", GatedDeltaNetMixer::kConv, "hybridlm's Gated DeltaNet conv is 4 wide");
  const i64 H = r.integer("linear_num_key_heads"), K = r.integer("linear_key_head_dim");
  if (r.integer("linear_num_value_heads") != H)
    fail("{}: key 'linear_num_value_heads' ({}) differs from linear_num_key_heads ({}); hybridlm's Gated DeltaNet "
         "has one head count", src, r.integer("linear_num_value_heads"), H);
  if (r.integer("linear_value_head_dim") != K)
    fail("{}: key 'linear_value_head_dim' ({}) differs from linear_key_head_dim ({}); hybridlm's Gated DeltaNet "
         "has one head size", src, r.integer("linear_value_head_dim"), K);
  if (static_cast<float>(r.number("rms_norm_eps")) != GatedDeltaNetMixer::kNormEps)
    fail("{}: key 'rms_norm_eps' = {} is not supported for qwen3_next: its Gated DeltaNet output norm uses it, "
         "hybridlm's uses {}", src, r.number("rms_norm_eps"), GatedDeltaNetMixer::kNormEps);
  // A layer's MLP is a mixture of experts unless it is listed in mlp_only_layers or there are no experts.
  i64 experts = 512;  // transformers' default
  if (hf.contains("num_experts") && !hf.at("num_experts").is_null()) {
    if (!hf.at("num_experts").is_number_integer()) fail("{}: key 'num_experts' must be an integer", src);
    experts = hf.at("num_experts").get<i64>();
  }
  std::set<i64> dense;
  if (hf.contains("mlp_only_layers") && hf.at("mlp_only_layers").is_array())
    for (const json& l : hf.at("mlp_only_layers"))
      if (l.is_number_integer()) dense.insert(l.get<i64>());
  const i64 step = hf.contains("decoder_sparse_step") ? r.integer("decoder_sparse_step") : 1;
  for (i64 l = 0; l < L; ++l)
    if (experts > 0 && !dense.count(l) && (l + 1) % step == 0)
      fail("{}: key 'num_experts' = {}: layer {} has a mixture-of-experts MLP (not in 'mlp_only_layers'); hybridlm's "
           "MLP is a dense SwiGLU", src, experts, l);
  Layout lay;
  lay.pattern.assign(static_cast<size_t>(L), 'G');
  lay.rope.assign(static_cast<size_t>(L), true);
  lay.types = {{"G", {{"n_heads", H}, {"head_dim", K}}}};
  return lay;
}

}  // namespace

HfImport hf_import_config(const json& hf, const std::string& src) {
  if (!hf.is_object()) fail("{}: config.json must be a JSON object", src);
  const std::string model_type = hf.value("model_type", std::string());
  if (!kArchitectures.count(model_type))
    fail("{}: key 'model_type' = \"{}\" is not supported (import reads smollm3, qwen3, bamba, qwen3_next, gemma3_text; "
         "docs/hf.md)", src, model_type);
  const bool gemma = model_type == "gemma3_text";
  const std::set<std::string>& extra_keys = model_type == "bamba"        ? kBambaKeys
                                            : model_type == "qwen3_next" ? kQwen3NextKeys
                                            : gemma                      ? kGemma3Keys
                                                                         : kAttentionKeys;
  for (auto& [k, v] : hf.items())
    if (!kKnownKeys.count(k) && !extra_keys.count(k)) fail("{}: unknown key '{}' for model_type {}", src, k, model_type);
  const Reader r{hf, src};
  if (!gemma) r.require("hidden_act", "silu", "hybridlm's MLP is SwiGLU");  // Gemma 3 reads hidden_activation
  r.require("attention_bias", false, "hybridlm's projections have no bias");
  r.require("mlp_bias", false, "hybridlm's projections have no bias");
  HfImport out;
  out.architecture = kArchitectures.at(model_type);
  if (hf.contains("architectures")) {
    const json& a = hf.at("architectures");
    if (!a.is_array() || a.size() != 1 || a[0] != out.architecture)
      fail("{}: key 'architectures' = {} is not supported (expected [\"{}\"])", src, a.dump(), out.architecture);
  }

  const i64 L = r.integer("num_hidden_layers"), D = r.integer("hidden_size"), H = r.integer("num_attention_heads");
  const i64 Hkv = hf.contains("num_key_value_heads") && !hf.at("num_key_value_heads").is_null()
                      ? r.integer("num_key_value_heads")
                      : gemma ? 4 : H;
  const i64 hd = hf.contains("head_dim") && !hf.at("head_dim").is_null() ? r.integer("head_dim") : gemma ? 256 : D / H;
  const double eps = hf.contains("rms_norm_eps") ? r.number("rms_norm_eps") : 1e-6;
  // Qwen3Next imports only without attention layers, so its RoPE settings do not change the function; Gemma 3's
  // RoPE bases are its layout's.
  const double theta = model_type == "qwen3_next" || gemma
                           ? 10000.0
                           : rope_theta_of(r, model_type == "smollm3" ? 2000000.0 : 10000.0);
  if ((model_type == "qwen3" || gemma) && eps != kQkNormEps)
    fail("{}: key 'rms_norm_eps' = {} is not supported for {}: its q_norm/k_norm use it, hybridlm's QK-norm "
         "uses {}",
         src, eps, model_type, kQkNormEps);
  out.tied_embeddings = r.flag("tie_word_embeddings", model_type == "smollm3" || gemma);
  const i64 max_len = r.integer("max_position_embeddings");
  const Layout lay = model_type == "bamba"        ? bamba_layout(r, L, D)
                     : model_type == "qwen3_next" ? qwen3next_layout(r, L)
                     : gemma                      ? gemma3_layout(r, L, out.tied_embeddings)
                                                  : attention_layout(r, model_type, L, max_len, out);

  // The shortest unit that repeats to the layers ("SSSFSSSF" -> "SSSF"), as hybridlm configs write patterns.
  std::string pattern = lay.pattern;
  for (size_t p = 1; p < lay.pattern.size(); ++p) {
    bool repeats = true;
    for (size_t l = p; l < lay.pattern.size() && repeats; ++l) repeats = lay.pattern[l] == lay.pattern[l % p];
    if (repeats) {
      pattern = lay.pattern.substr(0, p);
      break;
    }
  }
  json cfg = {{"d_model", D},
              {"n_layers", L},
              {"n_heads", H},
              {"n_kv_heads", Hkv},
              {"head_dim", hd},
              {"d_ff", r.integer("intermediate_size")},
              {"vocab_size", r.integer("vocab_size")},
              {"max_seq_len", max_len},
              {"pattern", pattern},
              {"window", lay.window > 0 ? lay.window : max_len},
              {"rope_theta", theta},
              {"norm_eps", eps}};
  cfg.update(lay.extra);
  json types = json::object();
  for (auto& [letter, opts] : lay.types.items()) {
    if (lay.pattern.find(letter[0]) == std::string::npos) continue;
    json t = opts;
    if (letter == "F" || letter == "S")
      for (i64 l = 0; l < L; ++l)
        if (lay.pattern[l] == letter[0]) t["rope"] = static_cast<bool>(lay.rope[l]);
    types[letter] = t;
  }
  cfg["layer_types"] = types;
  out.config = ModelConfig::from_json(cfg, src);
  return out;
}

}  // namespace hlm
