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
  i64 saved_floats(i64 B, i64 T) const override;
  i64 scratch_floats(i64 B, i64 T) const override;
  FlopCount flops_per_token(i64 T) const override;
  std::unique_ptr<MixerState> new_state(i64 B, i64 max_len) const override;
  void step(const float* x, float* y, MixerState& state, i64 B) override;
  void prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) override;

  const std::vector<double>& slopes() const { return slopes_; }

 private:
  // The whole forward on x[B, T, D] -> y, from `init` ([B, H, hd, hd] or nullptr) to `fin` (or nullptr);
  // buffers come from `arena` and their pointers are kept in the members below for backward.
  void run(const float* x, float* y, i64 B, i64 T, const int32_t* doc_start, const float* init, float* fin,
           Arena& arena);

  // The scalar-decay scan's arguments on rows act [B*T, 4*H*hd] (q|k|v|gate) with log decays g [B*T, H].
  ops::ScalarDecayArgs<float> scan_args(const float* act, const float* g, i64 B, i64 T, const int32_t* doc_start,
                                 const float* init) const;

  i64 D_, H_, hd_, chunk_;
  i64 off_w_, off_norm_, off_wo_;  // off_w_: q|k|v|output_gate fused [4*H*hd, D]
  std::vector<double> slopes_;
  static constexpr float kNormEps = 1e-6f;
  i64 HK() const { return H_ * hd_; }
  // Saved by forward for backward (arena pointers).
  float *pre_ = nullptr;     // [B*T, 4*H*hd] projections before activation
  float *act_ = nullptr;     // [B*T, 4*H*hd] silu(q|k|v) | sigmoid(gate)
  float *g_ = nullptr;       // [B*T, H] log decay (-s_h)
  float *o_ = nullptr;       // [B*T, H*hd] kernel output
  float *rstd_ = nullptr;    // [B*T] of the output RMSNorm
  float *states_ = nullptr;  // [B, H, NC, hd, hd] chunk-entry states
  const int32_t* ds_ = nullptr;
};

}  // namespace hlm
