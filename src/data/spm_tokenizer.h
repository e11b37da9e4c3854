#pragma once
// SentencePiece tokenizer (libsentencepiece) loaded from a .model file. Encoding is thread-safe.
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

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string path_, name_;
  int vocab_ = 0, eos_ = -1, bos_ = -1;
};

}  // namespace hlm::data
