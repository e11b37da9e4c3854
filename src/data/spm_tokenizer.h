#pragma once
// SentencePiece tokenizer (libsentencepiece) loaded from a .model file. Encoding is thread-safe.
//
// Text over kEncodePieceBytes is encoded in pieces of about that size, so memory and time stay linear in the
// text (one encode call over a 50 MB line takes gigabytes). A piece ends before a space that follows a
// non-space; where no piece of the vocabulary spans such a place (pieces start at a word: SentencePiece's
// split_by_whitespace) and the model keeps text as it is (no dummy prefix, no folding of whitespace), the
// pieces' tokens are exactly the whole text's. A model without those properties encodes its text whole; a
// stretch of over kEncodePieceBytes without such a space is cut at a character boundary.
#include <cstddef>
#include <memory>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace hlm::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Throws hlm::Error naming the file when it is missing or not a SentencePiece model.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  int vocab_size() const override { return vocab_; }
  int eos_id() const override { return eos_; }
  int bos_id() const override { return bos_; }
  std::string name() const override { return name_; }
  std::string spec() const override { return path_; }
  const std::string& path() const { return path_; }
  // Whether encoding in pieces gives the whole text's tokens (above); false: each text is encoded whole.
  bool encodes_in_pieces() const { return pieces_exact_; }
  static constexpr std::size_t kEncodePieceBytes = std::size_t{256} << 10;

 private:
  std::vector<std::int32_t> encode_whole(std::string_view text) const;
  bool pieces_start_at_words() const;
  bool text_kept_as_is() const;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string path_, name_;
  int vocab_ = 0, eos_ = -1, bos_ = -1;
  bool pieces_exact_ = false;
};

}  // namespace hlm::data
