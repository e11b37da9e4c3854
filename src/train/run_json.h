#pragma once
// Reading a run folder's run.json (written by `train`: data, tokenizer and training settings), which eval,
// generate, probe and `train --resume` read back. Apart from the CLI so that it builds with the other readers of
// untrusted files (the sanitized reader build, docs/reliability.md).
#include <string>

#include <nlohmann/json.hpp>

namespace hlm {

// Reads and type-checks a run.json (hlm::Error naming the file and field).
nlohmann::json parse_run_json(const std::string& path);
// The run.json of the run folder holding `run_or_ckpt_dir` (the folder itself or up to two levels up, so a
// checkpoint folder finds its run); {} when there is none.
nlohmann::json read_run_config(const std::string& run_or_ckpt_dir);
// The run's NIAH needle digits (train.niah_digits), 7 when it has none.
int run_niah_digits(const nlohmann::json& run);

}  // namespace hlm
