#pragma once
// The tokenizer interface and the one entry point that turns a spec into a tokenizer.
//   "byte"          -> ByteTokenizer (ids 0..255 are bytes, 256 = <eos>)
//   "<path>.model"  -> SentencePieceTokenizer loaded from that file
//   "<path>.gguf.json" -> a tokenizer from GGUF tokenizer metadata saved as JSON (data/vocab_tokenizer.h)
//   "<path>.json"   -> ByteLevelBpeTokenizer: a Hugging Face byte-level BPE tokenizer.json (with its
//                      tokenizer_config.json alongside for eos_token / bos_token)
// <eos> separates documents in token shards; a model's vocab may be larger than vocab_size().
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hlm::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // Special tokens (<eos>, <bos>) decode to nothing; an id outside [0, vocab_size()) throws hlm::Error.
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual int eos_id() const = 0;
  // -1 when the tokenizer has no distinct <bos>.
  virtual int bos_id() const = 0;
  // Whether the model expects <bos> before (<eos> after) a prompt's ids, which encode() leaves out.
  virtual bool adds_bos() const { return false; }
  virtual bool adds_eos() const { return false; }
  // Short human-readable name, e.g. "byte" or "spm-bpe4096".
  virtual std::string name() const = 0;
  // The spec that load_tokenizer() accepts to recreate this tokenizer.
  virtual std::string spec() const = 0;
};

// "byte", a path to a SentencePiece .model, a GGUF vocabulary dump (.gguf.json) or a path to a tokenizer.json.
// Throws hlm::Error naming the file when it is missing or unreadable.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

}  // namespace hlm::data
