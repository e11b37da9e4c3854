#pragma once
// Hugging Face interop, the tokenizer side: hybridlm's tokenizers written as the files `transformers`
// reads (tokenizer.json for its fast tokenizer, tokenizer_config.json), and the reverse for folders that
// hold one of those two kinds. docs/hf.md says what is exact and what is not.
//   byte          -> a BPE model over the 256 byte symbols with no merges (byte-level pre-tokenizer), <eos> = 256
//   SentencePiece -> BPE with the model's pieces, merges from piece scores, byte fallback, its whitespace
//                    escaping; the .model is copied as tokenizer.model. Only BPE models with identity
//                    normalization (as `hybridlm tokenizer train` makes) are exported; others are refused.
#include <string>

#include "data/tokenizer.h"

namespace hlm::data {

// Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json (plus tokenizer.model for
// SentencePiece) into out_dir. Throws hlm::Error naming the setting that cannot be expressed.
void write_hf_tokenizer(const Tokenizer& tok, const std::string& out_dir, long model_max_length);

struct HfTokenizerImport {
  std::string spec;    // for load_tokenizer(); empty when the folder's tokenizer is not one hybridlm runs
  std::string reason;  // why spec is empty
  int vocab_size = 0;  // the tokenizer's ids, when spec is set
};

// Recognises a hybridlm byte tokenizer.json, or a SentencePiece tokenizer.model (copied into out_dir).
HfTokenizerImport import_hf_tokenizer(const std::string& hf_dir, const std::string& out_dir);

}  // namespace hlm::data
