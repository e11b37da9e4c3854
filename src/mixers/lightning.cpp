#include "mixers/lightning.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/arena_count.h"
#include "core/error.h"
#include "ops/matmul.h"
#include "ops/mixer_gates.h"
#include "ops/rmsnorm.h"

namespace hlm {

namespace {

struct LightningState final : MixerState {
  i64 B = 0, pos = 0;
  std::vector<float> S;  // [B, H, hd, hd]
  i64 bytes() const override { return static_cast<i64>(S.size() * sizeof(float)); }
};

}  // namespace

std::vector<double> lightning_minimax_slopes(i64 n_heads, i64 layer, i64 n_layers) {
  HLM_CHECK(n_heads >= 1 && n_layers >= 1 && layer >= 0 && layer < n_layers,
            "lightning_minimax_slopes: bad arguments n_heads={} layer={} n_layers={}", n_heads, layer, n_layers);
  const double base = std::pow(2.0, -8.0 / static_cast<double>(n_heads));
  const double factor = 1.0 - static_cast<double>(layer) / (static_cast<double>(n_layers) - 1.0 + 1e-5) + 1e-5;
  std::vector<double> s(static_cast<size_t>(n_heads));
  for (i64 h = 0; h < n_heads; ++h) s[h] = std::pow(base, static_cast<double>(h + 1)) * factor;
  return s;
}

LightningMixer::LightningMixer(const MixerSpec& spec, ParamRegistry& reg) {
  const auto& t = spec.type;
  D_ = spec.d_model;
  H_ = t.n_heads;
  hd_ = t.head_dim;
  chunk_ = spec.chunk_size;
  HLM_CHECK(H_ >= 1 && hd_ >= 1 && chunk_ >= 1, "lightning: layer {} needs n_heads, head_dim, chunk_size >= 1 (got {}, {}, {})",
            spec.layer, H_, hd_, chunk_);
  slopes_ = lightning_minimax_slopes(H_, spec.layer, spec.n_layers);
  const std::string p = spec.name_prefix + "linear_attn.";
  const double in_std = spec.init_std;
  // q|k|v|output_gate adjacent: one [4*H*hd, D] weight for a single matmul.
  off_w_ = reg.info(reg.add(p + "q_proj.weight", {HK(), D_}, Init::Normal, in_std)).offset;
  reg.add(p + "k_proj.weight", {HK(), D_}, Init::Normal, in_std, 0, true, true);
  reg.add(p + "v_proj.weight", {HK(), D_}, Init::Normal, in_std, 0, true, true);
  reg.add(p + "output_gate.weight", {HK(), D_}, Init::Normal, in_std, 0, true, true);
  off_norm_ = reg.info(reg.add(p + "norm.weight", {HK()}, Init::Ones, 0, 0, false)).offset;
  off_wo_ = reg.info(reg.add(p + "o_proj.weight", {D_, HK()}, Init::Normal, spec.out_proj_init_std)).offset;
}

ops::ScalarDecayArgs<float> LightningMixer::scan_shape(i64 B, i64 T) const {
  ops::ScalarDecayArgs<float> a;
  a.B = B, a.T = T, a.H = H_, a.Hk = H_, a.K = hd_, a.V = hd_, a.chunk = chunk_, a.scale = 1.f;
  return a;
}

ops::ScalarDecayArgs<float> LightningMixer::scan_args(const float* act, i64 stride, const float* g, i64 B, i64 T,
                                                      const int32_t* doc_start, const float* init) const {
  const i64 HK = this->HK();
  ops::ScalarDecayArgs<float> a = scan_shape(B, T);
  a.q_stride = a.k_stride = a.v_stride = stride;
  a.q = act, a.k = act + HK, a.v = act + 2 * HK, a.g = g;
  a.initial_state = init;
  a.doc_start = doc_start;
  return a;
}

template <class Alloc>
LightningMixer::RunBuffers LightningMixer::run_buffers(Alloc& arena, i64 B, i64 T) const {
  const i64 N = B * T, HK = this->HK(), W4 = 4 * HK;
  RunBuffers b;
  Saved& s = b.saved;
  s.pre = arena.floats(N * W4, "lightning projections");
  s.g = arena.floats(N * H_, "lightning log decay");
  s.o = arena.floats(N * HK, "lightning core out");
  s.rstd = arena.floats(N, "lightning norm rstd");
  b.temp_mark = arena.mark();
  b.act = arena.floats(N * W4, "lightning activations");
  b.states = arena.floats(ops::scalar_decay_chunk_states_numel(scan_shape(B, T)), "lightning chunk states");
  b.u = arena.floats(N * HK, "lightning gated norm");
  return b;
}

template <class Alloc>
LightningMixer::PrefillBuffers LightningMixer::prefill_buffers(Alloc& arena, i64 B, i64 T, bool span) const {
  PrefillBuffers b;
  b.span = span_buffer(arena, B, T, span);
  b.fin = arena.floats(B * H_ * hd_ * hd_, "lightning prefill final state");
  b.run = run_buffers(arena, B, T);
  return b;
}

template <class Alloc>
LightningMixer::BackwardBuffers LightningMixer::backward_buffers(Alloc& arena, i64 B, i64 T) const {
  const i64 N = B * T, HK = this->HK();
  BackwardBuffers b;
  b.qkv = arena.floats(N * 3 * HK, "lightning d: q|k|v activations recomputed");
  b.scan_mark = arena.mark();
  b.nrm = arena.floats(N * HK, "lightning d: normalised o");
  b.u = arena.floats(N * HK, "lightning d: gated norm");
  b.du = arena.floats(N * HK, "lightning d: gated norm grad");
  return b;
}

template <class Alloc>
LightningMixer::ScanBuffers LightningMixer::scan_buffers(Alloc& arena, i64 B, i64 T) const {
  const i64 N = B * T, HK = this->HK();
  ScanBuffers b;
  b.dqkv = arena.floats(N * 3 * HK, "lightning d: q|k|v");
  b.dg = arena.floats(N * H_, "lightning d: log decay");
  b.ws = arena.floats(ops::scalar_decay_backward_workspace_numel(scan_shape(B, T)), "lightning d: scan workspace");
  return b;
}

ArenaUse LightningMixer::arena_use(i64 B, i64 T) const {
  // Forward as forward() lists it, with a span set (the worst case).
  return count_arena_use(
      [&](ArenaCount& c) {
        span_buffer(c, B, T, true);
        c.release_to(run_buffers(c, B, T).temp_mark);
      },
      [&](ArenaCount& c) {
        c.release_to(backward_buffers(c, B, T).scan_mark);
        scan_buffers(c, B, T);
      },
      [&](ArenaCount& c) { prefill_buffers(c, B, T, true); });
}

FlopCount LightningMixer::flops_per_token(i64 T) const {
  FlopCount f;
  const double D = static_cast<double>(D_), HK = static_cast<double>(H_ * hd_), d = static_cast<double>(hd_);
  f.matmul = 2.0 * (4.0 * HK * D + D * HK);
  // Chunked kernel: (Q K^T) and (P V) inside a chunk, Q S and K^T V against the state (docs/algorithms.md §9.3).
  const double C = static_cast<double>(std::min(chunk_, std::max<i64>(T, 1)));
  f.core = static_cast<double>(H_) * (4.0 * C * d + 4.0 * d * d);
  return f;
}

void LightningMixer::run(const float* x, float* y, i64 B, i64 T, const int32_t* doc_start, const float* init,
                         float* fin, const RunBuffers& b, Arena& arena) {
  const i64 N = B * T, HK = this->HK(), W4 = 4 * HK;
  const Saved& s = saved_ = b.saved;
  ops::linear_forward(x, P(off_w_), s.pre, N, D_, W4);  // [N, 4 HK]: q | k | v | gate
  ops::lightning_activate(s.pre, b.act, W4, b.act + 3 * HK, W4, N, HK);  // silu on q | k | v, sigmoid on the gate
  for (i64 n = 0; n < N; ++n)
    for (i64 h = 0; h < H_; ++h) s.g[n * H_ + h] = static_cast<float>(-slopes_[h]);  // [N, H]
  ds_ = doc_start;
  const ops::ScalarDecayArgs<float> a = scan_args(b.act, W4, s.g, B, T, doc_start, init);
  ops::scalar_decay_chunked_forward(a, s.o, fin, b.states);  // o: [N, H, hd]
  float* u = b.u;  // RMSNorm(o) * sigmoid(gate), [N, HK]
  ops::rmsnorm_forward(s.o, P(off_norm_), u, s.rstd, N, HK, kNormEps);
  ops::gate_multiply(u, b.act + 3 * HK, W4, N, HK);
  ops::linear_forward(u, P(off_wo_), y, N, HK, D_);
  arena.release_to(b.temp_mark);
}

void LightningMixer::forward(const float* x, float* y, const SeqInfo& s, Arena& arena) {
  int32_t* span = span_buffer(arena, s.B, s.T, max_span_ > 0);
  const int32_t* ds = span_doc_start(s.doc_start, s.B, s.T, 0, span);
  const RunBuffers b = run_buffers(arena, s.B, s.T);
  run(x, y, s.B, s.T, ds, nullptr, nullptr, b, arena);
}

void LightningMixer::backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) {
  const i64 B = s.B, T = s.T, N = B * T, HK = this->HK(), W4 = 4 * HK;
  const Saved& sv = saved_;
  float* pre = sv.pre;         // q | k | v | gate; its gate columns become sigmoid(gate), then d gate; at the end
  float* gate = pre + 3 * HK;  // all of it is the projection gradient
  auto mark = arena.mark();
  const BackwardBuffers bb = backward_buffers(arena, B, T);
  // The activations again (elementwise on the saved projections: the forward's op on the same input, the same
  // bits), cheaper than keeping 4 H hd floats per token in every Lightning layer.
  ops::lightning_activate(pre, bb.qkv, 3 * HK, gate, W4, N, HK);
  // Recompute u = RMSNorm(o) w * sigmoid(gate) for the o_proj weight gradient.
  ops::norm_gate_recompute(sv.o, sv.rstd, P(off_norm_), gate, W4, bb.nrm, bb.u, N, HK);
  ops::linear_backward(bb.u, P(off_wo_), dy, bb.du, G(off_wo_), N, HK, D_);
  // u = n * sg:  d gate_pre = du n sg (1 - sg) (over sg);  d n = du sg.
  ops::sigmoid_gate_backward(bb.nrm, gate, W4, bb.du, gate, W4, N, HK);
  float* d_o = sv.o;  // over o, read row by row before it is overwritten
  ops::rmsnorm_backward(sv.o, P(off_norm_), sv.rstd, bb.du, d_o, G(off_norm_), N, HK);
  arena.release_to(bb.scan_mark);  // nrm, u, du done
  const ScanBuffers sb = scan_buffers(arena, B, T);
  const ops::ScalarDecayArgs<float> a = scan_args(bb.qkv, 3 * HK, sv.g, B, T, ds_, nullptr);
  // dq | dk | dv in the layout of q | k | v; dg is unused (constant decay). The chunk states are recomputed into the
  // workspace (nullptr): the forward's own pass over the same k, v, for H hd^2 / C floats per token not kept in
  // every Lightning layer.
  float* dqkv = sb.dqkv;
  ops::scalar_decay_chunked_backward(a, nullptr, d_o, nullptr,
                                     {.dq = dqkv, .dk = dqkv + HK, .dv = dqkv + 2 * HK, .dg = sb.dg}, sb.ws);
  // silu'(x) = s (1 + x (1 - s)), s = sigmoid(x): over pre's q | k | v columns, beside d gate.
  ops::silu_backward(pre, W4, dqkv, 3 * HK, pre, W4, N, 3 * HK);
  ops::linear_backward(x, P(off_w_), pre, dx, G(off_w_), N, D_, W4);
  arena.release_to(mark);
}

std::unique_ptr<MixerState> LightningMixer::new_state(i64 B, i64 max_len) const {
  auto st = std::make_unique<LightningState>();
  st->B = B;
  st->S.assign(static_cast<size_t>(B * H_ * hd_ * hd_), 0.f);
  return st;
}

void LightningMixer::step(const float* x, float* y, MixerState& state, i64 B) {
  auto& st = static_cast<LightningState&>(state);
  HLM_CHECK(B == st.B, "lightning step: batch {} but the state has {} rows", B, st.B);
  const i64 HK = this->HK(), W4 = 4 * HK;
  if (max_span_ > 0 && st.pos > 0 && st.pos % max_span_ == 0) std::fill(st.S.begin(), st.S.end(), 0.f);
  std::vector<float> pre(static_cast<size_t>(B * W4)), act(pre.size()), g(static_cast<size_t>(B * H_)),
      o(static_cast<size_t>(B * HK)), rstd(static_cast<size_t>(B));
  ops::linear_forward(x, P(off_w_), pre.data(), B, D_, W4);
  ops::lightning_activate(pre.data(), act.data(), W4, act.data() + 3 * HK, W4, B, HK);
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H_; ++h) g[b * H_ + h] = static_cast<float>(-slopes_[h]);
  ops::scalar_decay_step(scan_args(act.data(), W4, g.data(), B, 1, nullptr, nullptr), st.S.data(), o.data());
  ops::rmsnorm_forward(o.data(), P(off_norm_), o.data(), rstd.data(), B, HK, kNormEps);
  ops::gate_multiply(o.data(), act.data() + 3 * HK, W4, B, HK);
  ops::linear_forward(o.data(), P(off_wo_), y, B, HK, D_);
  st.pos++;
}

void LightningMixer::prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) {
  auto& st = static_cast<LightningState&>(state);
  HLM_CHECK(B == st.B, "lightning prefill: batch {} but the state has {} rows", B, st.B);
  // A span block starting exactly at this call's first token drops the carried state.
  const bool reset0 = max_span_ > 0 && st.pos > 0 && st.pos % max_span_ == 0;
  const PrefillBuffers b = prefill_buffers(arena, B, T, max_span_ > 0);
  const int32_t* ds = span_doc_start(nullptr, B, T, st.pos, b.span);
  run(x, y, B, T, ds, reset0 ? nullptr : st.S.data(), b.fin, b.run, arena);
  std::copy(b.fin, b.fin + st.S.size(), st.S.begin());
  st.pos += T;
}

}  // namespace hlm
