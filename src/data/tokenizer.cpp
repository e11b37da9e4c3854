#include "data/tokenizer.h"

#include "core/error.h"
#include "data/byte_level_bpe.h"
#include "data/byte_tokenizer.h"
#include "data/spm_tokenizer.h"

namespace hlm::data {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (spec.empty())
    fail("tokenizer: empty spec (give \"byte\", a SentencePiece .model or a Hugging Face tokenizer.json)");
  if (spec.size() >= 5 && spec.compare(spec.size() - 5, 5, ".json") == 0)
    return std::make_unique<ByteLevelBpeTokenizer>(spec);
  return std::make_unique<SentencePieceTokenizer>(spec);
}

}  // namespace hlm::data
