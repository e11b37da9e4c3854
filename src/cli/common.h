#pragma once
// Flags and helpers shared by subcommands: model config selection, threads, JSON output.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "model/config.h"
#include "model/memory_estimate.h"
#include "train/run_json.h"  // parse_run_json, read_run_config

namespace hlm::cli {

struct ModelFlags {
  std::string preset, config_file;
  std::vector<std::string> overrides;
  void add(CLI::App* app);
  ModelConfig resolve() const;
  bool given() const { return !preset.empty() || !config_file.empty() || !overrides.empty(); }
};

// Parse-time range checks for numeric flags: NaN, infinities and values outside [lo, hi] are refused before any
// work, and CLI11 prefixes the flag's name ("--lr: -1 is outside [0, inf)"). Also applied to each item of a list.
CLI::Validator in_range(double lo, double hi);
CLI::Validator at_least(double lo);
// Seeds: integers in [0, 2^63) (a negative seed used to wrap to 2^64-1).
CLI::Validator seed_range();

// --max-memory GIB: the most a command may allocate (default: the machine's memory).
void add_max_memory_flag(CLI::App* app, double* gib);
// Estimates the memory of `use` with `cfg` and refuses (hlm::Error, the estimate and its parts in the message)
// when it is over --max-memory or the machine's memory. `what` names the work ("training", "generate").
void check_memory(const std::string& what, const ModelConfig& cfg, const MemoryUse& use, double max_memory_gib);

// --precision fp32|bf16: the matmul precision (ops/precision.h; bf16 only where the CPU has it natively).
void add_precision_flag(CLI::App* app, std::string* precision);

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

}  // namespace hlm::cli

#include <memory>

#include "data/haystack.h"
#include "data/tokenizer.h"
#include "model/model.h"

namespace hlm::cli {

// A trained model loaded from a run folder or checkpoint folder, with the run's settings.
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::string ckpt_dir;
  nlohmann::json run;  // run.json of the run folder ({} when absent)
};
// The checkpoint's config must describe its weights (model.safetensors is not under half the config's fp32
// weights) and fit in memory (check_memory), both before the model is built, and the weights must be finite
// (load_model_params).
LoadedModel load_model(const std::string& run_or_ckpt, double max_memory_gib = 0);

// --data and --tokenizer of the commands that read a run's data (eval, probe): default the run's.
void add_run_data_flags(CLI::App* app, std::string* data, std::string* tokenizer);
struct RunDataSpec {
  std::string data, tokenizer;  // as prepare_dataset takes them
};
// The flags, else run.json's. Without run.json (a bare checkpoint folder) nothing says which data and tokenizer
// the model was trained with: refused naming --data and --tokenizer, instead of building the default corpus.
RunDataSpec run_data_spec(const LoadedModel& lm, const std::string& data_flag, const std::string& tokenizer_flag);

// What generating after a prompt of `context` tokens allocates: the decode caches of the whole context and
// the activations of one prefill piece (infer/generator.h).
MemoryUse generation_memory(i64 context, i64 prefill_chunk = 1024);
// Prompt lengths given by `flag` that a command generates after (NIAH, RULER, probes): each one's generation
// must fit in memory (check_memory, naming the flag and the length).
void check_generation_lengths(const std::string& flag, const std::vector<i64>& lengths, const ModelConfig& cfg,
                              double max_memory_gib = 0);
// NIAH prompt lengths given by `flag`: each must hold the needle and question with this tokenizer and digits
// (the shortest length is named), stay within a corpus haystack's tokens, and fit in memory.
void check_niah_lengths(const std::string& flag, const std::vector<i64>& lengths, const ModelConfig& cfg,
                        const data::Tokenizer& tok, int digits, const Haystack& hay, double max_memory_gib = 0);
// train --mix-niah before the data is prepared, where the tokenizer is known without a build ("byte" or a
// tokenizer file; a bpe:N tokenizer is checked once trained): the rows must hold the needle.
void check_niah_rows_before_data(double mix_niah, i64 seq_len, int digits, const std::string& tokenizer_spec);

// Loads the tokenizer `spec` for a loaded model, refused (naming both) when its ids would not fit the model's
// vocabulary, e.g. a BPE tokenizer on a byte-level model.
std::unique_ptr<data::Tokenizer> tokenizer_for(const LoadedModel& lm, const std::string& spec);

}  // namespace hlm::cli
