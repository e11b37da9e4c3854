#pragma once
// A prepared dataset: train.tok + val.tok token shards, the tokenizer they were made with, and a
// meta.json describing both, in one folder. prepare_dataset() builds it on first use and reuses it
// afterwards (rebuilding when the source files change).
//
// Data spec:       "default" (Debian docs corpus), a text file, a folder of text files, or a folder
//                  that already holds meta.json + shards (used as it is).
// Tokenizer spec:  "byte", "bpe:N" (a SentencePiece BPE with N pieces trained on this corpus' train
//                  split and cached with it), or a path to a .model. Empty means "bpe:4096".
// Cache folder:    <cache_dir>/<name>-<tokenizer>/, cache_dir defaulting to $HLM_DATA_CACHE or
//                  <repo>/data/cache.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace hlm::data {

inline constexpr const char* kDefaultTokenizerSpec = "bpe:4096";

struct Dataset {
  std::string dir;             // folder holding everything below
  std::string train_path;      // train.tok
  std::string val_path;        // val.tok
  std::string tokenizer_spec;  // for load_tokenizer(): "byte" or an absolute .model path
  std::int64_t vocab_size = 0;
  std::int32_t eos_id = 0;
  nlohmann::json meta;         // the parsed meta.json
};

struct PrepareOptions {
  double val_fraction = 0.02;          // documents (by path hash) that go to val; at least one
  std::int64_t spm_sample_bytes = 12'000'000;  // text sampled to train a "bpe:N" tokenizer
  std::int64_t batch_bytes = 32 << 20;       // text tokenised per parallel step (bounds memory)
  bool quiet = false;                   // no progress on stderr
};

std::string default_cache_dir();

Dataset prepare_dataset(const std::string& data_spec, const std::string& tokenizer_spec = "",
                        const std::string& cache_dir = "", const PrepareOptions& opt = {});

// Opens a folder holding meta.json + shards; throws hlm::Error naming the file and field on problems.
Dataset open_dataset(const std::string& dir);

}  // namespace hlm::data
