#pragma once
// GGUF interop: a llama.cpp model file as a hybridlm model. The file's metadata (`<arch>.*` keys) is read as the
// Hugging Face config.json of the same architecture would be (model/hf_config.h maps that to a ModelConfig, with
// its checks), and every tensor is dequantized to fp32 into the parameter llama.cpp's converter made it from.
// Architectures: gemma3 (Gemma3ForCausalLM) and qwen3 (Qwen3ForCausalLM). docs/hf.md, "GGUF".
#include <string>
#include <vector>

#include "core/gguf.h"
#include "model/hf_config.h"
#include "model/model.h"

namespace hlm {

struct GgufImport {
  HfImport hf;                     // the config as Hugging Face's architecture would give it
  std::string gguf_architecture;   // general.architecture
  nlohmann::json hf_config;        // the config.json the metadata amounts to (written beside the import)
};

// Strict: an unknown architecture, a key of the architecture hybridlm does not read (e.g. soft-capping, RoPE
// scaling), or a tensor type it cannot dequantize is an hlm::Error naming the file and the key or tensor, raised
// before any weight is read.
GgufImport gguf_import_config(const GgufFile& file);

// Dequantizes every tensor of `file` into `model` (made from imp.hf.config). A tensor with no place in the model,
// a missing one, or a shape other than the config implies is an hlm::Error naming the file and the tensor.
void load_gguf_weights(const GgufFile& file, const GgufImport& imp, Model& model);

}  // namespace hlm
