#pragma once
// Model configuration: JSON (docs/model.md), named presets, `--set key=value` overrides, and the
// layer pattern. Parsing is strict: unknown keys, bad types and bad letters are errors that name the
// source (file or preset) and the field.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "mixers/mixer_spec.h"  // LayerTypeOptions

namespace hlm {

using json = nlohmann::json;

// Mixer letters. F and S are softmax attention; L, M, G are linear recurrent mixers.
inline constexpr const char* kMixerLetters = "FSLMG";

// The MLP's gated unit: down(act(gate(x)) * up(x)) with act = SiLU (SwiGLU) or tanh-approximated GELU (GeGLU).
enum class MlpActivation { swiglu, geglu_tanh };

struct ModelConfig {
  i64 d_model = 256, n_layers = 8, n_heads = 4, n_kv_heads = 4, head_dim = 64, d_ff = 768;
  i64 vocab_size = 4096, max_seq_len = 1024;
  std::string pattern = "SSSF";
  i64 window = 128;
  double rope_theta = 10000.0;
  double norm_eps = 1e-6;
  double init_scale = 1.0;  // multiplies the std of every N(0, std) weight (small models leave the plateau sooner)
  i64 chunk_size = 64;
  i64 mamba_d_state = 64, mamba_expand = 2;
  // Block and embedding options (all off by default; Gemma 3 turns every one on, docs/model.md "Gemma 3"):
  MlpActivation mlp_activation = MlpActivation::swiglu;
  bool sandwich_norm = false;     // RMSNorm on the mixer's and the MLP's outputs before each residual add
  bool scale_embeddings = false;  // the embedding's output times sqrt(d_model) (rounded to fp32)
  bool tie_embeddings = false;    // the LM head reads the embedding matrix (no lm_head.weight)
  std::map<char, LayerTypeOptions> types;  // resolved options for every letter used in `pattern`

  char letter(i64 layer) const { return pattern[static_cast<size_t>(layer) % pattern.size()]; }
  std::string layer_pattern() const;  // the expanded per-layer string, e.g. "SSSFSSSF"
  const LayerTypeOptions& type(char c) const;
  const LayerTypeOptions& layer_type(i64 layer) const { return type(letter(layer)); }
  // The factor scale_embeddings multiplies the embedding's output by (1 when off).
  float embedding_scale() const;
  json to_json() const;
  // Strict parse; `source` names the file or preset in error messages.
  static ModelConfig from_json(const json& j, const std::string& source);
};

// Named presets (the paper's architectures at the benchmark size). Throws on an unknown name.
json preset_json(const std::string& name);
std::vector<std::string> preset_names();

// Applies "a.b.c=value" to j. value is parsed as JSON when it can be (numbers, true/false, objects),
// else taken as a string.
void apply_override(json& j, const std::string& assignment);

// preset (or "" for defaults) + optional config file + overrides -> validated config.
ModelConfig resolve_config(const std::string& preset, const std::string& config_file,
                           const std::vector<std::string>& overrides);

}  // namespace hlm
