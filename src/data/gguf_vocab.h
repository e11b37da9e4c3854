#pragma once
// The tokenizer a GGUF file carries: its `tokenizer.ggml.*` keys read into a TokenizerVocab
// (data/vocab_tokenizer.h), which `hybridlm import` writes into the run folder as a `.gguf.json` dump.
#include "core/gguf.h"
#include "data/vocab_tokenizer.h"

namespace hlm::data {

// Reads every tokenizer.ggml.* key make_vocab_tokenizer understands; a tokenizer.ggml.* key it does not is an
// hlm::Error naming the file and the key (a tokenizer that ignored one would encode differently).
TokenizerVocab read_gguf_vocab(const GgufFile& file);

}  // namespace hlm::data
