#include "data/byte_tokenizer.h"

#include "core/error.h"

namespace hlm::data {

std::vector<std::int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::int32_t id = ids[i];
    HLM_CHECK(id >= 0 && id < kVocab, "ByteTokenizer.decode: id {} at position {} outside [0, {})", id, i, kVocab);
    if (id < 256) out.push_back(static_cast<char>(id));
  }
  return out;
}

}  // namespace hlm::data
