#include "mixers/lightning.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/fast_exp.h"
#include "ops/matmul.h"
#include "ops/rmsnorm.h"

namespace hlm {

namespace {

struct LightningState final : MixerState {
  i64 B = 0, pos = 0;
  std::vector<float> S;  // [B, H, hd, hd]
  i64 bytes() const override { return static_cast<i64>(S.size() * sizeof(float)); }
};

// Arena allocations are 64-byte aligned: each one may round up by up to 16 floats.
constexpr i64 kPad = 16;

inline i64 ints_as_floats(i64 n) { return (n * static_cast<i64>(sizeof(int32_t)) + 3) / 4; }

// Activations of one row of the fused projection: silu on q|k|v (3*HK), sigmoid on the gate (HK).
void activate_row(const float* pre, float* act, i64 HK) {
#pragma omp simd
  for (i64 i = 0; i < 3 * HK; ++i) act[i] = pre[i] / (1.f + ops::fast_exp(-pre[i]));
#pragma omp simd
  for (i64 i = 3 * HK; i < 4 * HK; ++i) act[i] = 1.f / (1.f + ops::fast_exp(-pre[i]));
}

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

ops::ScalarDecayArgs<float> LightningMixer::scan_args(const float* act, const float* g, i64 B, i64 T,
                                               const int32_t* doc_start, const float* init) const {
  const i64 HK = this->HK();
  ops::ScalarDecayArgs<float> a;
  a.B = B, a.T = T, a.H = H_, a.Hk = H_, a.K = hd_, a.V = hd_, a.chunk = chunk_, a.scale = 1.f;
  a.q_stride = a.k_stride = a.v_stride = 4 * HK;
  a.q = act, a.k = act + HK, a.v = act + 2 * HK, a.g = g;
  a.initial_state = init;
  a.doc_start = doc_start;
  return a;
}

i64 LightningMixer::saved_floats(i64 B, i64 T) const {
  const i64 N = B * T, NC = (T + chunk_ - 1) / chunk_;
  return 2 * N * 4 * HK() + N * H_ + N * HK() + N + B * H_ * NC * hd_ * hd_ + ints_as_floats(N) + 6 * kPad;
}

i64 LightningMixer::scratch_floats(i64 B, i64 T) const {
  const i64 N = B * T, NC = (T + chunk_ - 1) / chunk_;
  const i64 states = B * H_ * NC * hd_ * hd_;
  const i64 fwd = N * HK() + B * H_ * hd_ * hd_ + kPad * 2;  // u, final-state staging (prefill)
  // du, normalised o, u, d(projections), dg, kernel workspace (2x the chunk states).
  const i64 bwd = 3 * N * HK() + N * 4 * HK() + N * H_ + 2 * states + 6 * kPad;
  return std::max(fwd, bwd);
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
                         float* fin, Arena& arena) {
  const i64 N = B * T, HK = this->HK(), W4 = 4 * HK;
  pre_ = arena.floats(N * W4, "lightning projections");
  ops::linear_forward(x, P(off_w_), pre_, N, D_, W4);  // [N, 4 HK]: q | k | v | gate
  act_ = arena.floats(N * W4, "lightning activations");
  parallel_for(N, [&](i64 b, i64 e) {
    for (i64 n = b; n < e; ++n) activate_row(pre_ + n * W4, act_ + n * W4, HK);
  }, 16);
  g_ = arena.floats(N * H_, "lightning log decay");  // [N, H]
  for (i64 n = 0; n < N; ++n)
    for (i64 h = 0; h < H_; ++h) g_[n * H_ + h] = static_cast<float>(-slopes_[h]);
  ds_ = doc_start;
  const ops::ScalarDecayArgs<float> a = scan_args(act_, g_, B, T, doc_start, init);
  states_ = arena.floats(ops::scalar_decay_chunk_states_numel(a), "lightning chunk states");
  o_ = arena.floats(N * HK, "lightning core out");  // [N, H, hd]
  ops::scalar_decay_chunked_forward(a, o_, fin, states_);
  rstd_ = arena.floats(N, "lightning norm rstd");
  auto mark = arena.mark();
  float* u = arena.floats(N * HK, "lightning gated norm");  // RMSNorm(o) * sigmoid(gate), [N, HK]
  ops::rmsnorm_forward(o_, P(off_norm_), u, rstd_, N, HK, kNormEps);
  parallel_for(N, [&](i64 b, i64 e) {
    for (i64 n = b; n < e; ++n) {
      float* ur = u + n * HK;
      const float* sg = act_ + n * W4 + 3 * HK;
#pragma omp simd
      for (i64 i = 0; i < HK; ++i) ur[i] *= sg[i];
    }
  }, 16);
  ops::linear_forward(u, P(off_wo_), y, N, HK, D_);
  arena.release_to(mark);
}

void LightningMixer::forward(const float* x, float* y, const SeqInfo& s, Arena& arena) {
  const int32_t* ds = span_doc_start(s.doc_start, s.B, s.T, 0, arena);
  run(x, y, s.B, s.T, ds, nullptr, nullptr, arena);
}

void LightningMixer::backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) {
  const i64 B = s.B, T = s.T, N = B * T, HK = this->HK(), W4 = 4 * HK;
  auto mark = arena.mark();
  float* nrm = arena.floats(N * HK, "lightning d: normalised o");  // RMSNorm(o) * w, later d o
  float* u = arena.floats(N * HK, "lightning d: gated norm");
  float* du = arena.floats(N * HK, "lightning d: gated norm grad");
  float* dpre = arena.floats(N * W4, "lightning d: projections");  // [N, 4 HK]
  float* dg = arena.floats(N * H_, "lightning d: log decay");
  // Recompute u = RMSNorm(o) w * sigmoid(gate) for the o_proj weight gradient.
  parallel_for(N, [&](i64 b, i64 e) {
    const float* w = P(off_norm_);
    for (i64 n = b; n < e; ++n) {
      const float r = rstd_[n];
      const float* orow = o_ + n * HK;
      const float* sg = act_ + n * W4 + 3 * HK;
      float* nr = nrm + n * HK;
      float* ur = u + n * HK;
#pragma omp simd
      for (i64 i = 0; i < HK; ++i) {
        nr[i] = orow[i] * r * w[i];
        ur[i] = nr[i] * sg[i];
      }
    }
  }, 16);
  ops::linear_backward(u, P(off_wo_), dy, du, G(off_wo_), N, HK, D_);
  // u = n * sg:  d gate_pre = du n sg (1 - sg);  d n = du sg.
  parallel_for(N, [&](i64 b, i64 e) {
    for (i64 n = b; n < e; ++n) {
      const float* sg = act_ + n * W4 + 3 * HK;
      const float* nr = nrm + n * HK;
      float* dur = du + n * HK;
      float* dgate = dpre + n * W4 + 3 * HK;
#pragma omp simd
      for (i64 i = 0; i < HK; ++i) {
        dgate[i] = dur[i] * nr[i] * sg[i] * (1.f - sg[i]);
        dur[i] *= sg[i];
      }
    }
  }, 16);
  float* d_o = nrm;  // the normalised o is no longer needed
  ops::rmsnorm_backward(o_, P(off_norm_), rstd_, du, d_o, G(off_norm_), N, HK);
  const ops::ScalarDecayArgs<float> a = scan_args(act_, g_, B, T, ds_, nullptr);
  float* ws = arena.floats(ops::scalar_decay_backward_workspace_numel(a), "lightning d: scan workspace");
  // dq | dk | dv land in the q|k|v slots of dpre (same strides as act); dg is unused (constant decay).
  ops::scalar_decay_chunked_backward(a, states_, d_o, nullptr,
                                     {.dq = dpre, .dk = dpre + HK, .dv = dpre + 2 * HK, .dg = dg}, ws);
  // silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
  parallel_for(N, [&](i64 b, i64 e) {
    for (i64 n = b; n < e; ++n) {
      const float* pr = pre_ + n * W4;
      float* dr = dpre + n * W4;
#pragma omp simd
      for (i64 i = 0; i < 3 * HK; ++i) {
        const float s = 1.f / (1.f + ops::fast_exp(-pr[i]));
        dr[i] *= s * (1.f + pr[i] * (1.f - s));
      }
    }
  }, 16);
  ops::linear_backward(x, P(off_w_), dpre, dx, G(off_w_), N, D_, W4);
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
  for (i64 b = 0; b < B; ++b) activate_row(pre.data() + b * W4, act.data() + b * W4, HK);
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H_; ++h) g[b * H_ + h] = static_cast<float>(-slopes_[h]);
  ops::scalar_decay_step(scan_args(act.data(), g.data(), B, 1, nullptr, nullptr), st.S.data(), o.data());
  ops::rmsnorm_forward(o.data(), P(off_norm_), o.data(), rstd.data(), B, HK, kNormEps);
  for (i64 b = 0; b < B; ++b)
    for (i64 i = 0; i < HK; ++i) o[b * HK + i] *= act[b * W4 + 3 * HK + i];
  ops::linear_forward(o.data(), P(off_wo_), y, B, HK, D_);
  st.pos++;
}

void LightningMixer::prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) {
  auto& st = static_cast<LightningState&>(state);
  HLM_CHECK(B == st.B, "lightning prefill: batch {} but the state has {} rows", B, st.B);
  // A span block starting exactly at this call's first token drops the carried state.
  const bool reset0 = max_span_ > 0 && st.pos > 0 && st.pos % max_span_ == 0;
  const int32_t* ds = span_doc_start(nullptr, B, T, st.pos, arena);
  float* fin = arena.floats(static_cast<i64>(st.S.size()), "lightning prefill final state");
  run(x, y, B, T, ds, reset0 ? nullptr : st.S.data(), fin, arena);
  std::copy(fin, fin + st.S.size(), st.S.begin());
  st.pos += T;
}

}  // namespace hlm
