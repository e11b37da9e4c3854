#pragma once
// The layout of a run folder, in one place: every command that writes or reads a run (train, eval, probe,
// sweep, reproduce, scaling fit, export, import) names its files through these functions.
//
//   <run>/config.json          the model (ModelConfig JSON), written when training starts
//   <run>/run.json             data, tokenizer and training settings (how the run was made)
//   <run>/metrics.jsonl        one JSON row per logged step and per evaluation, appended
//   <run>/checkpoints/step_NNNNNNNN/   one folder per checkpoint (train/checkpoint.h: model.safetensors,
//                              optimizer.safetensors, trainer_state.json, config.json); `.tmp` / `.old`
//                              suffixes mark unfinished writes of a killed run
//   <run>/latest               the newest complete checkpoint's folder name
//   <run>/lock                 held (flock) by the trainer writing the run (train/run_lock.h)
//   <run>/train.log            the output of a training started by sweep or reproduce
//   <run>/evals/               reproduce's evaluation and probe results of this run
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace hlm::run_folder {

using Path = std::filesystem::path;

inline Path config(const Path& run) { return run / "config.json"; }
inline Path run_json(const Path& run) { return run / "run.json"; }
inline Path metrics(const Path& run) { return run / "metrics.jsonl"; }
inline Path checkpoints(const Path& run) { return run / "checkpoints"; }
inline Path latest(const Path& run) { return run / "latest"; }
inline Path lock(const Path& run) { return run / "lock"; }
inline Path train_log(const Path& run) { return run / "train.log"; }
inline Path evals(const Path& run) { return run / "evals"; }

// Inside a checkpoint folder.
inline Path model_weights(const Path& ckpt) { return ckpt / "model.safetensors"; }
inline Path optimizer_state(const Path& ckpt) { return ckpt / "optimizer.safetensors"; }
inline Path trainer_state(const Path& ckpt) { return ckpt / "trainer_state.json"; }
inline Path model_config(const Path& ckpt) { return ckpt / "config.json"; }

// What `train` writes at the start of a run; what a `--overwrite` start removes.
inline std::vector<Path> run_files(const Path& run) {
  return {latest(run), run_json(run), config(run), metrics(run), checkpoints(run)};
}

// "step_00000150" for step 150.
std::string step_name(long step);
// The step of a complete checkpoint's folder name "step_<digits>"; -1 for any other name (.tmp, .old, ...).
long parse_step_name(const std::string& name);
// The complete checkpoints of a run, (step, folder) in increasing step order; empty when there are none.
std::vector<std::pair<long, Path>> list_checkpoints(const Path& run);

}  // namespace hlm::run_folder
