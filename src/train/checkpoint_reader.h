#pragma once
// Reading a checkpoint folder's small files without a model: which checkpoint a path names (via `latest`), its
// model config and its trainer state. Apart from train/checkpoint.h (which writes checkpoints and loads weights
// into a Model) so that the readers of untrusted files build without the engine (the sanitized reader build,
// docs/reliability.md). Every refusal is an hlm::Error naming the file and field.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace hlm {

// The checkpoint name a run folder's `latest` holds ("" when there is no `latest`); refused unless it names a
// checkpoint of this run (step_<digits>, no path).
std::string latest_checkpoint_name(const std::filesystem::path& run_dir);
// Resolves a checkpoint folder from a run folder (via `latest`) or a checkpoint folder itself.
std::string resolve_checkpoint(const std::string& path);
ModelConfig load_checkpoint_config(const std::string& ckpt_dir);
// trainer_state.json, its fields type-checked: step (>= 0), train_loader (object), tokens, first_val_loss.
nlohmann::json load_trainer_state(const std::string& ckpt_dir);

}  // namespace hlm
