#pragma once
// The decode loop: prefill a prompt (in pieces of `prefill_chunk` tokens, so memory stays bounded for
// long prompts), then sample one token at a time with each layer's cache (full KV, SWA ring buffer,
// recurrent state).
#include <functional>
#include <vector>

#include "infer/sampler.h"
#include "model/model.h"

namespace hlm {

struct GenerateConfig {
  i64 max_new_tokens = 64;
  // Prompt tokens per prefill piece: activations are sized for one piece, so memory of SWA and recurrent
  // models stays flat as the prompt grows (docs/inference.md). 0 = the whole prompt at once.
  i64 prefill_chunk = 1024;
  // OpenMP threads while decoding (prefill uses the caller's setting); 0 = the caller's. One token is a
  // chain of memory-bound GEMVs (~35 per token for the bench model): split over threads they gain little,
  // and on a shared machine each OpenMP barrier can cost a scheduler slice (measured 3.6 vs 114 tok/s with
  // 2 vs 1 threads under load 8 on 2 cores; docs/inference.md).
  int decode_threads = 1;
  int32_t stop_token = -1;  // stop after emitting this token (e.g. <eos>); -1 = none
  SamplerConfig sampler;
};

struct GenerateStats {
  i64 prompt_tokens = 0, new_tokens = 0;
  double prefill_s = 0, decode_s = 0;
  i64 state_bytes = 0;  // decode state size at the end
};

// Generates for one prompt (B = 1). on_token is called for each new token (streaming); may be empty.
std::vector<int32_t> generate(Model& model, const std::vector<int32_t>& prompt, const GenerateConfig& cfg,
                              GenerateStats* stats = nullptr,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace hlm
