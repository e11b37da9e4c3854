#include "cli/common.h"

#include <omp.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace hlm::cli {

void ModelFlags::add(CLI::App* app) {
  app->add_option("--preset", preset, "named architecture: full, swa128, swa128-nope, swa512, swa2048, lightning, mamba2, gdn");
  app->add_option("--config", config_file, "model config JSON file (docs/model.md)");
  app->add_option("--set", overrides, "override a config key, e.g. --set d_model=64 --set layer_types.F.rope=false")
      ->take_all();
}

ModelConfig ModelFlags::resolve() const { return resolve_config(preset, config_file, overrides); }

void add_threads_flag(CLI::App* app, int* threads) {
  app->add_option("--threads", *threads, "OpenMP threads (0 = all cores)")->default_val(0);
}

void apply_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

constexpr int kDigitsUnset = std::numeric_limits<int>::min();

void add_niah_digits_flag(CLI::App* app, int* digits) {
  *digits = kDigitsUnset;
  app->add_option("--niah-digits", *digits, "digits of the NIAH needle values (default: the run's, else 7)");
}

int niah_digits(int flag, const nlohmann::json& run) {
  if (flag != kDigitsUnset) {
    if (flag < 1) fail("--niah-digits must be >= 1, got {}", flag);
    return flag;
  }
  if (run.contains("train") && run["train"].contains("niah_digits")) return run["train"]["niah_digits"].get<int>();
  return 7;
}

void print_json(const nlohmann::json& j) {
  // Generated text can hold invalid UTF-8 (a byte-level model emits any byte): such bytes print as U+FFFD
  // instead of aborting the command after the work is done.
  std::fputs((j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n").c_str(), stdout);
  std::fflush(stdout);
}

double peak_rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

nlohmann::json read_run_config(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path p(dir);
  for (int up = 0; up < 3 && !p.empty(); ++up) {
    if (fs::exists(p / "run.json")) {
      std::ifstream f(p / "run.json");
      try {
        return nlohmann::json::parse(f);
      } catch (const nlohmann::json::parse_error& e) {
        fail("{}: malformed JSON: {}", (p / "run.json").string(), e.what());
      }
    }
    p = p.parent_path();
  }
  return nlohmann::json::object();
}

}  // namespace hlm::cli

#include "train/checkpoint.h"

namespace hlm::cli {

LoadedModel load_model(const std::string& path) {
  LoadedModel m;
  m.ckpt_dir = resolve_checkpoint(path);
  m.model = std::make_unique<Model>(load_checkpoint_config(m.ckpt_dir));
  load_model_params(m.ckpt_dir, *m.model);
  m.run = read_run_config(m.ckpt_dir);
  return m;
}

}  // namespace hlm::cli
