#pragma once
// Tokenizers made from the tokenizer metadata a GGUF file carries (the `tokenizer.ggml.*` keys), encoding as
// llama.cpp does on the same file:
//   model "llama" -> SentencePiece-style BPE over scored pieces with byte fallback (data/spm_vocab_tokenizer.h)
//   model "gpt2"  -> byte-level BPE with ranked merges and the pre-tokenizer that `pre` names
//                    (data/byte_level_bpe.h)
// TokenizerVocab holds the keys as read, whoever reads them (the GGUF reader, or the JSON dump below, which
// tools/gguf_tokenizer/dump_vocab.py writes from a GGUF file). What is refused, and why, is in docs/data.md.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace hlm::data {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : std::int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct TokenizerVocab {
  std::string model;                     // tokenizer.ggml.model: "llama" or "gpt2"
  std::string pre;                       // tokenizer.ggml.pre: the gpt2 pre-tokenizer's name ("" when absent)
  std::vector<std::string> tokens;       // tokenizer.ggml.tokens, by id
  std::vector<float> scores;             // tokenizer.ggml.scores (empty when absent: all 0)
  std::vector<std::int32_t> token_type;  // tokenizer.ggml.token_type (empty when absent: all normal)
  std::vector<std::string> merges;       // tokenizer.ggml.merges, "left right", rank = index (gpt2)
  // tokenizer.ggml.{bos,eos,unknown,padding}_token_id; -1 when the key is absent.
  std::int64_t bos = -1, eos = -1, unk = -1, pad = -1;
  // tokenizer.ggml.add_bos_token, add_eos_token, add_space_prefix; absent: llama.cpp's default for the model.
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

// Checks the vocabulary and makes its tokenizer. `where` names the source in errors (the GGUF or JSON file);
// `spec` is what the tokenizer's spec() returns (load_tokenizer() must accept it). Throws hlm::Error naming
// the key of anything inconsistent (lengths, ids out of range, duplicates) or not supported (model, pre).
std::unique_ptr<Tokenizer> make_vocab_tokenizer(const TokenizerVocab& vocab, const std::string& where,
                                                const std::string& spec);

// The JSON dump: one object whose keys are the GGUF keys above ("tokenizer.ggml.tokens": [...], ...), plus
// "format": "hybridlm-gguf-vocab". File names end in ".gguf.json", which load_tokenizer() recognises.
void write_vocab_json(const TokenizerVocab& vocab, const std::string& path);
TokenizerVocab read_vocab_json(const std::string& path);
// read_vocab_json + make_vocab_tokenizer, with the file's absolute path as the spec.
std::unique_ptr<Tokenizer> load_vocab_json_tokenizer(const std::string& path);

}  // namespace hlm::data
