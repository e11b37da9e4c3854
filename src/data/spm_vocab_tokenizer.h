#pragma once
// SentencePiece-style BPE over a GGUF "llama" vocabulary (Gemma, Llama 2, Mistral), as llama.cpp encodes it
// (llm_tokenizer_spm and tokenizer_st_partition in its src/llama-vocab.cpp):
//   1. special tokens are cut out of the text first, longest first, every occurrence: user-defined tokens
//      always, control and unknown ones too when `parse_special`;
//   2. each stretch of text between them gets a leading space when add_space_prefix is set and it starts the
//      text or follows a special token, and every space becomes U+2581;
//   3. its UTF-8 characters are merged pairwise: always the adjacent pair whose joined text is a token with the
//      highest score (the leftmost on ties), until no joined pair is a token;
//   4. each result that is not a token becomes its bytes' <0xNN> tokens (byte fallback).
// Decoding: normal tokens with U+2581 back to spaces, byte tokens to their byte, user-defined tokens as
// written, control, unknown and unused tokens to nothing. Encoding is thread-safe.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"
#include "data/vocab_tokenizer.h"

namespace hlm::data {

class SpmVocabTokenizer final : public Tokenizer {
 public:
  // `vocab` has been checked by make_vocab_tokenizer (lengths, ranges, no duplicates); eos and bos are the
  // ids after llama.cpp's defaults (bos -1 when none).
  SpmVocabTokenizer(const TokenizerVocab& vocab, const std::string& where, std::string spec, std::int32_t eos,
                    std::int32_t bos, std::int32_t unk, bool add_bos, bool add_eos, bool add_space_prefix);

  // As llama.cpp's tokenize(text, add_special = false, parse_special = false) (what llama-perplexity runs;
  // `llama-tokenize --no-parse-special`): text is data, so "<eos>" in a document is its characters.
  std::vector<std::int32_t> encode(std::string_view text) const override { return encode(text, false); }
  // parse_special: control and unknown tokens written in the text are those tokens (`llama-tokenize`'s default).
  std::vector<std::int32_t> encode(std::string_view text, bool parse_special) const;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  int eos_id() const override { return eos_; }
  int bos_id() const override { return bos_; }
  bool adds_bos() const override { return add_bos_; }
  bool adds_eos() const override { return add_eos_; }
  std::string name() const override { return "gguf-spm" + std::to_string(vocab_size()); }
  std::string spec() const override { return spec_; }

 private:
  struct ViewHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // The special tokens of one length: text -> id, and which bytes they can start with.
  struct SpecialsOfLength {
    size_t length = 0;
    std::unordered_map<std::string_view, std::int32_t, ViewHash, std::equal_to<>> ids;
    std::array<bool, 256> first_byte{};
  };

  // Appends the ids of one stretch of text (spaces already escaped) by merging its characters.
  void merge_text(std::string_view text, std::vector<std::int32_t>& ids) const;
  std::int32_t find(std::string_view text) const;

  std::string spec_;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<std::string> decoded_;  // by id: what the token decodes to
  std::unordered_map<std::string_view, std::int32_t, ViewHash, std::equal_to<>> ids_;  // views into tokens_
  std::vector<SpecialsOfLength> user_defined_, all_special_;                           // longest first
  std::array<std::int32_t, 256> byte_ids_{};                                           // -1: no token for that byte
  std::int32_t eos_ = -1, bos_ = -1, unk_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
};

}  // namespace hlm::data
