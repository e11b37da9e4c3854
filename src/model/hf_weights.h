#pragma once
// Hugging Face interop, the weights: model.safetensors in and out, under the architecture's tensor names
// (model/hf_config.h). Export writes fp32; import reads F32, BF16, F16 or F64 tensors, from one file or
// from the shards listed in model.safetensors.index.json.
#include <string>
#include <vector>

#include "model/model.h"

namespace hlm {

// Writes every parameter of `model` as F32 to `path` (atomically).
void write_hf_weights(const Model& model, const std::string& architecture, const std::string& path);

// Loads every parameter of `model` from the Hugging Face folder `hf_dir`. With `tied_embeddings`,
// lm_head.weight may be absent and is then a copy of model.embed_tokens.weight. A model that ties its head
// (config tie_embeddings) has no lm_head.weight: a file's must equal the embedding. A tensor the model does
// not have (other than rotary inv_freq buffers) is an hlm::Error naming it and its file.
void load_hf_weights(const std::string& hf_dir, const std::string& architecture, Model& model, bool tied_embeddings);

// A tied file has no head tensor: where the model keeps lm_head.weight as a parameter and it was not loaded
// (`loaded`, by registry index), copies the loaded embedding into it and marks it loaded.
void fill_tied_head(Model& model, std::vector<bool>& loaded);

// A tied file has no head tensor: where the model keeps lm_head.weight as a parameter and it was not loaded
// (`loaded`, by registry index), copies the loaded embedding into it and marks it loaded. For every importer.
void fill_tied_head(Model& model, std::vector<bool>& loaded);

}  // namespace hlm
