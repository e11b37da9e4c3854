#pragma once
// Flags and helpers shared by subcommands: model config selection, threads, JSON output.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "model/config.h"

namespace hlm::cli {

struct ModelFlags {
  std::string preset, config_file;
  std::vector<std::string> overrides;
  void add(CLI::App* app);
  ModelConfig resolve() const;
  bool given() const { return !preset.empty() || !config_file.empty() || !overrides.empty(); }
};

// --threads N (0 = all cores): sets OpenMP's thread count.
void add_threads_flag(CLI::App* app, int* threads);
void apply_threads(int threads);

// --niah-digits N: digits of the NIAH needle values. Left unset, niah_digits() takes the run's own value.
void add_niah_digits_flag(CLI::App* app, int* digits);
// The flag when given (>= 1, else hlm::Error naming the flag), else run.json's train.niah_digits, else 7.
int niah_digits(int flag, const nlohmann::json& run);

// Prints one JSON object on stdout (invalid UTF-8 in strings becomes U+FFFD).
void print_json(const nlohmann::json& j);

// Peak resident set size of this process in MiB (VmHWM).
double peak_rss_mb();

// A run folder's config.json (written by `train`): {"model": ..., "train": ..., "data": ..., "tokenizer": ...}.
nlohmann::json read_run_config(const std::string& run_or_ckpt_dir);

}  // namespace hlm::cli

#include <memory>

#include "model/model.h"

namespace hlm::cli {

// A trained model loaded from a run folder or checkpoint folder, with the run's settings.
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::string ckpt_dir;
  nlohmann::json run;  // run.json of the run folder ({} when absent)
};
LoadedModel load_model(const std::string& run_or_ckpt);

}  // namespace hlm::cli
