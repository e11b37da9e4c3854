#pragma once
// Training a SentencePiece BPE model (libsentencepiece's trainer) from text held in memory, or from a
// deterministic sample of a corpus. Text is kept byte-exact: identity normalisation, no whitespace
// folding, no dummy prefix, byte_fallback on, so decode(encode(text)) == text for any UTF-8 input.
#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus.h"

namespace hlm::data {

struct SpmTrainOptions {
  int vocab_size = 4096;
  std::int64_t sample_bytes = 12'000'000;  // text handed to the trainer (keeps training well under a minute)
  std::uint64_t seed = 0;                // picks which documents are sampled
  int threads = 0;                       // 0: hlm::num_threads()
  bool verbose = false;                  // let SentencePiece print its own log
  // false: pieces may span words (" magic number for"), for tiny vocabularies learned from templated text.
  bool split_by_whitespace = true;
  int max_piece_chars = 16;              // longest piece in characters (SentencePiece's max_sentencepiece_length)
};

// Writes the model to out_path (temp file + rename). Each sentence may span several lines.
// Throws hlm::Error with SentencePiece's message (e.g. a vocab too large for the text).
void train_sentencepiece(const std::vector<std::string>& sentences, const std::string& out_path,
                         const SpmTrainOptions& opt);

// Whole documents in seeded-hash order (those with include[i], if include is given) until
// sample_bytes, each cut into multi-line chunks of at most a few KB at line boundaries.
std::vector<std::string> sample_sentences(const Corpus& corpus, const std::vector<bool>* include,
                                          std::int64_t sample_bytes, std::uint64_t seed);

// sample_sentences + train_sentencepiece; progress on stderr.
void train_sentencepiece_on_corpus(const Corpus& corpus, const std::vector<bool>* include,
                                   const std::string& out_path, const SpmTrainOptions& opt);

}  // namespace hlm::data
