#pragma once
// The decoder: embedding -> blocks (x += mixer(norm(x)); x += mlp(norm(x)), or with sandwich_norm
// x += norm(mixer(norm(x))); x += norm(mlp(norm(x)))) -> final norm -> LM head (its own matrix or the
// embedding's), with cross-entropy fused into the head. One flat parameter buffer (core/params.h), one activation
// arena sized from (B, T) up front, forward saves what backward needs.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/params.h"
#include "mixers/mixer.h"
#include "model/config.h"
#include "model/layer_spec.h"

namespace hlm {

struct ModelFlops {
  double matmul_params = 0;  // weights in all matmuls incl. LM head (not the embedding)
  double train_per_token = 0, forward_per_token = 0;
  std::vector<std::pair<std::string, double>> per_layer_type;  // forward FLOPs/token by kind
};

// Per-layer decoding state of a whole model (infer/ builds the generation loop on it).
struct DecodeState {
  std::vector<std::unique_ptr<MixerState>> layers;
  i64 B = 0, pos = 0, max_len = 0;
  i64 bytes() const {
    i64 n = 0;
    for (auto& l : layers) n += l->bytes();
    return n;
  }
};

// Floats of the activation arena for training batches of [B, T] (forward saves + backward temporaries); the
// memory estimate (model/memory_estimate.h) uses it before any model is built, with one mixer per pattern
// position standing for `(*repeats)[i]` layers each. With `recompute`, forward keeps only each block's input
// and backward recomputes one block at a time (Model::set_recompute).
// bf16: the arena of a bf16 step (ops::precision()), whose MLP backward keeps a bf16 operand beside d act.
i64 training_arena_floats(const ModelConfig& cfg, const std::vector<std::unique_ptr<Mixer>>& mixers, i64 B, i64 T,
                          const std::vector<i64>* repeats = nullptr, bool recompute = false, bool bf16 = false);

class Model {
 public:
  explicit Model(const ModelConfig& cfg);
  const ModelConfig& config() const { return cfg_; }
  ParamRegistry& registry() { return reg_; }
  const ParamRegistry& registry() const { return reg_; }
  float* params() { return store_.data.data(); }
  const float* params() const { return store_.data.data(); }
  float* grads() { return store_.grad.data(); }
  i64 param_floats() const { return reg_.total_floats(); }
  i64 num_params() const { return reg_.count(); }

  void init(std::uint64_t seed);
  void zero_grad();

  // Sizes the activation arena for batches of [B, T] (throws when T > max_seq_len unless allow_longer).
  void plan(i64 B, i64 T, bool allow_longer = false);
  // Forward; returns the SUM of token losses over targets >= 0 (n_counted set to their count).
  // Saves activations for backward. token_loss [B*T] optional.
  double forward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_start, i64 B, i64 T,
                 i64* n_counted = nullptr, float* token_loss = nullptr);
  // Backward of (sum loss) * grad_scale; parameter gradients accumulate. Once per forward: it overwrites some of the
  // saved activations as it goes (SwiGLU's gate|up, Lightning's projections; docs/memory.md).
  void backward(float grad_scale);
  // Training's step: forward, then backward(grad_scale), with the LM head's logits made once for both
  // (ops::lm_head_ce_forward_backward; backward alone makes them again). Returns forward's loss sum.
  double forward_backward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_start, i64 B, i64 T,
                          float grad_scale, i64* n_counted = nullptr);
  // Logits for every position [B*T, V] (evaluation/generation); uses the arena like forward.
  void forward_logits(const int32_t* inputs, const int32_t* doc_start, i64 B, i64 T, float* logits);

  // Decoding. new_decode_state: B rows, contexts up to max_len tokens.
  DecodeState new_decode_state(i64 B, i64 max_len) const;
  // tokens[B] (one per row) -> logits[B, V]; advances every layer's state by one token.
  void decode_step(const int32_t* tokens, DecodeState& st, float* logits);
  // tokens[B, T] continuing from st; writes logits of each row's last token [B, V] (nullptr: skip) and,
  // if all_logits != nullptr, of every position [B*T, V]. Any piece length from any state (every mixer
  // continues from its cache); activations are sized for the piece, so callers prefill long prompts in
  // pieces (infer/generator.h) and memory stays bounded.
  void prefill(const int32_t* tokens, i64 B, i64 T, DecodeState& st, float* last_logits,
               float* all_logits = nullptr);
  // Bytes of the prefill/decode activation arena: its capacity (sized for the largest piece so far) and the
  // most it held. Chunked prefill keeps both at the chunk's size whatever the prompt length.
  i64 infer_arena_bytes() const { return static_cast<i64>(infer_arena_.capacity()); }
  i64 infer_arena_high_water() const { return static_cast<i64>(infer_arena_.high_water()); }

  // --check-numerics: after each op, stop at the first non-finite tensor and name it.
  void set_check_numerics(bool on) { check_numerics_ = on; }
  // --recompute: activation recomputation per block (docs/model.md). Forward keeps only the residual stream
  // entering each block; backward reruns one block's forward from it just before that block's backward.
  // Activation memory then grows with one block instead of all of them, for one more forward per step;
  // losses and gradients are bitwise those of the plain path. Takes effect at the next plan().
  void set_recompute(bool on);
  bool recompute() const { return recompute_; }
  ModelFlops flops(i64 T) const;
  Mixer& mixer(i64 layer) { return *mixers_[static_cast<size_t>(layer)]; }
  i64 arena_bytes() const { return static_cast<i64>(arena_.capacity()); }
  i64 arena_high_water() const { return static_cast<i64>(arena_.high_water()); }

 private:
  void forward_hidden(const int32_t* inputs, const int32_t* doc_start, i64 B, i64 T);
  // Copies the targets into the arena (checking each against the vocabulary) and allocates lse_.
  void set_targets(const int32_t* targets, i64* n_counted);
  // Backward's arena buffers [B*T, d_model]: d residual, d of the final norm's output, scratch.
  struct BackwardBuffers {
    float *dx, *dn, *dtmp;
  };
  // The three, from the arena (the caller releases them).
  BackwardBuffers backward_buffers();
  // Backward from the final norm's output gradient (in g.dn) down to the embeddings.
  void backward_below_head(const BackwardBuffers& g);
  // Block l's forward from x (its input) into out (allocated from the arena when nullptr); fills acts_[l] and
  // the mixer's saved state. Returns out.
  float* block_forward(i64 l, float* x, float* out, const SeqInfo& s);
  // out = RMSNorm(x) with the weights at w_offset, as block_forward computed it (bitwise).
  void recompute_norm(const float* x, i64 w_offset, float* rstd, float* out);
  // The MLP's backward from d output (dy) to d norm2(h) (into dn), its weight gradients accumulated; da is
  // N*d_ff floats of scratch, dtmp N*d_model.
  void mlp_backward(i64 l, const float* dy, float* da, float* dn, float* dtmp);
  void mlp_backward_bf16(i64 l, const float* dy, float* da, float* dn, float* dtmp);
  void check(const char* what, i64 layer, const float* p, i64 n) const;

  ModelConfig cfg_;
  ParamRegistry reg_;
  ParamStore store_;
  std::vector<std::unique_ptr<Mixer>> mixers_;
  struct LayerOffsets {
    i64 ln1, ln2, w_gate_up, w_down;
    i64 ln_mixer_out = -1, ln_mlp_out = -1;  // sandwich_norm: the norms of the mixer's and the MLP's outputs
  };
  std::vector<LayerOffsets> lo_;
  i64 off_embed_ = 0, off_norm_ = 0, off_head_ = 0;

  Arena arena_, infer_arena_;
  i64 plan_B_ = 0, plan_T_ = 0;
  bool plan_bf16_ = false;  // the precision the arena was sized for
  bool check_numerics_ = false, recompute_ = false;
  // Saved activations of the last forward.
  struct LayerActs {
    // The norm outputs and the SwiGLU product are recomputed in backward (from x / h with rstd, from gate|up).
    float *x, *rstd1, *h, *rstd2;
    float* gu;                // the MLP's gate|up [N, 2F] (fp32 step)
    std::uint16_t* gu_bf16;   // the same, rounded to bf16 (bf16 step)
    // sandwich_norm: the mixer's and the MLP's outputs [N, D] before their norms, and those norms' 1/rms.
    float *mixer_out = nullptr, *rstd_mixer_out = nullptr, *mlp_out = nullptr, *rstd_mlp_out = nullptr;
  };
  std::vector<LayerActs> acts_;
  float* norm_buf_ = nullptr;  // [N, D]: the current RMSNorm output, shared by all blocks and then the final norm
  float *x_final_ = nullptr, *n_final_ = nullptr, *rstd_final_ = nullptr, *lse_ = nullptr;
  const int32_t *inputs_ = nullptr, *targets_ = nullptr, *doc_start_ = nullptr;
  i64 B_ = 0, T_ = 0;
};

}  // namespace hlm
