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

#include "data/niah_task.h"
#include "train/checkpoint.h"
#include "train/niah_mix.h"

namespace hlm::cli {

LoadedModel load_model(const std::string& path, double max_memory_gib) {
  LoadedModel m;
  m.ckpt_dir = resolve_checkpoint(path);
  const ModelConfig cfg = load_checkpoint_config(m.ckpt_dir);
  // A config that asks for far more parameters than the weights file holds (fp32, 4 bytes each; the estimate
  // also counts alignment padding) cannot load: say so before allocating a model of that size.
  const std::string weights = (std::filesystem::path(m.ckpt_dir) / "model.safetensors").string();
  std::error_code ec;
  const auto file_bytes = std::filesystem::file_size(weights, ec);
  const double need = estimate_memory(cfg, MemoryUse{}).weights;
  if (!ec && 2.0 * static_cast<double>(file_bytes) < need)
    fail("{}/config.json describes {:.0f} parameters ({} layers, d_model {}), {} of fp32 weights, but {} holds only "
         "{} bytes: the config does not belong to these weights",
         m.ckpt_dir, need / 4, cfg.n_layers, cfg.d_model, format_bytes(need), weights, file_bytes);
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

void add_run_data_flags(CLI::App* app, std::string* data, std::string* tokenizer) {
  app->add_option("--data", *data, "dataset: a text file, a folder or a prepared dataset (default: the run's)");
  app->add_option("--tokenizer", *tokenizer,
                  "tokenizer the model was trained with: byte, a .model or tokenizer.json file (default: the run's)");
}

RunDataSpec run_data_spec(const LoadedModel& lm, const std::string& data_flag, const std::string& tokenizer_flag) {
  RunDataSpec s;
  s.tokenizer = tokenizer_flag.empty() ? lm.run.value("tokenizer", std::string()) : tokenizer_flag;
  // A run that records its tokenizer but no data (an imported model) is evaluated on the default corpus.
  s.data = !data_flag.empty() ? data_flag : lm.run.value("data", std::string(s.tokenizer.empty() ? "" : "default"));
  std::error_code ec;
  const bool prepared = !s.data.empty() && std::filesystem::is_regular_file(std::filesystem::path(s.data) / "meta.json", ec);
  if (s.data.empty() || (s.tokenizer.empty() && !prepared))
    fail("{}: no run.json records the data and tokenizer this model was trained with; give --data (a text file, a "
         "folder or a prepared dataset) and --tokenizer (byte, or the run's .model or tokenizer.json file)",
         lm.ckpt_dir);
  return s;
}

MemoryUse generation_memory(i64 context, i64 prefill_chunk) {
  MemoryUse mem;
  mem.batch = 1;
  mem.seq_len = prefill_chunk > 0 ? std::min(prefill_chunk, context) : context;
  mem.decode_rows = 1;
  mem.decode_context = context;
  mem.extra_bytes = 12.0 * static_cast<double>(context);  // the prompt and the haystack it is cut from, as ids
  return mem;
}

void check_generation_lengths(const std::string& flag, const std::vector<i64>& lengths, const ModelConfig& cfg,
                              double max_memory_gib) {
  for (i64 L : lengths)
    check_memory(fmt::format("{} {} (generating after a prompt of that length)", flag, L), cfg, generation_memory(L),
                 max_memory_gib);
}

void check_niah_lengths(const std::string& flag, const std::vector<i64>& lengths, const ModelConfig& cfg,
                        const data::Tokenizer& tok, int digits, const Haystack& hay, double max_memory_gib) {
  const i64 shortest = niah_min_length(tok, digits);
  for (i64 L : lengths) {
    if (L < shortest)
      fail("{}: length {} is too short for the NIAH needle and question, which need {} tokens with tokenizer {} and "
           "--niah-digits {}; give lengths >= {}",
           flag, L, shortest, tok.spec(), digits, shortest);
    if (hay.source_tokens() > 0 && L > hay.source_tokens())
      fail("{}: length {} is beyond the corpus haystack, whose validation split holds {} tokens; give lengths <= {} "
           "or --haystack noise",
           flag, L, hay.source_tokens(), hay.source_tokens());
  }
  check_generation_lengths(flag, lengths, cfg, max_memory_gib);
}

void check_niah_rows_before_data(double mix_niah, i64 seq_len, int digits, const std::string& tokenizer_spec) {
  if (mix_niah <= 0 || tokenizer_spec.empty() || tokenizer_spec.rfind("bpe", 0) == 0) return;
  std::error_code ec;
  if (tokenizer_spec != "byte" && !std::filesystem::is_regular_file(tokenizer_spec, ec)) return;  // refused later
  NiahMixStream::check_row_length(seq_len, digits, *data::load_tokenizer(tokenizer_spec));
}

}  // namespace hlm::cli
