#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/add.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/gated_unit.h"
#include "ops/matmul.h"
#include "ops/matmul_bf16.h"
#include "ops/precision.h"
#include "ops/rmsnorm.h"
#include "ops/transpose.h"

namespace hlm {

namespace {
bool bf16_step() { return ops::precision() == ops::Precision::bf16; }
i64 bf16_floats(i64 n) { return (n + 1) / 2; }  // floats of arena that hold n bf16 values

// The MLP's gated unit (ops/gated_unit.h) for the config's activation.
void gated_forward(MlpActivation a, const float* gu, float* h, i64 N, i64 F) {
  a == MlpActivation::geglu_tanh ? ops::geglu_forward(gu, h, N, F) : ops::swiglu_forward(gu, h, N, F);
}
void gated_forward_bf16(MlpActivation a, const ops::bf16* gu, ops::bf16* h, i64 N, i64 F) {
  a == MlpActivation::geglu_tanh ? ops::geglu_forward_bf16(gu, h, N, F) : ops::swiglu_forward_bf16(gu, h, N, F);
}
void gated_backward(MlpActivation a, const float* gu, const float* dh, float* dgu, i64 N, i64 F, float* h) {
  a == MlpActivation::geglu_tanh ? ops::geglu_backward(gu, dh, dgu, N, F, h)
                                 : ops::swiglu_backward(gu, dh, dgu, N, F, h);
}
void gated_backward_bf16(MlpActivation a, const ops::bf16* gu, const float* dh, ops::bf16* dgu, i64 N, i64 F,
                         ops::bf16* h) {
  a == MlpActivation::geglu_tanh ? ops::geglu_backward_bf16(gu, dh, dgu, N, F, h)
                                 : ops::swiglu_backward_bf16(gu, dh, dgu, N, F, h);
}
}  // namespace

Model::Model(const ModelConfig& cfg) : cfg_(cfg) {
  const i64 D = cfg.d_model, F = cfg.d_ff, V = cfg.vocab_size;
  const double out_std = residual_out_init_std(cfg);
  off_embed_ = reg_.info(reg_.add("model.embed_tokens.weight", {V, D}, Init::Normal, kWeightInitStd, 0, false)).offset;
  for (i64 l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerOffsets o;
    auto norm = [&](const char* name) { return reg_.info(reg_.add(p + name, {D}, Init::Ones, 0, 0, false)).offset; };
    o.ln1 = norm("input_layernorm.weight");
    mixers_.push_back(make_mixer(cfg, l, reg_));
    // Gemma's names with sandwich norms (post_attention_layernorm is then the mixer output's norm), Llama's without.
    if (cfg.sandwich_norm) o.ln_mixer_out = norm("post_attention_layernorm.weight");
    o.ln2 = norm(cfg.sandwich_norm ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight");
    // gate_proj then up_proj back to back: one [2F, D] matmul.
    o.w_gate_up = reg_.info(reg_.add(p + "mlp.gate_proj.weight", {F, D}, Init::Normal, kWeightInitStd)).offset;
    reg_.add(p + "mlp.up_proj.weight", {F, D}, Init::Normal, kWeightInitStd, 0, true, true);
    o.w_down = reg_.info(reg_.add(p + "mlp.down_proj.weight", {D, F}, Init::Normal, out_std)).offset;
    if (cfg.sandwich_norm) o.ln_mlp_out = norm("post_feedforward_layernorm.weight");
    lo_.push_back(o);
  }
  off_norm_ = reg_.info(reg_.add("model.norm.weight", {D}, Init::Ones, 0, 0, false)).offset;
  // Tied: the head reads the embedding matrix, and its gradient adds into the embedding's (no weight decay on it).
  off_head_ = cfg.tie_embeddings ? off_embed_
                                 : reg_.info(reg_.add("lm_head.weight", {V, D}, Init::Normal, kWeightInitStd)).offset;
  store_.allocate(reg_.total_floats());
  for (auto& m : mixers_) m->bind(store_.data.data(), store_.grad.data(), cfg.d_model);
  init(0);
}

void Model::init(std::uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : reg_.all()) {
    float* w = store_.data.data() + p.offset;
    const i64 n = p.shape.numel();
    switch (p.init) {
      case Init::Normal:
        for (i64 i = 0; i < n; ++i) w[i] = static_cast<float>(rng.normal() * p.init_a * cfg_.init_scale);
        break;
      case Init::Ones:
        std::fill(w, w + n, 1.f);
        break;
      case Init::Zeros:
        std::fill(w, w + n, 0.f);
        break;
      case Init::Uniform:
        for (i64 i = 0; i < n; ++i) w[i] = static_cast<float>(rng.uniform(p.init_a, p.init_b));
        break;
      case Init::Custom:
        break;  // set by the mixer's own init (e.g. dt_bias, A_log) through init_custom
    }
  }
  for (auto& m : mixers_) m->init_custom(rng);
}

void Model::zero_grad() { std::fill(store_.grad.begin(), store_.grad.end(), 0.f); }

i64 training_arena_floats(const ModelConfig& cfg, const std::vector<std::unique_ptr<Mixer>>& mixers, i64 B, i64 T,
                          const std::vector<i64>* repeats, bool recompute, bool bf16) {
  const i64 N = B * T, D = cfg.d_model, F = cfg.d_ff;
  const i64 pad = 64;
  i64 floats = 3 * N + 4 * pad;                         // inputs, targets, doc_start copies
  // A block's activations: mixer output (+ residual), block output; rstd x2; gate|up (bf16 in a bf16 step). The two
  // norm outputs share one buffer (counted once below) and the SwiGLU product is transient.
  // Sandwich norms keep their inputs, the mixer's and the MLP's outputs, and their 1/rms too.
  const i64 sandwich = cfg.sandwich_norm ? 2 * (N * D + pad) + 2 * (N + pad) : 0;
  const i64 per_layer =
      2 * (N * D + pad) + 2 * (N + pad) + (bf16 ? bf16_floats(N * 2 * F) : N * 2 * F) + pad + sandwich;
  i64 scratch = 0, saved_max = 0, layers = 0;
  for (size_t i = 0; i < mixers.size(); ++i) {
    const i64 times = repeats ? (*repeats)[i] : 1;
    if (times <= 0) continue;
    layers += times;
    const i64 saved = mixers[i]->saved_floats(B, T);
    if (!recompute) floats += times * (per_layer + saved);
    saved_max = std::max(saved_max, saved);
    scratch = std::max(scratch, mixers[i]->scratch_floats(B, T));
  }
  floats += N * D + pad;  // the shared norm output: each block's two, then the final norm's
  // The residual stream: the embedding output (block outputs are in per_layer); with recompute, only the L + 1
  // block boundaries, plus one block at a time rerun inside backward.
  if (recompute) floats += (layers + 1) * (N * D + pad) + per_layer + saved_max;
  else floats += N * D + pad;
  floats += 2 * (N + pad);  // the final norm's rstd, lse (its output reuses the shared norm buffer)
  // Backward temporaries: d_residual, d_norm, d_tmp; on top of them, one at a time, the LM head's buffers (its dW
  // partials and logits blocks, at this thread count), the MLP's da (its d gate|up overwrites gate|up), the largest
  // mixer scratch (forward or backward) and, with recompute, the SwiGLU product of the block rerun.
  floats += 3 * (N * D + pad);
  if (cfg.sandwich_norm) floats += N * D + pad;  // d of the mixer's or the MLP's output, before its norm
  // A bf16 step's MLP keeps its bf16 product (then the rounded norm) beside da.
  const i64 mlp = N * F + pad + (bf16 ? bf16_floats(N * std::max(F, D)) + pad : 0);
  floats += std::max({scratch, mlp, ops::lm_head_ce_workspace_floats(N, D, cfg.vocab_size) + pad});
  return floats;
}

void Model::set_recompute(bool on) {
  if (on == recompute_) return;
  recompute_ = on;
  plan_B_ = plan_T_ = 0;  // the arena's size depends on it
}

void Model::plan(i64 B, i64 T, bool allow_longer) {
  if (T > cfg_.max_seq_len && !allow_longer)
    fail("sequence length {} is over the model's limit max_seq_len = {} (raise it with --set max_seq_len=N)", T,
         cfg_.max_seq_len);
  if (B == plan_B_ && T == plan_T_ && bf16_step() == plan_bf16_ && arena_.capacity() > 0) return;
  const i64 floats = training_arena_floats(cfg_, mixers_, B, T, nullptr, recompute_, bf16_step());
  // Grow only: evaluation at another shape between training steps must not re-fault the arena.
  if (arena_.capacity() < static_cast<std::size_t>(floats) * sizeof(float))
    arena_.reserve(static_cast<std::size_t>(floats) * sizeof(float));
  plan_B_ = B;
  plan_T_ = T;
  plan_bf16_ = bf16_step();
}

void Model::check(const char* what, i64 layer, const float* p, i64 n) const {
  if (!check_numerics_) return;
  for (i64 i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) {
      if (layer >= 0)
        fail("check-numerics: non-finite value {} in '{}' of layer {} ({}) at index {}", p[i], what, layer,
             cfg_.letter(layer), i);
      fail("check-numerics: non-finite value {} in '{}' at index {}", p[i], what, i);
    }
}

float* Model::block_forward(i64 l, float* x, float* out, const SeqInfo& s) {
  const i64 N = s.B * s.T, D = cfg_.d_model, F = cfg_.d_ff;
  const float eps = static_cast<float>(cfg_.norm_eps);
  LayerActs& a = acts_[l];
  const LayerOffsets& o = lo_[l];
  a.x = x;
  // The two RMSNorm outputs go to one shared buffer and are not kept: backward recomputes each from the saved
  // residual and 1/rms (recompute_norm), which saves 2 N*D floats per layer for two cheap elementwise passes.
  float* n = norm_buf_;
  a.rstd1 = arena_.floats(N, "rstd1");
  ops::rmsnorm_forward(a.x, params() + o.ln1, n, a.rstd1, N, D, eps);
  if (cfg_.sandwich_norm) {
    a.mixer_out = arena_.floats(N * D, "mixer out");
    mixers_[l]->forward(n, a.mixer_out, s, arena_);
    check("mixer output", l, a.mixer_out, N * D);
    a.rstd_mixer_out = arena_.floats(N, "rstd mixer out");
    a.h = arena_.floats(N * D, "residual mid");
    ops::rmsnorm_forward(a.mixer_out, params() + o.ln_mixer_out, a.h, a.rstd_mixer_out, N, D, eps);  // h = norm(..)
  } else {
    a.h = arena_.floats(N * D, "residual mid");
    mixers_[l]->forward(n, a.h, s, arena_);  // h = mixer(norm1(x))
    check("mixer output", l, a.h, N * D);
  }
  a.rstd2 = arena_.floats(N, "rstd2");
  ops::residual_rmsnorm_forward(a.h, a.x, params() + o.ln2, n, a.rstd2, N, D, eps);  // h += x, then norm2(h)
  // A bf16 step keeps gate|up rounded to bf16, as oneDNN writes it: half the bytes written, kept and read again;
  // SwiGLU, its one reader, rounds its own outputs for the down projection anyway (docs/precision.md).
  a.gu = nullptr;
  a.gu_bf16 = nullptr;
  if (bf16_step()) {
    a.gu_bf16 = reinterpret_cast<ops::bf16*>(arena_.floats(bf16_floats(N * 2 * F), "mlp gate|up (bf16)"));
    ops::linear_forward_to_bf16(n, params() + o.w_gate_up, a.gu_bf16, N, D, 2 * F);
  } else {
    a.gu = arena_.floats(N * 2 * F, "mlp gate|up");
    ops::linear_forward(n, params() + o.w_gate_up, a.gu, N, D, 2 * F);
  }
  if (!out) out = arena_.floats(N * D, "residual");
  float* y = out;  // the MLP's output: into the block's output, or (sandwich) kept for its norm
  if (cfg_.sandwich_norm) {
    y = a.mlp_out = arena_.floats(N * D, "mlp out");
    a.rstd_mlp_out = arena_.floats(N, "rstd mlp out");
  }
  // The gated unit's product is transient: backward recomputes it from gu (one elementwise pass) instead of keeping
  // N*F floats per layer.
  const auto act_mark = arena_.mark();
  if (bf16_step()) {
    // The down projection reads the product in bf16: the unit writes it rounded (half the bytes, no rounding pass).
    auto* act = reinterpret_cast<ops::bf16*>(arena_.floats(bf16_floats(N * F), "mlp act (bf16)"));
    gated_forward_bf16(cfg_.mlp_activation, a.gu_bf16, act, N, F);
    ops::linear_forward_bf16(act, params() + o.w_down, y, N, F, D);
  } else {
    float* act = arena_.floats(N * F, "mlp act");
    gated_forward(cfg_.mlp_activation, a.gu, act, N, F);
    ops::linear_forward(act, params() + o.w_down, y, N, F, D);
  }
  arena_.release_to(act_mark);
  check("mlp output", l, y, N * D);
  if (cfg_.sandwich_norm) ops::rmsnorm_forward(a.mlp_out, params() + o.ln_mlp_out, out, a.rstd_mlp_out, N, D, eps);
  ops::add_into(out, a.h, N * D);
  return out;
}

void Model::recompute_norm(const float* x, i64 w_offset, float* rstd, float* out) {
  // The same call as the forward's on the same inputs: bitwise the same output (and 1/rms, rewritten unchanged).
  ops::rmsnorm_forward(x, params() + w_offset, out, rstd, B_ * T_, cfg_.d_model, static_cast<float>(cfg_.norm_eps));
}

// The MLP backward of a bf16 step: its matmuls read bf16 operands, so the kernels that make them write them
// rounded (ops::swiglu_backward_bf16) and the block's d output is rounded once for each layout that is read. Both
// weight gradients are plain (NN) products, which oneDNN's bf16 kernels run faster than dy^T x (ops/transpose.h):
// down's as dW = dy^T x with d output rounded transposed (narrow: D columns), gate|up's as linear_backward under
// bf16 computes it (the bits of the fp32-buffer path under bf16 there). dx (d output) and da (N*F floats) are the
// caller's; dn gets d norm2(h); dtmp is free throughout.
void Model::mlp_backward(i64 l, const float* dy, float* da, float* dn, float* dtmp) {
  const i64 N = B_ * T_, D = cfg_.d_model, F = cfg_.d_ff;
  const LayerActs& a = acts_[l];
  const LayerOffsets& o = lo_[l];
  // y = down(act(gate_up(norm2(h)))). d act first; the gated unit's backward then writes d gate|up over gate|up and
  // the product act(gate) * up over d act (in place: each element is read before it is overwritten), for the
  // down_proj weight gradient.
  float* dgu = a.gu;
  ops::linear_backward(nullptr, params() + o.w_down, dy, da, nullptr, N, F, D);
  gated_backward(cfg_.mlp_activation, a.gu, da, dgu, N, F, da);
  ops::linear_backward(da, params() + o.w_down, dy, nullptr, grads() + o.w_down, N, F, D);
  // norm2(h) again into dtmp (free scratch here).
  recompute_norm(a.h, o.ln2, a.rstd2, dtmp);
  ops::linear_backward(dtmp, params() + o.w_gate_up, dgu, dn, grads() + o.w_gate_up, N, D, 2 * F);
}

void Model::mlp_backward_bf16(i64 l, const float* dy, float* da, float* dn, float* dtmp) {
  const i64 N = B_ * T_, D = cfg_.d_model, F = cfg_.d_ff;
  const LayerActs& a = acts_[l];
  const LayerOffsets& o = lo_[l];
  // d output in bf16, rows then transposed: 2 * N*D bf16 in dtmp's N*D floats, free until the norm below.
  auto* dxb = reinterpret_cast<ops::bf16*>(dtmp);
  ops::bf16* dxbt = dxb + N * D;
  ops::round_to_bf16(dy, N, D, D, dxb);
  ops::round_to_bf16_transposed(dy, N, D, D, dxbt);
  ops::linear_backward_bf16(nullptr, params() + o.w_down, dxb, da, nullptr, N, F, D);  // d act
  // d gate|up over d act (a bf16 row of it is an fp32 row of da), and the product act(gate) * up, rounded.
  auto* dgub = reinterpret_cast<ops::bf16*>(da);
  auto* xb = reinterpret_cast<ops::bf16*>(arena_.floats(bf16_floats(N * std::max(F, D)), "mlp operand (bf16)"));
  gated_backward_bf16(cfg_.mlp_activation, a.gu_bf16, da, dgub, N, F, xb);
  // d down_proj[D, F] += (d output)^T act.
  ops::matmul_bf16(false, false, D, F, N, 1.f, dxbt, N, xb, F, 1.f, grads() + o.w_down, F);
  // norm2(h) again, rounded into xb transposed (the product is read) for the gate|up weight gradient.
  recompute_norm(a.h, o.ln2, a.rstd2, dtmp);
  ops::round_to_bf16_transposed(dtmp, N, D, D, xb);
  ops::linear_backward_bf16(xb, params() + o.w_gate_up, dgub, dn, grads() + o.w_gate_up, N, D, 2 * F,
                            /*accumulate_dx=*/false, /*xb_transposed=*/true);
}

void Model::forward_hidden(const int32_t* inputs, const int32_t* doc_start, i64 B, i64 T) {
  if (B != plan_B_ || T != plan_T_ || bf16_step() != plan_bf16_) plan(B, T, T > cfg_.max_seq_len);
  arena_.reset();
  const i64 N = B * T, D = cfg_.d_model;
  const float eps = static_cast<float>(cfg_.norm_eps);
  B_ = B;
  T_ = T;
  int32_t* in = arena_.ints(N, "inputs");
  std::memcpy(in, inputs, sizeof(int32_t) * N);
  inputs_ = in;
  doc_start_ = nullptr;
  if (doc_start) {
    int32_t* ds = arena_.ints(N, "doc_start");
    std::memcpy(ds, doc_start, sizeof(int32_t) * N);
    doc_start_ = ds;
  }
  SeqInfo s{B, T, doc_start_};
  acts_.resize(static_cast<size_t>(cfg_.n_layers));
  norm_buf_ = arena_.floats(N * D, "block norm");
  float* x = arena_.floats(N * D, "residual");
  ops::embedding_forward(inputs_, params() + off_embed_, x, N, D, cfg_.vocab_size, cfg_.embedding_scale());
  if (!recompute_) {
    for (i64 l = 0; l < cfg_.n_layers; ++l) x = block_forward(l, x, nullptr, s);
  } else {
    // Keep the residual stream between blocks; each block's other activations live only until the next block.
    std::vector<float*> xs{x};
    for (i64 l = 0; l < cfg_.n_layers; ++l) xs.push_back(arena_.floats(N * D, "residual"));
    const auto mark = arena_.mark();
    for (i64 l = 0; l < cfg_.n_layers; ++l) {
      block_forward(l, xs[l], xs[l + 1], s);
      arena_.release_to(mark);
    }
    x = xs.back();
  }
  x_final_ = x;
  n_final_ = norm_buf_;  // the blocks are done with the shared norm buffer; backward reads n_final_ before any rerun
  rstd_final_ = arena_.floats(N, "final rstd");
  ops::rmsnorm_forward(x_final_, params() + off_norm_, n_final_, rstd_final_, N, D, eps);
  check("final norm", -1, n_final_, N * D);
}

void Model::set_targets(const int32_t* targets, i64* n_counted) {
  const i64 N = B_ * T_;
  int32_t* tg = arena_.ints(N, "targets");
  std::memcpy(tg, targets, sizeof(int32_t) * N);
  targets_ = tg;
  i64 cnt = 0;
  for (i64 i = 0; i < N; ++i) {
    if (tg[i] >= cfg_.vocab_size) fail("target token id {} at position {} is outside the vocabulary ({})", tg[i], i, cfg_.vocab_size);
    cnt += tg[i] >= 0;
  }
  if (n_counted) *n_counted = cnt;
  lse_ = arena_.floats(N, "lse");
}

double Model::forward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_start, i64 B, i64 T,
                      i64* n_counted, float* token_loss) {
  forward_hidden(inputs, doc_start, B, T);
  set_targets(targets, n_counted);
  double loss = ops::lm_head_ce_forward(n_final_, params() + off_head_, targets_, B * T, cfg_.d_model,
                                        cfg_.vocab_size, lse_, token_loss);
  if (check_numerics_ && !std::isfinite(loss)) fail("check-numerics: non-finite loss {}", loss);
  return loss;
}

double Model::forward_backward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_start, i64 B, i64 T,
                               float grad_scale, i64* n_counted) {
  forward_hidden(inputs, doc_start, B, T);
  set_targets(targets, n_counted);
  const i64 N = B * T, D = cfg_.d_model;
  const auto mark = arena_.mark();
  const BackwardBuffers g = backward_buffers();
  // The head's buffers in the arena region that the blocks' backward scratch takes later (free now), not in buffers
  // its threads would keep resident; where the thread count grew since plan() they do not fit and the head keeps them.
  const auto head_mark = arena_.mark();
  const i64 ws_floats = ops::lm_head_ce_workspace_floats(N, D, cfg_.vocab_size);
  const size_t ws_bytes = Arena::rounded(sizeof(float) * static_cast<size_t>(ws_floats));
  const bool ws_fits = ws_floats > 0 && arena_.used() + ws_bytes <= arena_.capacity();
  float* ws = ws_fits ? arena_.floats(ws_floats, "lm_head_workspace") : nullptr;
  const double loss = ops::lm_head_ce_forward_backward(n_final_, params() + off_head_, targets_, N, D,
                                                       cfg_.vocab_size, grad_scale, lse_, nullptr, g.dn,
                                                       grads() + off_head_, {}, ws, ws_fits ? ws_floats : 0);
  arena_.release_to(head_mark);
  if (check_numerics_ && !std::isfinite(loss)) fail("check-numerics: non-finite loss {}", loss);
  backward_below_head(g);
  arena_.release_to(mark);
  return loss;
}

void Model::forward_logits(const int32_t* inputs, const int32_t* doc_start, i64 B, i64 T, float* logits) {
  forward_hidden(inputs, doc_start, B, T);
  ops::linear_forward(n_final_, params() + off_head_, logits, B * T, cfg_.d_model, cfg_.vocab_size);
}

void Model::backward(float grad_scale) {
  const i64 N = B_ * T_, D = cfg_.d_model;
  const auto mark = arena_.mark();
  const BackwardBuffers g = backward_buffers();
  ops::lm_head_ce_backward(n_final_, params() + off_head_, targets_, lse_, N, D, cfg_.vocab_size, grad_scale, g.dn,
                           grads() + off_head_);
  backward_below_head(g);
  arena_.release_to(mark);
}

Model::BackwardBuffers Model::backward_buffers() {
  const i64 n = B_ * T_ * cfg_.d_model;
  return {arena_.floats(n, "d_residual"), arena_.floats(n, "d_norm"), arena_.floats(n, "d_tmp")};
}

void Model::backward_below_head(const BackwardBuffers& g) {
  const i64 N = B_ * T_, D = cfg_.d_model, F = cfg_.d_ff;
  SeqInfo s{B_, T_, doc_start_};
  float *dx = g.dx, *dn = g.dn, *dtmp = g.dtmp;
  ops::rmsnorm_backward(x_final_, params() + off_norm_, rstd_final_, dn, dx, grads() + off_norm_, N, D);
  check("grad final hidden", -1, dx, N * D);
  // Sandwich norms: d of the MLP's (then the mixer's) output before its norm; dx stays the residual's gradient.
  float* d_out = cfg_.sandwich_norm ? arena_.floats(N * D, "d mixer or mlp output") : nullptr;
  for (i64 l = cfg_.n_layers - 1; l >= 0; --l) {
    const auto block_mark = arena_.mark();
    // Recompute: this block's activations again, from the residual saved at its input (same ops, same
    // order, so bitwise what the plain forward saved). Its output is not needed.
    if (recompute_) block_forward(l, acts_[l].x, nullptr, s);
    const LayerActs& a = acts_[l];
    const LayerOffsets& o = lo_[l];
    // The MLP's d act (N*F floats) lives only through the MLP backward; the mixer's backward scratch then
    // reuses its space. d gate|up overwrites the block's gate|up, which nothing reads after this backward.
    // out = h + mlp(norm2(h)), or (sandwich) h + norm(mlp(norm2(h))): the MLP's d output is dx, or the norm's dx.
    const float* d_mlp = dx;
    if (cfg_.sandwich_norm) {
      ops::rmsnorm_backward(a.mlp_out, params() + o.ln_mlp_out, a.rstd_mlp_out, dx, d_out, grads() + o.ln_mlp_out, N,
                            D);
      d_mlp = d_out;
    }
    const auto mlp_mark = arena_.mark();
    float* da = arena_.floats(N * F, "d_mlp_act");
    if (bf16_step())
      mlp_backward_bf16(l, d_mlp, da, dn, dtmp);
    else
      mlp_backward(l, d_mlp, da, dn, dtmp);
    arena_.release_to(mlp_mark);
    // dx += d norm2 input: dx is now d h.
    ops::rmsnorm_backward(a.h, params() + o.ln2, a.rstd2, dn, dx, grads() + o.ln2, N, D, /*accumulate_dx=*/true);
    // h = x + mixer(norm1(x)), or (sandwich) x + norm(mixer(norm1(x))); norm1(x) again into dtmp, as above.
    const float* d_mixer = dx;
    if (cfg_.sandwich_norm) {
      ops::rmsnorm_backward(a.mixer_out, params() + o.ln_mixer_out, a.rstd_mixer_out, dx, d_out,
                            grads() + o.ln_mixer_out, N, D);
      d_mixer = d_out;
    }
    recompute_norm(a.x, o.ln1, a.rstd1, dtmp);
    mixers_[l]->backward(dtmp, d_mixer, dn, s, arena_);
    check("grad mixer input", l, dn, N * D);
    ops::rmsnorm_backward(a.x, params() + o.ln1, a.rstd1, dn, dx, grads() + o.ln1, N, D, /*accumulate_dx=*/true);
    check("grad residual", l, dx, N * D);
    arena_.release_to(block_mark);
  }
  ops::embedding_backward(inputs_, dx, grads() + off_embed_, N, D, cfg_.vocab_size, cfg_.embedding_scale());
}

DecodeState Model::new_decode_state(i64 B, i64 max_len) const {
  DecodeState st;
  st.B = B;
  st.max_len = max_len;
  for (auto& m : mixers_) st.layers.push_back(m->new_state(B, max_len));
  return st;
}

void Model::decode_step(const int32_t* tokens, DecodeState& st, float* logits) {
  prefill(tokens, st.B, 1, st, logits, nullptr);
}

void Model::prefill(const int32_t* tokens, i64 B, i64 T, DecodeState& st, float* last_logits, float* all_logits) {
  HLM_CHECK(B == st.B, "prefill: batch {} but the decode state has {} rows", B, st.B);
  HLM_CHECK(st.pos + T <= st.max_len, "prefill: context {} exceeds the decode state's max_len {}", st.pos + T,
            st.max_len);
  const i64 N = B * T, D = cfg_.d_model, F = cfg_.d_ff, V = cfg_.vocab_size;
  const float eps = static_cast<float>(cfg_.norm_eps);
  i64 mix = 0;
  for (auto& m : mixers_) mix = std::max(mix, m->saved_floats(B, T) + m->scratch_floats(B, T));
  const std::size_t need = static_cast<std::size_t>(4 * N * D + 3 * N * F + N + mix + 64 * 16) * sizeof(float);
  if (infer_arena_.capacity() < need) infer_arena_.reserve(need);
  infer_arena_.reset();
  float* x = infer_arena_.floats(N * D, "prefill x");
  float* n = infer_arena_.floats(N * D, "prefill norm");
  float* y = infer_arena_.floats(N * D, "prefill mixer out");
  float* rstd = infer_arena_.floats(N, "prefill rstd");
  float* gu = infer_arena_.floats(N * 2 * F, "prefill gate|up");
  float* a = infer_arena_.floats(N * F, "prefill act");
  ops::embedding_forward(tokens, params() + off_embed_, x, N, D, V, cfg_.embedding_scale());
  for (i64 l = 0; l < cfg_.n_layers; ++l) {
    const LayerOffsets& o = lo_[l];
    ops::rmsnorm_forward(x, params() + o.ln1, n, rstd, N, D, eps);
    auto mark = infer_arena_.mark();
    if (T == 1) mixers_[l]->step(n, y, *st.layers[l], B);
    else mixers_[l]->prefill(n, y, B, T, *st.layers[l], infer_arena_);
    infer_arena_.release_to(mark);
    // Sandwich norms in place (each row is read whole before it is written).
    if (cfg_.sandwich_norm) ops::rmsnorm_forward(y, params() + o.ln_mixer_out, y, rstd, N, D, eps);
    ops::residual_rmsnorm_forward(x, y, params() + o.ln2, n, rstd, N, D, eps);
    ops::linear_forward(n, params() + o.w_gate_up, gu, N, D, 2 * F);
    gated_forward(cfg_.mlp_activation, gu, a, N, F);
    ops::linear_forward(a, params() + o.w_down, y, N, F, D);
    if (cfg_.sandwich_norm) ops::rmsnorm_forward(y, params() + o.ln_mlp_out, y, rstd, N, D, eps);
    ops::add_into(x, y, N * D);
  }
  ops::rmsnorm_forward(x, params() + off_norm_, n, rstd, N, D, eps);
  if (all_logits) ops::linear_forward(n, params() + off_head_, all_logits, N, D, V);
  if (last_logits)
    for (i64 b = 0; b < B; ++b)
      ops::linear_forward(n + (b * T + T - 1) * D, params() + off_head_, last_logits + b * V, 1, D, V);
  st.pos += T;
}

ModelFlops Model::flops(i64 T) const {
  ModelFlops f;
  const double D = static_cast<double>(cfg_.d_model), F = static_cast<double>(cfg_.d_ff),
               V = static_cast<double>(cfg_.vocab_size);
  double fwd = 2.0 * V * D;  // LM head
  f.matmul_params = V * D;
  std::map<std::string, double> by_kind;
  for (i64 l = 0; l < cfg_.n_layers; ++l) {
    FlopCount m = mixers_[l]->flops_per_token(T);
    const double mlp = 2.0 * 3.0 * D * F;
    f.matmul_params += (m.matmul + mlp) / 2.0;
    const double layer = m.matmul + m.core + mlp;
    fwd += layer;
    by_kind[std::string(1, cfg_.letter(l))] += layer;
  }
  by_kind["lm_head"] = 2.0 * V * D;
  f.forward_per_token = fwd;
  // Training = forward + backward (2x the matmuls, ~2x the mixer cores): 3x forward.
  f.train_per_token = 3.0 * fwd;
  for (auto& [k, v] : by_kind) f.per_layer_type.emplace_back(k, v);
  return f;
}

}  // namespace hlm
