#include "cli/common.h"

#include <omp.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/file_io.h"
#include "model/memory_estimate.h"

namespace hlm::cli {

void ModelFlags::add(CLI::App* app) {
  app->add_option("--preset", preset, "named architecture: full, swa128, swa128-nope, swa512, swa2048, lightning, mamba2, gdn");
  app->add_option("--config", config_file, "model config JSON file (docs/model.md)");
  app->add_option("--set", overrides, "override a config key, e.g. --set d_model=64 --set layer_types.F.rope=false")
      ->take_all();
}

ModelConfig ModelFlags::resolve() const { return resolve_config(preset, config_file, overrides); }

CLI::Validator in_range(double lo, double hi) {
  auto num = [](double v) {  // whole numbers in full (1048576, not 1.04858e+06)
    return std::abs(v) < 1e15 && v == std::floor(v) ? fmt::format("{}", static_cast<long long>(v)) : fmt::format("{:g}", v);
  };
  const std::string range = fmt::format("[{}, {}", num(lo), std::isinf(hi) ? "inf)" : num(hi) + "]");
  return CLI::Validator(
      [lo, hi, range](std::string& input) -> std::string {
        const char* s = input.c_str();
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(s, &end);
        if (end == s || *end != '\0') return fmt::format("expected a number in {}, got '{}'", range, input);
        if (!std::isfinite(v) || v < lo || v > hi) return fmt::format("{} is outside {}", input, range);
        return std::string();
      },
      range);
}

CLI::Validator at_least(double lo) { return in_range(lo, std::numeric_limits<double>::infinity()); }

CLI::Validator seed_range() { return in_range(0, 9223372036854775807.0); }

void add_threads_flag(CLI::App* app, int* threads) {
  app->add_option("--threads", *threads, "OpenMP threads (0 = all cores)")->default_val(0)->check(in_range(0, 4096));
}

void add_precision_flag(CLI::App* app, std::string* precision) {
  app->add_option("--precision", *precision,
                  "matmul precision: fp32, or bf16 (bf16 operands, fp32 accumulation, weights and optimizer state; "
                  "needs AVX512_BF16 or AMX)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
}

void add_max_memory_flag(CLI::App* app, double* gib) {
  app->add_option("--max-memory", *gib, "most memory this command may use, in GiB (default: the machine's)")
      ->check(in_range(0.001, 1e9));
}

void check_memory(const std::string& what, const ModelConfig& cfg, const MemoryUse& use, double max_memory_gib) {
  const MemoryEstimate e = estimate_memory(cfg, use);
  const double limit = max_memory_gib > 0 ? max_memory_gib * 1024.0 * 1024 * 1024 : machine_memory_bytes();
  if (e.total() > limit)
    fail("{} needs an estimated {}, over {} {}; use a smaller model, batch or length{}", what, e.describe(),
         max_memory_gib > 0 ? "--max-memory" : "this machine's memory", format_bytes(limit),
         max_memory_gib > 0 ? "" : " (or set --max-memory if the estimate is wrong)");
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
  return run_niah_digits(run);
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

}  // namespace hlm::cli

#include "train/checkpoint.h"

namespace hlm::cli {

LoadedModel load_model(const std::string& path, double max_memory_gib) {
  LoadedModel m;
  m.ckpt_dir = resolve_checkpoint(path);
  const ModelConfig cfg = load_checkpoint_config(m.ckpt_dir);
  check_memory("loading " + m.ckpt_dir, cfg, MemoryUse{}, max_memory_gib);
  m.model = std::make_unique<Model>(cfg);
  load_model_params(m.ckpt_dir, *m.model);
  m.run = read_run_config(m.ckpt_dir);
  return m;
}

std::unique_ptr<data::Tokenizer> tokenizer_for(const LoadedModel& lm, const std::string& spec) {
  auto tok = data::load_tokenizer(spec);
  if (tok->vocab_size() > lm.model->config().vocab_size)
    fail("tokenizer {} has {} tokens but the model in {} has vocab_size {}; use the run's tokenizer", spec,
         tok->vocab_size(), lm.ckpt_dir, lm.model->config().vocab_size);
  return tok;
}

}  // namespace hlm::cli
