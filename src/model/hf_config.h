#pragma once
// Hugging Face interop, the model side: which `transformers` architecture computes the same function as a
// hybridlm config (its config.json), the reverse, and the tensor names each uses. docs/hf.md has the table
// of what maps where and why the rest is refused.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace hlm {

// Token ids the exported config.json names (-1: none). They must lie inside the vocabulary.
struct HfSpecialTokens {
  int bos = -1, eos = -1;
};

struct HfExport {
  std::string architecture;  // e.g. "SmolLM3ForCausalLM"
  json config;               // the config.json
};

// Throws hlm::Error saying which part of the model no supported architecture expresses.
HfExport hf_export_config(const ModelConfig& c, const HfSpecialTokens& special);

// The architecture's name for a hybridlm tensor: the same for SmolLM3 and Qwen3; Bamba names its Mamba-2
// mixer `mamba`, its MLP `feed_forward`, the MLP's norm `pre_ff_layernorm`, the final norm `final_layernorm`.
// (Qwen3Next fuses tensors, so its layout lives in hf_weights.cpp.)
std::string hf_tensor_name(const std::string& architecture, const std::string& name);

struct HfImport {
  ModelConfig config;
  std::string architecture;
  bool tied_embeddings = false;  // lm_head.weight is a copy of model.embed_tokens.weight
  std::vector<std::string> notes;  // what a user should know (e.g. full layers expressed as wide windows)
};

// Strict: an unknown architecture, an unknown key, or an option hybridlm does not compute is an
// hlm::Error naming `source` and the key.
HfImport hf_import_config(const json& hf, const std::string& source);

}  // namespace hlm
