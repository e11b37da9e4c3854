#include "data/tokenizer.h"

#include "core/error.h"
#include "data/byte_level_bpe.h"
#include "data/byte_tokenizer.h"
#include "data/spm_tokenizer.h"
#include "data/vocab_tokenizer.h"

namespace hlm::data {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (spec.empty())
    fail("tokenizer: empty spec (give \"byte\", a SentencePiece .model or a Hugging Face tokenizer.json)");
  auto ends_with = [&](std::string_view tail) {
    return spec.size() >= tail.size() && spec.compare(spec.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends_with(".gguf.json")) return load_vocab_json_tokenizer(spec);
  if (ends_with(".json"))
    return std::make_unique<ByteLevelBpeTokenizer>(spec);
  return std::make_unique<SentencePieceTokenizer>(spec);
}

}  // namespace hlm::data
