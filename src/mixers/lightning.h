#pragma once
// Lightning Attention mixer (L), MiniMax-01 style (docs/model.md, docs/mixers.md):
//   q, k, v = silu(x Wq), silu(x Wk), silu(x Wv);   S_t = lambda_h S_{t-1} + k_t v_t^T;   o_t = S_t^T q_t
//   y = o_proj(RMSNorm_{H*hd}(o) * sigmoid(x W_gate))
// with a constant per-head decay lambda_h = exp(-s_h) from the MiniMax slopes and the layer factor
// ("minimax" convention). q|k|v|output_gate are registered back to back and run as one [4*H*hd, D] matmul.
// Training and prefill use the chunked scalar-decay kernel (ops/scalar_decay_scan.h); decoding keeps a
// constant-size state [B, H, hd, hd].
#include <vector>

#include "mixers/mixer.h"
#include "ops/scalar_decay_scan.h"

namespace hlm {

// MiniMax slopes s_h = (2^(-8/H))^(h+1) * (1 - l/(L-1+1e-5) + 1e-5), h = 0..H-1 (decay lambda_h = exp(-s_h)).
std::vector<double> lightning_minimax_slopes(i64 n_heads, i64 layer, i64 n_layers);

class LightningMixer final : public Mixer {
 public:
  LightningMixer(const MixerSpec& spec, ParamRegistry& reg);
  char letter() const override { return 'L'; }
  void forward(const float* x, float* y, const SeqInfo& s, Arena& arena) override;
  void backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) override;
  ArenaUse arena_use(i64 B, i64 T) const override;
  FlopCount flops_per_token(i64 T) const override;
  std::unique_ptr<MixerState> new_state(i64 B, i64 max_len) const override;
  void step(const float* x, float* y, MixerState& state, i64 B) override;
  void prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) override;

  const std::vector<double>& slopes() const { return slopes_; }

 private:
  // Arena buffers, listed once per phase: forward, backward and prefill take them from the step's Arena,
  // arena_use() counts the same lists with an ArenaCount (core/arena_count.h). Allocation order is the
  // layout. `span`: the probe's doc_start copy (Mixer::span_buffer). Forward is span_buffer, then run_buffers.
  struct Saved {               // kept by forward for backward
    float* pre = nullptr;      // [B*T, 4*H*hd] projections before activation
    float* g = nullptr;        // [B*T, H] log decay (-s_h)
    float* o = nullptr;        // [B*T, H*hd] kernel output
    float* rstd = nullptr;     // [B*T] of the output RMSNorm
  };
  struct RunBuffers {          // one run(): the saved buffers, then temporaries freed at temp_mark
    Saved saved;
    std::size_t temp_mark = 0;
    float* act = nullptr;      // [B*T, 4*H*hd] silu(q|k|v) | sigmoid(gate) (backward recomputes it from pre)
    float* states = nullptr;   // [B, H, NC, hd, hd] chunk-entry states (backward recomputes them: one cheap pass)
    float* u = nullptr;        // [B*T, H*hd] RMSNorm(o) * sigmoid(gate)
  };
  struct PrefillBuffers {
    int32_t* span = nullptr;
    float* fin = nullptr;      // [B, H, hd, hd] final state, copied into the decoding state after run()
    RunBuffers run;
  };
  // Backward works mostly in place on what forward saved, which it consumes (one backward per forward): the gate's
  // sigmoid, then its gradient, over pre's gate columns; d o over o; the final projection gradient over pre. Its
  // own buffers: the recomputed q | k | v activations, then on top by turns the output side (nrm, u, du) and the
  // scan's (dq | dk | dv, its workspace).
  struct BackwardBuffers {
    float* qkv = nullptr;      // [B*T, 3*H*hd] silu(q | k | v), recomputed
    std::size_t scan_mark = 0;
    float *nrm = nullptr, *u = nullptr, *du = nullptr;  // [B*T, H*hd] each (output side)
  };
  struct ScanBuffers {         // at scan_mark
    float* dqkv = nullptr;     // [B*T, 3*H*hd]
    float* dg = nullptr;       // [B*T, H] (unused: the decay is constant)
    float* ws = nullptr;       // the scan's backward workspace: dS per chunk and the recomputed chunk states
  };
  template <class Alloc> RunBuffers run_buffers(Alloc& arena, i64 B, i64 T) const;
  template <class Alloc> PrefillBuffers prefill_buffers(Alloc& arena, i64 B, i64 T, bool span) const;
  template <class Alloc> BackwardBuffers backward_buffers(Alloc& arena, i64 B, i64 T) const;
  template <class Alloc> ScanBuffers scan_buffers(Alloc& arena, i64 B, i64 T) const;

  // The whole forward on x[B, T, D] -> y, from `init` ([B, H, hd, hd] or nullptr) to `fin` (or nullptr), in
  // buffers b (kept in saved_ for backward; b.act, b.states and b.u released to b.temp_mark before returning).
  void run(const float* x, float* y, i64 B, i64 T, const int32_t* doc_start, const float* init, float* fin,
           const RunBuffers& b, Arena& arena);

  // The scalar-decay scan's sizes (what its buffer sizes depend on), and its arguments on activation rows starting
  // q | k | v (forward: [B*T, 4*H*hd] with the gate; backward: [B*T, 3*H*hd]) with log decays g [B*T, H].
  ops::ScalarDecayArgs<float> scan_shape(i64 B, i64 T) const;
  ops::ScalarDecayArgs<float> scan_args(const float* act, i64 stride, const float* g, i64 B, i64 T,
                                        const int32_t* doc_start, const float* init) const;

  i64 D_, H_, hd_, chunk_;
  i64 off_w_, off_norm_, off_wo_;  // off_w_: q|k|v|output_gate fused [4*H*hd, D]
  std::vector<double> slopes_;
  static constexpr float kNormEps = 1e-6f;
  i64 HK() const { return H_ * hd_; }
  Saved saved_;  // by the last forward, for backward
  const int32_t* ds_ = nullptr;
};

}  // namespace hlm
