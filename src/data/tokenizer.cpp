#include "data/tokenizer.h"

#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "data/spm_tokenizer.h"

namespace hlm::data {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (spec.empty()) fail("tokenizer: empty spec (give \"byte\" or a path to a SentencePiece .model)");
  return std::make_unique<SentencePieceTokenizer>(spec);
}

}  // namespace hlm::data
