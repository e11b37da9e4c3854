#pragma once
// Byte-level tokenizer: needs no training, never fails on any input (UTF-8 or not).
#include "data/tokenizer.h"

namespace hlm::data {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int kEos = 256;
  static constexpr int kVocab = 257;

  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  int vocab_size() const override { return kVocab; }
  int eos_id() const override { return kEos; }
  int bos_id() const override { return -1; }
  std::string name() const override { return "byte"; }
  std::string spec() const override { return "byte"; }
};

}  // namespace hlm::data
