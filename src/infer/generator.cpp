#include "infer/generator.h"

#include <omp.h>

#include "core/error.h"
#include "core/timer.h"

namespace hlm {

std::vector<int32_t> generate(Model& model, const std::vector<int32_t>& prompt, const GenerateConfig& cfg,
                              GenerateStats* stats, const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) fail("generate: the prompt is empty (it must have at least one token)");
  const i64 V = model.config().vocab_size;
  const i64 total = static_cast<i64>(prompt.size()) + cfg.max_new_tokens;
  DecodeState st = model.new_decode_state(1, total);
  std::vector<float> logits(static_cast<size_t>(V));
  Timer t;
  const i64 P = static_cast<i64>(prompt.size());
  const i64 chunk = cfg.prefill_chunk > 0 ? cfg.prefill_chunk : P;
  for (i64 b = 0; b < P; b += chunk) {
    const i64 n = std::min(chunk, P - b);
    model.prefill(prompt.data() + b, 1, n, st, logits.data());
  }
  const double prefill_s = t.seconds();
  t.reset();
  // Decoding with its own thread count, restored on every exit path.
  struct Threads {
    int old = omp_get_max_threads();
    explicit Threads(int n) {
      if (n > 0) omp_set_num_threads(n);
    }
    ~Threads() { omp_set_num_threads(old); }
  } threads(cfg.decode_threads);
  Sampler sampler(cfg.sampler);
  std::vector<int32_t> out;
  for (i64 i = 0; i < cfg.max_new_tokens; ++i) {
    int32_t tok = sampler.sample(logits.data(), V);
    out.push_back(tok);
    if (on_token) on_token(tok);
    if (tok == cfg.stop_token || i + 1 == cfg.max_new_tokens) break;
    model.decode_step(&tok, st, logits.data());
  }
  if (stats) {
    stats->prompt_tokens = P;
    stats->new_tokens = static_cast<i64>(out.size());
    stats->prefill_s = prefill_s;
    stats->decode_s = t.seconds();
    stats->state_bytes = st.bytes();
  }
  return out;
}

}  // namespace hlm
