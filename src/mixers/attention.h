#pragma once
// Softmax attention mixer (F = full causal, S = sliding window): q/k/v projections (one fused matmul),
// optional per-head QK RMSNorm, RoPE or NoPE, tiled flash attention with GQA, output projection.
#include <vector>

#include "mixers/mixer.h"
#include "ops/attention.h"
#include "ops/rope.h"

namespace hlm {

// Probe recorder for decoding (B = 1): per head, the absolute position of the most-attended key at the
// last step, and optionally every step's attention probabilities over absolute positions.
struct AttentionRecord {
  bool keep_probs = false;
  std::vector<i64> top1;                        // [H] absolute position, -1 before any step
  std::vector<std::vector<std::vector<float>>> probs;  // [step][head][position 0..pos]
};

class AttentionMixer final : public Mixer {
 public:
  AttentionMixer(const MixerSpec& spec, ParamRegistry& reg);
  char letter() const override { return letter_; }
  void forward(const float* x, float* y, const SeqInfo& s, Arena& arena) override;
  void backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) override;
  ArenaUse arena_use(i64 B, i64 T) const override;
  FlopCount flops_per_token(i64 T) const override;
  std::unique_ptr<MixerState> new_state(i64 B, i64 max_len) const override;
  void step(const float* x, float* y, MixerState& state, i64 B) override;
  // From any cache state: the tiled kernel with the chunk's queries over the cached keys plus the chunk's
  // (full: the cache in place; window: the last W-1 cached entries staged in order), RoPE at true positions.
  void prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) override;
  // Probes: record attention during step() (nullptr = off).
  void set_record(AttentionRecord* r) { record_ = r; }
  i64 n_heads() const { return H_; }

  i64 window() const { return window_; }
  i64 effective_window() const;  // window combined with the probe's max span (0 = full)

 private:
  char letter_;
  i64 D_, H_, Hkv_, hd_, window_;
  bool rope_, qk_norm_;
  float norm_eps_ = 1e-6f;
  float scale_ = 0;  // the scores' scale: query_pre_attn_scalar^-1/2, or 0 for head_dim^-1/2
  i64 off_wqkv_, off_wo_, off_qn_ = -1, off_kn_ = -1;
  ops::RopeTable rope_tab_;
  double rope_theta_ = 10000.0;
  void ensure_rope(i64 T);  // grows the table for contexts beyond max_seq_len (extrapolation)
  // In place on fused q|k|v rows [B, T, W3]: per-head QK RMSNorm (rstd [B*T, H + Hkv] saved) and RoPE at
  // positions t (pos0 < 0: training) or pos0 + t (decoding; pos_buf: B*T ints of scratch).
  void norm_and_rope(float* qkv, float* rstd, i64 B, i64 T, i64 pos0, int32_t* pos_buf);
  // The training-length table, or rows for positions pos0 .. pos0+n-1 when they go past it.
  const ops::RopeTable& rope_rows(i64 pos0, i64 n);
  ops::RopeTable rope_rows_;
  // Arena buffers, listed once per phase: forward, backward and prefill take them from the step's Arena,
  // arena_use() counts the same lists with an ArenaCount (core/arena_count.h). Allocation order is the
  // layout.
  // With QK norm, forward keeps the projection's q | k | v (before the norm, which its backward reads) and runs
  // the kernel on a normed copy that it frees; backward reruns the norm and RoPE on another copy (the same op on
  // the same data: the same bits). That keeps 3 rather than 5 rows of (H + Hkv) hd-ish floats per token.
  struct Saved {                    // kept by forward for backward
    float* qkv = nullptr;           // [B*T, qkv_width()] q | k | v: after RoPE, or (qk_norm) before the QK norm
    float* qk_rstd = nullptr;       // [B*T, H + Hkv] the QK norm's 1/rms (qk_norm only)
    float* o = nullptr;             // [B*T, H*hd]
    float* lse = nullptr;           // [B, H, T] log-sum-exp of the scores
  };
  struct ForwardBuffers {           // the saved buffers, then (qk_norm) a temporary freed at temp_mark
    Saved saved;
    std::size_t temp_mark = 0;
    float* qkv_normed = nullptr;    // [B*T, qkv_width()] after QK norm and RoPE (qk_norm only)
  };
  struct BackwardBuffers {
    float* d_o = nullptr;           // [B*T, H*hd]
    float* dqkv = nullptr;          // [B*T, qkv_width()]
    float* qkv_normed = nullptr;    // [B*T, qkv_width()] recomputed (qk_norm only)
  };
  struct PrefillBuffers {
    float* qkv = nullptr;           // [B*T, qkv_width()]
    float* rstd = nullptr;          // [B*T, H + Hkv] (qk_norm only)
    int32_t* pos = nullptr;         // [B*T] RoPE positions
    float* o = nullptr;             // [B*T, H*hd]
    float* lse = nullptr;           // [B, H, T]
    float *ks = nullptr, *vs = nullptr;  // [B, Tk, Hkv*hd] staged keys, values (window layers: Tk > 0)
  };
  template <class Alloc> ForwardBuffers forward_buffers(Alloc& arena, i64 B, i64 T) const;
  // QK norm: the kernel's q | k | v, normed and RoPE'd from the saved projection into `copy` (sv.qk_rstd written;
  // in backward, with the values forward wrote).
  float* normed_copy(const Saved& sv, float* copy, i64 B, i64 T);
  template <class Alloc> BackwardBuffers backward_buffers(Alloc& arena, i64 B, i64 T) const;
  // Tk: keys a windowed prefill attends over (the cached ones it stages, then the chunk's); 0 = full attention.
  template <class Alloc> PrefillBuffers prefill_buffers(Alloc& arena, i64 B, i64 T, i64 Tk) const;
  Saved saved_;  // by the last forward, for backward
  i64 qkv_width() const { return (H_ + 2 * Hkv_) * hd_; }
  // Kernel arguments for q | k | v in the fused rows of qkv [B, T, qkv_width()].
  ops::AttentionArgs attention_args(const float* qkv, i64 B, i64 T, const int32_t* doc_start) const;
  AttentionRecord* record_ = nullptr;
};

}  // namespace hlm
