#pragma once
// Mamba-2 mixer (M), state-spaces/mamba `Mamba2` with one B/C group (docs/model.md, docs/mixers.md):
//   z | xBC | dt = x W_in;   xBC = silu(causal_conv1d_4(xBC) + bias);   x | B | C = xBC
//   dt = softplus(dt + dt_bias);  A = -exp(A_log);  h_t = exp(dt A) h_{t-1} + dt x_t B_t^T;  y = h_t C_t + D x_t
//   out = out_proj(RMSNorm_di(y * silu(z)))   (gate before the norm, eps 1e-5)
// The SSM runs on the scalar-decay kernel (ops/scalar_decay_scan.h) with q = C, k = B (Hk = 1), v = dt x,
// g = dt A. Decoding keeps a constant-size state: the conv's last 3 inputs and h [B, nh, N, P].
#include <vector>

#include "mixers/mixer.h"
#include "ops/causal_conv1d.h"
#include "ops/scalar_decay_scan.h"

namespace hlm {

class Mamba2Mixer final : public Mixer {
 public:
  Mamba2Mixer(const MixerSpec& spec, ParamRegistry& reg);
  char letter() const override { return 'M'; }
  void init_custom(Rng& rng) override;
  void forward(const float* x, float* y, const SeqInfo& s, Arena& arena) override;
  void backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) override;
  ArenaUse arena_use(i64 B, i64 T) const override;
  FlopCount flops_per_token(i64 T) const override;
  std::unique_ptr<MixerState> new_state(i64 B, i64 max_len) const override;
  void step(const float* x, float* y, MixerState& state, i64 B) override;
  void prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) override;

  i64 d_inner() const { return di_; }
  i64 n_heads() const { return nh_; }
  i64 head_dim() const { return P_; }
  i64 d_state() const { return N_; }
  static constexpr i64 kConv = 4;  // conv width
  static constexpr float kNormEps = 1e-5f;  // of the output norm (the Hugging Face export compares it)

 private:
  i64 D_, di_, P_, nh_, N_, chunk_;
  std::array<double, 2> a_range_, dt_range_;  // init ranges of A and dt (layer_types.M)
  i64 off_in_, off_convw_, off_convb_, off_dtb_, off_alog_, off_D_, off_norm_, off_out_;
  i64 Win() const { return 2 * di_ + 2 * N_ + nh_; }  // in_proj rows: z | x | B | C | dt
  // Row stride of the in_proj output and its gradient: Win padded to 16 floats, so every row starts on a cache line
  // (oneDNN's bf16 kernels write 1160-float rows, half of them 32 bytes off a line, 1.2x slower; docs/precision.md).
  i64 pre_stride() const { return (Win() + 15) / 16 * 16; }
  i64 Cc() const { return di_ + 2 * N_; }              // conv channels: x | B | C

  // Arena buffers, listed once per phase: forward, backward and prefill take them from the step's Arena,
  // arena_use() counts the same lists with an ArenaCount (core/arena_count.h). Allocation order is the
  // layout. `span`: the probe's doc_start copy (Mixer::span_buffer). Forward is span_buffer, then run_buffers.
  struct Saved {               // kept by forward for backward
    float* pre = nullptr;      // [B*T, pre_stride] in_proj output (z | xBC before conv | dt before softplus)
    float* dt = nullptr;       // [B*T, nh]  softplus(dt + dt_bias)
    float* g = nullptr;        // [B*T, nh]  dt * A
    float* states = nullptr;   // [B, nh, NC, N, P] chunk-entry states
    float* ys = nullptr;       // [B*T, di]  SSM output incl. D x (before the gate)
    float* rstd = nullptr;     // [B*T]
  };
  struct RunBuffers {          // one run(): the saved buffers, then a temporary freed at temp_mark
    Saved saved;
    std::size_t temp_mark = 0;
    float* xbc = nullptr;      // [B*T, Cc] silu(conv(xBC)) (backward recomputes it from pre: the same bits)
    float* v = nullptr;        // [B*T, di] dt * x, the scan's values (backward recomputes them from dt and x)
    float* yg = nullptr;       // [B*T, di] gated, then normalised y
  };
  struct PrefillBuffers {
    int32_t* span = nullptr;
    float* fin = nullptr;      // [B, nh, N, P] final SSM state, copied into the decoding state after run()
    RunBuffers run;
  };
  struct BackwardBuffers {
    float *yg = nullptr, *nrm = nullptr, *dn = nullptr;  // [B*T, di] each; yg later holds the recomputed v
    float* dpre = nullptr;     // [B*T, pre_stride]
    float* xbc = nullptr;      // [B*T, Cc] the forward's conv output, recomputed
    float* dxbc = nullptr;     // [B*T, Cc]
    float* dv = nullptr;       // [B*T, di]
    float* dg = nullptr;       // [B*T, nh]
    float* part = nullptr;     // [3, B*T, nh] per-token terms of dD, dA, d dt_bias
    float* ws = nullptr;       // the scan's backward workspace
  };
  template <class Alloc> RunBuffers run_buffers(Alloc& arena, i64 B, i64 T) const;
  template <class Alloc> PrefillBuffers prefill_buffers(Alloc& arena, i64 B, i64 T, bool span) const;
  template <class Alloc> BackwardBuffers backward_buffers(Alloc& arena, i64 B, i64 T) const;

  // Forward on x[B, T, D] from (conv_init [B, 3, Cc], ssm_init [B, nh, N, P]; nullptr = zeros) to
  // (conv_fin, ssm_fin; nullptr = not needed; conv_fin may alias conv_init, ssm_fin may not alias ssm_init), in
  // buffers b (kept in saved_ for backward; b.xbc, b.v and b.yg released to b.temp_mark before returning).
  void run(const float* x, float* y, i64 B, i64 T, const int32_t* doc_start, const float* conv_init,
           float* conv_fin, const float* ssm_init, float* ssm_fin, const RunBuffers& b, Arena& arena);
  std::vector<float> decay_rates() const;  // A = -exp(A_log) per head
  // Kernel arguments on this layer's buffers: the conv over the xBC columns of the in_proj rows pre (pre_stride apart);
  // the SSM scan with q = C, k = B from rows xbc [B*T, Cc], v = dt x [B*T, di] and g = dt A [B*T, nh].
  ops::CausalConv1dArgs<float> conv_args(const float* pre, i64 B, i64 T, const int32_t* doc_start,
                                  const float* conv_init) const;
  ops::ScalarDecayArgs<float> scan_shape(i64 B, i64 T) const;  // the scan's sizes only (for buffer sizes)
  ops::ScalarDecayArgs<float> scan_args(const float* xbc, const float* v, const float* g, i64 B, i64 T,
                                 const int32_t* doc_start, const float* ssm_init) const;

  Saved saved_;  // by the last forward, for backward
  const int32_t* ds_ = nullptr;
};

}  // namespace hlm
