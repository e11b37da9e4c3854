#pragma once
// The mixer contract (docs/model.md, docs/design.md): each layer's sequence mixer owns its parameters
// (registered by name), runs forward on a normalised input [B, T, D] saving what backward needs in the
// step's arena, runs backward (input gradient overwritten, parameter gradients accumulated), counts its
// FLOPs, and decodes one token at a time from a constant-size (or, for full attention, growing) state. A mixer
// is built from its MixerSpec (mixers/mixer_spec.h) and knows nothing else of the model.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "core/arena.h"
#include "core/arena_count.h"
#include "core/params.h"
#include "core/rng.h"
#include "mixers/mixer_spec.h"

namespace hlm {

struct SeqInfo {
  i64 B = 1, T = 1;
  const int32_t* doc_start = nullptr;  // [B*T] or nullptr: one document per row
};

struct FlopCount {
  double matmul = 0;  // 2 * weights per token (forward), projections only
  double core = 0;    // the mixing core's forward FLOPs per token (attention scores, scans)
};

// Arena floats of one layer at shape [B, T], counted from the mixer's own buffer lists by a dry run
// (core/arena_count.h, docs/memory.md): exact, 64-byte rounding included, for the worst case of what the shape
// leaves open (a probe's max span set, documents that let gdn keep its chunk states, a windowed prefill that
// stages a full window of cached keys).
struct ArenaUse {
  i64 saved = 0;            // what forward leaves in the arena for backward
  i64 forward_scratch = 0;  // forward's temporaries on top of `saved`
  i64 backward = 0;         // backward's peak on top of what forward left
  i64 prefill = 0;          // prefill's peak from where it starts
  // Temporaries on top of `saved` that cover all three phases (prefill runs in saved + scratch).
  i64 scratch() const { return std::max({forward_scratch, backward, prefill - saved}); }
};

// A mixer's ArenaUse from its phases' buffer lists, each run on a fresh ArenaCount: `forward` lists forward's
// buffers as forward() does (releasing its temporaries), `backward` and `prefill` theirs.
template <class Forward, class Backward, class Prefill>
ArenaUse count_arena_use(Forward&& forward, Backward&& backward, Prefill&& prefill) {
  ArenaUse u;
  const CountedFloats fwd = count_floats(forward);
  u.saved = fwd.used;
  u.forward_scratch = fwd.peak - fwd.used;
  u.backward = count_floats(backward).peak;
  u.prefill = count_floats(prefill).peak;
  return u;
}

// Per-layer decoding state (KV cache, ring buffer, recurrent state); defined by each mixer.
struct MixerState {
  virtual ~MixerState() = default;
  virtual i64 bytes() const = 0;
};

class Mixer {
 public:
  virtual ~Mixer() = default;
  virtual char letter() const = 0;
  // params, grads: the flat buffers the registry's offsets index (core/params.h).
  void bind(float* params, float* grads, i64 d_model) {
    params_ = params;
    grads_ = grads;
    d_model_ = d_model;
  }

  // Initialises parameters registered with Init::Custom (e.g. Mamba-2's dt_bias, A_log), writing them
  // through init_view().
  virtual void init_custom(Rng& rng) {}

  // x: [B, T, D] (the RMSNorm'd residual stream; kept alive by the caller until backward).
  // y: [B, T, D] overwritten.
  virtual void forward(const float* x, float* y, const SeqInfo& s, Arena& arena) = 0;
  // dy: [B, T, D]; dx: [B, T, D] overwritten. Uses the state saved by the last forward, and may overwrite it
  // (working in place to save memory): one backward per forward.
  virtual void backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) = 0;
  // Arena floats of each phase (ArenaUse), counted from the buffer lists forward, backward and prefill use.
  virtual ArenaUse arena_use(i64 B, i64 T) const = 0;
  // Arena floats forward keeps for backward, and the peak temporaries on top of them (released before
  // returning) over forward, backward and prefill.
  i64 saved_floats(i64 B, i64 T) const { return arena_use(B, T).saved; }
  i64 scratch_floats(i64 B, i64 T) const { return arena_use(B, T).scratch(); }
  // Forward FLOPs per token at context position `pos` averaged over a sequence of length T.
  virtual FlopCount flops_per_token(i64 T) const = 0;

  // Decoding: one token x[B, D] -> y[B, D], updating state. max_len bounds the context (full attention
  // sizes its KV cache by it; SWA and recurrent mixers keep constant-size state whatever it is).
  virtual std::unique_ptr<MixerState> new_state(i64 B, i64 max_len) const = 0;
  virtual void step(const float* x, float* y, MixerState& state, i64 B) = 0;
  // Prefill: x[B, T, D] -> y[B, T, D] continuing from `state` (which may already hold earlier tokens),
  // leaving `state` exactly as T calls of step() would. The default calls step() per token; mixers
  // override it with their training kernels (chunked scans, tiled attention) for speed.
  virtual void prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena);

  // Probe hook: cap how far back this layer sees (0 = no cap). Softmax layers: a window; recurrent
  // layers: state reset every `span` tokens.
  void set_max_span(i64 span) { max_span_ = span; }
  i64 max_span() const { return max_span_; }

 protected:
  // The buffer of span_doc_start [B*T], listed with a recurrent mixer's other arena buffers; `needed`: a span is
  // set (max_span_ > 0; the counting pass always assumes one). nullptr when not needed.
  template <class Alloc>
  static int32_t* span_buffer(Alloc& arena, i64 B, i64 T, bool needed) {
    return needed ? arena.ints(B * T, "span doc_start") : nullptr;
  }
  // doc_start with an extra document start every max_span_ absolute positions (the probe's state reset for
  // recurrent mixers), written into buf (span_buffer); returns doc_start itself when no span is set.
  // pos0: absolute position of t = 0.
  const int32_t* span_doc_start(const int32_t* doc_start, i64 B, i64 T, i64 pos0, int32_t* buf) const;
  // Parameter / gradient pointer from a registry offset (ParamInfo::offset).
  const float* P(i64 offset) const { return params_ + offset; }
  float* G(i64 offset) const { return grads_ + offset; }
  // Writable parameter pointer, for init_custom only: forward, backward and decoding read through P().
  float* init_view(i64 offset) const { return params_ + offset; }
  float* params_ = nullptr;
  float* grads_ = nullptr;
  i64 max_span_ = 0;
  i64 d_model_ = 0;
};

// Creates the mixer of spec.letter and registers its parameters under spec.name_prefix.
std::unique_ptr<Mixer> make_mixer(const MixerSpec& spec, ParamRegistry& reg);

}  // namespace hlm
