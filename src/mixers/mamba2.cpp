#include "mixers/mamba2.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/arena_count.h"
#include "core/error.h"
#include "mixers/decay_init.h"
#include "ops/matmul.h"
#include "ops/mixer_gates.h"
#include "ops/rmsnorm.h"

namespace hlm {

namespace {

struct Mamba2State final : MixerState {
  i64 B = 0, pos = 0;
  std::vector<float> conv;  // [B, 3, Cc] last conv inputs, oldest first
  std::vector<float> ssm;   // [B, nh, N, P]
  i64 bytes() const override { return static_cast<i64>((conv.size() + ssm.size()) * sizeof(float)); }
};

}  // namespace

Mamba2Mixer::Mamba2Mixer(const MixerSpec& spec, ParamRegistry& reg) {
  const auto& t = spec.type;
  D_ = spec.d_model;
  di_ = spec.mamba_expand * spec.d_model;
  P_ = t.head_dim;
  N_ = spec.mamba_d_state;
  chunk_ = spec.chunk_size;
  a_range_ = t.a_init_range;
  dt_range_ = t.dt_init_range;
  HLM_CHECK(P_ >= 1 && di_ % P_ == 0 && N_ >= 1 && chunk_ >= 1,
            "mamba2: layer {}: d_inner {} must be a multiple of head_dim {}; d_state {} and chunk_size {} >= 1",
            spec.layer, di_, P_, N_, chunk_);
  nh_ = di_ / P_;
  const std::string p = spec.name_prefix + "mixer.";
  const double cw = 1.0 / std::sqrt(static_cast<double>(kConv));  // PyTorch conv1d default bound, fan_in = 4
  off_in_ = reg.info(reg.add(p + "in_proj.weight", {Win(), D_}, Init::Normal, spec.init_std)).offset;
  off_convw_ = reg.info(reg.add(p + "conv1d.weight", {Cc(), 1, kConv}, Init::Uniform, -cw, cw)).offset;
  off_convb_ = reg.info(reg.add(p + "conv1d.bias", {Cc()}, Init::Zeros, 0, 0, false)).offset;
  off_dtb_ = reg.info(reg.add(p + "dt_bias", {nh_}, Init::Custom, 0, 0, false)).offset;
  off_alog_ = reg.info(reg.add(p + "A_log", {nh_}, Init::Custom, 0, 0, false)).offset;
  off_D_ = reg.info(reg.add(p + "D", {nh_}, Init::Ones, 0, 0, false)).offset;
  off_norm_ = reg.info(reg.add(p + "norm.weight", {di_}, Init::Ones, 0, 0, false)).offset;
  off_out_ = reg.info(reg.add(p + "out_proj.weight", {D_, di_}, Init::Normal, spec.out_proj_init_std)).offset;
}

std::vector<float> Mamba2Mixer::decay_rates() const {
  std::vector<float> A(static_cast<size_t>(nh_));
  for (i64 h = 0; h < nh_; ++h) A[h] = -std::exp(P(off_alog_)[h]);
  return A;
}

ops::CausalConv1dArgs<float> Mamba2Mixer::conv_args(const float* pre, i64 B, i64 T, const int32_t* doc_start,
                                             const float* conv_init) const {
  ops::CausalConv1dArgs<float> c;
  c.B = B, c.T = T, c.C = Cc(), c.W = kConv, c.u_stride = pre_stride(), c.silu = true;
  c.u = pre + di_, c.w = P(off_convw_), c.bias = P(off_convb_), c.initial_state = conv_init, c.doc_start = doc_start;
  return c;
}

ops::ScalarDecayArgs<float> Mamba2Mixer::scan_shape(i64 B, i64 T) const {
  ops::ScalarDecayArgs<float> a;
  a.B = B, a.T = T, a.H = nh_, a.Hk = 1, a.K = N_, a.V = P_, a.chunk = chunk_, a.scale = 1.f;
  return a;
}

ops::ScalarDecayArgs<float> Mamba2Mixer::scan_args(const float* xbc, const float* v, const float* g, i64 B, i64 T,
                                            const int32_t* doc_start, const float* ssm_init) const {
  ops::ScalarDecayArgs<float> a = scan_shape(B, T);
  a.q_stride = a.k_stride = Cc();
  a.q = xbc + di_ + N_, a.k = xbc + di_, a.v = v, a.g = g;
  a.initial_state = ssm_init;
  a.doc_start = doc_start;
  return a;
}

void Mamba2Mixer::init_custom(Rng& rng) {
  // mamba_ssm: dt ~ exp(U[ln 1e-3, ln 0.1]), then A ~ U[1, 16] (mixers/decay_init.h).
  init_dt_bias(rng, dt_range_, init_view(off_dtb_), nh_);
  init_a_log(rng, a_range_, init_view(off_alog_), nh_);
}

template <class Alloc>
Mamba2Mixer::RunBuffers Mamba2Mixer::run_buffers(Alloc& arena, i64 B, i64 T) const {
  const i64 N = B * T;
  RunBuffers b;
  Saved& s = b.saved;
  s.pre = arena.floats(N * pre_stride(), "mamba2 in_proj");
  s.dt = arena.floats(N * nh_, "mamba2 dt");
  s.g = arena.floats(N * nh_, "mamba2 log decay");
  s.states = arena.floats(ops::scalar_decay_chunk_states_numel(scan_shape(B, T)), "mamba2 chunk states");
  s.ys = arena.floats(N * di_, "mamba2 ssm out");
  s.rstd = arena.floats(N, "mamba2 norm rstd");
  b.temp_mark = arena.mark();
  b.xbc = arena.floats(N * Cc(), "mamba2 xBC");
  b.v = arena.floats(N * di_, "mamba2 dt x");
  b.yg = arena.floats(N * di_, "mamba2 gated y");
  return b;
}

template <class Alloc>
Mamba2Mixer::PrefillBuffers Mamba2Mixer::prefill_buffers(Alloc& arena, i64 B, i64 T, bool span) const {
  PrefillBuffers b;
  b.span = span_buffer(arena, B, T, span);
  b.fin = arena.floats(B * nh_ * N_ * P_, "mamba2 prefill final state");
  b.run = run_buffers(arena, B, T);
  return b;
}

template <class Alloc>
Mamba2Mixer::BackwardBuffers Mamba2Mixer::backward_buffers(Alloc& arena, i64 B, i64 T) const {
  const i64 N = B * T;
  BackwardBuffers b;
  b.yg = arena.floats(N * di_, "mamba2 d: gated y");
  b.nrm = arena.floats(N * di_, "mamba2 d: normalised y");  // later d yg
  b.dn = arena.floats(N * di_, "mamba2 d: norm out grad");  // later d ys
  b.dpre = arena.floats(N * pre_stride(), "mamba2 d: in_proj");
  b.xbc = arena.floats(N * Cc(), "mamba2 d: xBC recomputed");
  b.dxbc = arena.floats(N * Cc(), "mamba2 d: xBC");
  b.dv = arena.floats(N * di_, "mamba2 d: dt x");
  b.dg = arena.floats(N * nh_, "mamba2 d: log decay");
  b.part = arena.floats(3 * N * nh_, "mamba2 d: per-token partials");
  b.ws = arena.floats(ops::scalar_decay_backward_workspace_numel(scan_shape(B, T)), "mamba2 d: scan workspace");
  return b;
}

ArenaUse Mamba2Mixer::arena_use(i64 B, i64 T) const {
  // Forward as forward() lists it, with a span set (the worst case).
  return count_arena_use(
      [&](ArenaCount& c) {
        span_buffer(c, B, T, true);
        c.release_to(run_buffers(c, B, T).temp_mark);
      },
      [&](ArenaCount& c) { backward_buffers(c, B, T); }, [&](ArenaCount& c) { prefill_buffers(c, B, T, true); });
}

FlopCount Mamba2Mixer::flops_per_token(i64 T) const {
  FlopCount f;
  f.matmul = 2.0 * (static_cast<double>(Win()) * D_ + static_cast<double>(D_) * di_);
  // docs/algorithms.md §9.3: 2 C N (C B^T once per chunk, shared by the heads) + heads (2 C P + 4 N P).
  const double C = static_cast<double>(std::min(chunk_, std::max<i64>(T, 1)));
  const double N = static_cast<double>(N_), P = static_cast<double>(P_);
  f.core = 2.0 * C * N + static_cast<double>(nh_) * (2.0 * C * P + 4.0 * N * P);
  return f;
}

void Mamba2Mixer::run(const float* x, float* y, i64 B, i64 T, const int32_t* doc_start, const float* conv_init,
                      float* conv_fin, const float* ssm_init, float* ssm_fin, const RunBuffers& b, Arena& arena) {
  const i64 N = B * T, Wi = Win(), Ws = pre_stride(), C = Cc(), di = di_, nh = nh_, Pd = P_;
  const Saved& s = saved_ = b.saved;
  ops::linear_forward(x, P(off_in_), s.pre, N, D_, Wi, Ws);  // [N, Win] in rows Ws apart: z | xBC | dt
  ds_ = doc_start;
  // xbc [N, Cc]: x | B | C after conv + SiLU
  ops::causal_conv1d_forward(conv_args(s.pre, B, T, doc_start, conv_init), b.xbc, conv_fin);
  ops::mamba2_dt_forward(s.pre + 2 * di + 2 * N_, Ws, P(off_dtb_), decay_rates().data(), b.xbc, C, s.dt, s.g, b.v,
                         N, nh, Pd);  // v [N, nh, P]
  const ops::ScalarDecayArgs<float> a = scan_args(b.xbc, b.v, s.g, B, T, doc_start, ssm_init);
  ops::scalar_decay_chunked_forward(a, s.ys, ssm_fin, s.states);  // ys [N, nh, P]
  float* yg = b.yg;
  ops::mamba2_skip_gate_forward(s.ys, b.xbc, C, P(off_D_), s.pre, Ws, yg, N, nh, Pd);  // ys += D x; yg = ys silu(z)
  ops::rmsnorm_forward(yg, P(off_norm_), yg, s.rstd, N, di, kNormEps);
  ops::linear_forward(yg, P(off_out_), y, N, di, D_);
  arena.release_to(b.temp_mark);
}

void Mamba2Mixer::forward(const float* x, float* y, const SeqInfo& s, Arena& arena) {
  int32_t* span = span_buffer(arena, s.B, s.T, max_span_ > 0);
  const int32_t* ds = span_doc_start(s.doc_start, s.B, s.T, 0, span);
  const RunBuffers b = run_buffers(arena, s.B, s.T);
  run(x, y, s.B, s.T, ds, nullptr, nullptr, nullptr, nullptr, b, arena);
}

void Mamba2Mixer::backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) {
  const i64 B = s.B, T = s.T, N = B * T, Wi = Win(), Ws = pre_stride(), C = Cc(), di = di_, nh = nh_, Pd = P_;
  const Saved& sv = saved_;
  auto mark = arena.mark();
  const BackwardBuffers bb = backward_buffers(arena, B, T);
  float *yg = bb.yg, *nrm = bb.nrm, *dn = bb.dn, *dpre = bb.dpre, *dxbc = bb.dxbc, *part = bb.part, *xbc = bb.xbc;
  // The conv output again (a short depthwise conv of the saved in_proj output: cheaper to redo than to keep, and
  // the same kernel on the same input gives the forward's bits; training always starts from a zero conv state).
  ops::causal_conv1d_forward(conv_args(sv.pre, B, T, ds_, nullptr), xbc, nullptr);
  // Recompute yg = ys * silu(z) and its normalised form for the out_proj weight gradient.
  const float* wn = P(off_norm_);
  ops::silu_gate_norm_recompute(sv.ys, sv.pre, Ws, sv.rstd, wn, yg, nrm, N, di);
  ops::linear_backward(nrm, P(off_out_), dy, dn, G(off_out_), N, di, D_);
  float* dyg = nrm;
  ops::rmsnorm_backward(yg, wn, sv.rstd, dn, dyg, G(off_norm_), N, di);
  // yg = ys silu(z): d ys = dyg silu(z) (into dn);  dz = dyg ys silu'(z).
  float* dys = dn;
  ops::silu_gate_backward(sv.ys, sv.pre, Ws, dyg, dys, dpre, Ws, N, di);
  // The scan's values v = dt x again, into yg's buffer (free from here): the forward's products, the same bits.
  float* v = yg;
  ops::mamba2_dt_scale_x(sv.dt, xbc, C, v, N, nh, Pd);
  const ops::ScalarDecayArgs<float> a = scan_args(xbc, v, sv.g, B, T, ds_, nullptr);
  // dC and dB land in their xBC slots (q/k strides = Cc).
  ops::scalar_decay_chunked_backward(a, sv.states, dys, nullptr,
                                     {.dq = dxbc + di + N_, .dk = dxbc + di, .dv = bb.dv, .dg = bb.dg}, bb.ws);
  const float* alog = P(off_alog_);
  // dx (the x slots of dxBC), the raw dt column's gradient and the per-token terms of dD, dA, d dt_bias.
  ops::mamba2_dt_backward(xbc, C, bb.dv, dys, sv.dt, P(off_D_), decay_rates().data(), bb.dg, dxbc, C,
                          dpre + 2 * di + 2 * N_, Ws, part, N, nh, Pd);
  // Per-head parameter gradients: fixed-order sums over tokens (deterministic whatever the thread count).
  for (i64 h = 0; h < nh; ++h) {
    double sD = 0, sA = 0, sB = 0;
    for (i64 n = 0; n < N; ++n) {
      sD += part[n * nh + h];
      sA += part[N * nh + n * nh + h];
      sB += part[2 * N * nh + n * nh + h];
    }
    const double A = -std::exp(static_cast<double>(alog[h]));
    G(off_D_)[h] += static_cast<float>(sD);
    G(off_alog_)[h] += static_cast<float>(sA * A);  // dA/dA_log = A
    G(off_dtb_)[h] += static_cast<float>(sB);
  }
  ops::causal_conv1d_backward(conv_args(sv.pre, B, T, ds_, nullptr), dxbc,
                              {.du = dpre + di, .dw = G(off_convw_), .dbias = G(off_convb_)});
  ops::linear_backward(x, P(off_in_), dpre, dx, G(off_in_), N, D_, Wi, false, Ws);
  arena.release_to(mark);
}

std::unique_ptr<MixerState> Mamba2Mixer::new_state(i64 B, i64 max_len) const {
  auto st = std::make_unique<Mamba2State>();
  st->B = B;
  st->conv.assign(static_cast<size_t>(B * (kConv - 1) * Cc()), 0.f);
  st->ssm.assign(static_cast<size_t>(B * nh_ * N_ * P_), 0.f);
  return st;
}

void Mamba2Mixer::step(const float* x, float* y, MixerState& state, i64 B) {
  auto& st = static_cast<Mamba2State&>(state);
  HLM_CHECK(B == st.B, "mamba2 step: batch {} but the state has {} rows", B, st.B);
  const i64 Wi = Win(), Ws = pre_stride(), C = Cc(), di = di_, nh = nh_, Pd = P_;
  if (max_span_ > 0 && st.pos > 0 && st.pos % max_span_ == 0) {
    std::fill(st.conv.begin(), st.conv.end(), 0.f);
    std::fill(st.ssm.begin(), st.ssm.end(), 0.f);
  }
  std::vector<float> pre(static_cast<size_t>(B * Ws)), xbc(static_cast<size_t>(B * C)),
      dt(static_cast<size_t>(B * nh)), g(static_cast<size_t>(B * nh)), v(static_cast<size_t>(B * di)),
      o(static_cast<size_t>(B * di)), rstd(static_cast<size_t>(B));
  ops::linear_forward(x, P(off_in_), pre.data(), B, D_, Wi, Ws);
  ops::causal_conv1d_step(conv_args(pre.data(), B, 1, nullptr, nullptr), st.conv.data(), xbc.data());
  ops::mamba2_dt_forward(pre.data() + 2 * di + 2 * N_, Ws, P(off_dtb_), decay_rates().data(), xbc.data(), C,
                         dt.data(), g.data(), v.data(), B, nh, Pd);
  ops::scalar_decay_step(scan_args(xbc.data(), v.data(), g.data(), B, 1, nullptr, nullptr), st.ssm.data(), o.data());
  ops::mamba2_skip_gate_forward(o.data(), xbc.data(), C, P(off_D_), pre.data(), Ws, o.data(), B, nh, Pd);
  ops::rmsnorm_forward(o.data(), P(off_norm_), o.data(), rstd.data(), B, di, kNormEps);
  ops::linear_forward(o.data(), P(off_out_), y, B, di, D_);
  st.pos++;
}

void Mamba2Mixer::prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) {
  auto& st = static_cast<Mamba2State&>(state);
  HLM_CHECK(B == st.B, "mamba2 prefill: batch {} but the state has {} rows", B, st.B);
  // A span block starting exactly at this call's first token drops the carried conv and SSM state.
  const bool reset0 = max_span_ > 0 && st.pos > 0 && st.pos % max_span_ == 0;
  const PrefillBuffers b = prefill_buffers(arena, B, T, max_span_ > 0);
  const int32_t* ds = span_doc_start(nullptr, B, T, st.pos, b.span);
  run(x, y, B, T, ds, reset0 ? nullptr : st.conv.data(), st.conv.data(), reset0 ? nullptr : st.ssm.data(), b.fin,
      b.run, arena);
  std::copy(b.fin, b.fin + st.ssm.size(), st.ssm.begin());
  st.pos += T;
}

}  // namespace hlm
