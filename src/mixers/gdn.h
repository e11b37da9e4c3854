#pragma once
// Gated DeltaNet mixer (G), flash-linear-attention `GatedDeltaNet` with K = V = head_dim (docs/model.md,
// docs/gdn_mixer.md):
//   q|k|v|gp|b|a = x W   (one matmul over the adjacent q_proj|k_proj|v_proj|g_proj|b_proj|a_proj)
//   q, k, v = silu(causal_conv1d_4(.))   (three depthwise convs, no bias, run as one over 3*H*hd channels)
//   q = l2norm(q) / sqrt(hd),  k = l2norm(k)   (per head, eps 1e-6)
//   beta = sigmoid(b),  g = -exp(A_log) * softplus(a + dt_bias)
//   o = gated delta rule (ops/gated_delta.h, chunked)
//   out = o_proj(RMSNorm_hd per head(o) * silu(gp))   (o_norm, eps 1e-5; norm before the gate)
// Decoding keeps a constant-size state: the convs' last 3 inputs [B, 3, 3*H*hd] and S [B, H, hd, hd].
#include "mixers/mixer.h"
#include "ops/causal_conv1d.h"
#include "ops/gated_delta.h"

namespace hlm {

class GatedDeltaNetMixer final : public Mixer {
 public:
  GatedDeltaNetMixer(const MixerSpec& spec, ParamRegistry& reg);
  char letter() const override { return 'G'; }
  void init_custom(Rng& rng) override;
  void forward(const float* x, float* y, const SeqInfo& s, Arena& arena) override;
  void backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) override;
  ArenaUse arena_use(i64 B, i64 T) const override;
  FlopCount flops_per_token(i64 T) const override;
  std::unique_ptr<MixerState> new_state(i64 B, i64 max_len) const override;
  void step(const float* x, float* y, MixerState& state, i64 B) override;
  void prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) override;

  i64 n_heads() const { return H_; }
  i64 head_dim() const { return K_; }
  static constexpr i64 kConv = 4;            // conv width
  static constexpr float kNormEps = 1e-5f;   // o_norm (the Hugging Face export compares it)

 private:
  static constexpr float kL2Eps = 1e-6f;     // q, k L2 norm
  i64 D_, H_, K_, chunk_;
  std::array<double, 2> a_range_, dt_range_;  // init ranges of A and dt (layer_types.G)
  i64 off_w_, off_conv_, off_alog_, off_dtb_, off_onorm_, off_wo_;
  i64 HK() const { return H_ * K_; }
  i64 Wp() const { return 4 * H_ * K_ + 2 * H_; }  // fused projection width: q | k | v | gp | b | a
  // Row stride of the projection output and its gradient: Wp padded to 16 floats, so every row starts on a cache
  // line (oneDNN's bf16 kernels write rows that start off a line up to 1.2x slower; docs/precision.md).
  i64 proj_stride() const { return (Wp() + 15) / 16 * 16; }
  i64 chunk_state_budget(i64 B, i64 T) const;      // floats reserved for the saved chunk-entry states
  // Floats of chunk-entry states forward keeps for documents doc_start: all of them when they fit the budget
  // (always without documents), else 0 (backward recomputes them).
  i64 chunk_states_kept(i64 B, i64 T, const int32_t* doc_start) const;
  // Kernel arguments on this layer's buffers: the three depthwise convs (one over 3HK channels) reading the
  // q|k|v columns of the fused projection rows proj [B*T, proj_stride]; the gated delta rule on rows qkv [B*T, 3HK]
  // with gates g, beta [B*T, H] (delta_shape: its sizes and documents only, for buffer sizes), and its
  // gradients laid out the same way (dq | dk | dv in rows dqkv [B*T, 3HK]; dg, dbeta [B*T, H]). Initial
  // states nullptr = zeros.
  ops::CausalConv1dArgs<float> conv_args(const float* proj, i64 B, i64 T, const int32_t* doc_start,
                                  const float* conv_init) const;
  ops::GatedDeltaArgs<float> delta_shape(i64 B, i64 T, const int32_t* doc_start) const;
  ops::GatedDeltaArgs<float> delta_args(const float* qkv, const float* g, const float* beta, i64 B, i64 T,
                                        const int32_t* doc_start, const float* S_init) const;
  ops::GatedDeltaGrads<float> delta_grads(float* dqkv, float* dg, float* dbeta) const;
  // In place on rows qkv [N, 3HK]: q = l2norm(q) / sqrt(K), k = l2norm(k), per head; 1/norms into rq, rk [N, H].
  void qk_l2norm_forward(float* qkv, float* rq, float* rk, i64 N) const;

  // Arena buffers, listed once per phase: forward, backward and prefill take them from the step's Arena,
  // arena_use() counts the same lists with an ArenaCount (core/arena_count.h). Allocation order is the
  // layout. `span`: the probe's doc_start copy (Mixer::span_buffer); `chunk_states`: floats of chunk-entry
  // states kept (0 = none). Forward is span_buffer, then run_buffers (sized by the documents the span gives).
  struct Saved {             // kept by forward for backward
    float* proj = nullptr;   // [B*T, Wp]   x W: q | k | v before the conv, gp, b, a before their activations
    float* qkv = nullptr;    // [B*T, 3HK]  q (normalised, scaled) | k (normalised) | v (conv + silu)
    float* rq = nullptr;     // [B*T, H]    1/sqrt(sum q^2 + eps) of the conv output
    float* rk = nullptr;     // [B*T, H]
    float* g = nullptr;      // [B*T, H]    log-decay
    float* beta = nullptr;   // [B*T, H]
    float* cs = nullptr;     // [B, H, nseg, K, K] chunk-entry states, or nullptr (backward recomputes them)
    float* o = nullptr;      // [B*T, H*K]  gated delta output (before o_norm)
    float* orstd = nullptr;  // [B*T, H]    o_norm's 1/rms
  };
  struct RunBuffers {        // one run(): the saved buffers, then a temporary freed at temp_mark
    Saved saved;
    std::size_t temp_mark = 0;
    float* z = nullptr;      // [B*T, HK] the gated norm's output
  };
  struct PrefillBuffers {
    int32_t* span = nullptr;
    float* S0 = nullptr;     // [B, H, K, K] private copy of the initial state (the kernel writes the final one)
    RunBuffers run;
  };
  struct BackwardBuffers {
    float* buf = nullptr;    // [B*T, HK] z, then d o
    float* dz = nullptr;     // [B*T, HK]
    float* dproj = nullptr;  // [B*T, Wp]
    float* dqkv = nullptr;   // [B*T, 3HK]
    float* dg = nullptr;     // [B*T, H]
    float* dbeta = nullptr;  // [B*T, H]
    double* gate_terms = nullptr;  // [2, B*T, H] the gate gradients' per-token terms, summed in token order
  };
  template <class Alloc> RunBuffers run_buffers(Alloc& arena, i64 B, i64 T, i64 chunk_states) const;
  template <class Alloc> PrefillBuffers prefill_buffers(Alloc& arena, i64 B, i64 T, bool span) const;
  template <class Alloc> BackwardBuffers backward_buffers(Alloc& arena, i64 B, i64 T) const;

  // Forward of x[B, T, D] from (conv_init [B, 3, 3HK], S_init [B, H, K, K]; nullptr = zeros) to (conv_fin,
  // S_fin; nullptr = not needed; either may alias its init), in buffers b (kept in saved_ for backward, with
  // the chunk-entry states when b has room for them; b.z released to b.temp_mark before returning).
  void run(const float* x, float* y, i64 B, i64 T, const int32_t* doc_start, const float* conv_init, float* conv_fin,
           const float* S_init, float* S_fin, const RunBuffers& b, Arena& arena);

  Saved saved_;  // by the last forward, for backward
  const int32_t* ds_ = nullptr;
};

}  // namespace hlm
