#pragma once
// Checkpoints: a folder per step under <run>/checkpoints/step_NNNNNN/ holding
//   model.safetensors      parameters under their Hugging Face style names
//   optimizer.safetensors  AdamW moments ("exp_avg.<name>", "exp_avg_sq.<name>")
//   trainer_state.json     step, optimizer step/hyper-parameters, data-loader state, RNG, run config
//   config.json            the model config
// The folder is written as step_NNNNNN.tmp, every file fsynced, then renamed; <run>/latest names the
// newest complete checkpoint (also replaced atomically). A crash never leaves a half checkpoint; a failed write
// (disk full) throws naming the file and leaves `latest` on the previous checkpoint.
#include <string>

#include <nlohmann/json.hpp>

#include "core/file_io.h"  // write_file_atomic
#include "model/model.h"
#include "train/checkpoint_reader.h"  // resolve_checkpoint, load_checkpoint_config, load_trainer_state
#include "train/optimizer.h"

namespace hlm {

struct CheckpointData {
  nlohmann::json trainer_state;  // free-form: step, loader, rng, schedule, ...
};

// Writes a checkpoint for `step`; returns its folder. `opt` may be null (no optimizer file).
std::string save_checkpoint(const std::string& run_dir, long step, const Model& model, const AdamW* opt,
                            const nlohmann::json& trainer_state);
// Removes all but the `keep` checkpoints of highest step (keep <= 0: keep all); the one `latest` names is always
// kept. Call it only after save_checkpoint returned (the new checkpoint is complete and `latest` names it).
void prune_checkpoints(const std::string& run_dir, int keep);

// Loads parameters (every registered tensor must be present with the right shape and dtype, every value finite).
void load_model_params(const std::string& ckpt_dir, Model& model);
void load_optimizer(const std::string& ckpt_dir, AdamW& opt);

}  // namespace hlm
