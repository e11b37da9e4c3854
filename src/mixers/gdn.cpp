#include "mixers/gdn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "mixers/decay_init.h"
#include "ops/l2norm.h"
#include "ops/matmul.h"
#include "ops/mixer_gates.h"

namespace hlm {

namespace {

constexpr i64 kPad = 16;  // arena allocations round up to 64 bytes
inline i64 ints_as_floats(i64 n) { return (n * static_cast<i64>(sizeof(int32_t)) + 3) / 4; }

// The gates beta and g in double (only H per token); the output gate is ops/mixer_gates.h.
inline double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }  // torch's threshold
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct GdnState final : MixerState {
  i64 B = 0, pos = 0;
  std::vector<float> conv;  // [B, 3, 3HK]  the convs' last 3 inputs, oldest first
  std::vector<float> S;     // [B, H, K, K] recurrent state (fla layout)
  std::vector<float> work;  // step()'s per-token buffers (no allocation per decoded token); not state
  i64 bytes() const override { return static_cast<i64>((conv.size() + S.size()) * sizeof(float)); }
};

// beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) for N tokens; proj rows [N, Wp] hold b at column
// c_b and a at c_b + H.
void gates_forward(const float* proj, i64 Wp, i64 c_b, i64 N, i64 H, const float* alog, const float* dtb, float* g,
                   float* beta) {
  parallel_for(
      N,
      [&](i64 lo, i64 hi) {
        for (i64 n = lo; n < hi; ++n) {
          const float* r = proj + n * Wp + c_b;
          for (i64 h = 0; h < H; ++h) {
            beta[n * H + h] = static_cast<float>(sigmoid(r[h]));
            g[n * H + h] =
                static_cast<float>(-std::exp(static_cast<double>(alog[h])) * softplus(double(r[H + h]) + dtb[h]));
          }
        }
      },
      256);
}

}  // namespace

GatedDeltaNetMixer::GatedDeltaNetMixer(const MixerSpec& spec, ParamRegistry& reg) {
  const auto& t = spec.type;
  D_ = spec.d_model;
  H_ = t.n_heads;
  a_range_ = t.a_init_range;
  dt_range_ = t.dt_init_range;
  K_ = t.head_dim;
  chunk_ = spec.chunk_size;
  HLM_CHECK(H_ >= 1 && K_ >= 1 && chunk_ >= 1, "GatedDeltaNetMixer: layer {} needs n_heads, head_dim, chunk_size >= 1 "
            "(got {}, {}, {})", spec.layer, H_, K_, chunk_);
  const std::string p = spec.name_prefix + "linear_attn.";
  const double in_std = spec.init_std;
  const i64 HK = H_ * K_;
  // Six projections back to back: one [4HK + 2H, D] matmul.
  off_w_ = reg.info(reg.add(p + "q_proj.weight", {HK, D_}, Init::Normal, in_std)).offset;
  reg.add(p + "k_proj.weight", {HK, D_}, Init::Normal, in_std, 0, true, true);
  reg.add(p + "v_proj.weight", {HK, D_}, Init::Normal, in_std, 0, true, true);
  reg.add(p + "g_proj.weight", {HK, D_}, Init::Normal, in_std, 0, true, true);
  reg.add(p + "b_proj.weight", {H_, D_}, Init::Normal, in_std, 0, true, true);
  reg.add(p + "a_proj.weight", {H_, D_}, Init::Normal, in_std, 0, true, true);
  // Three convs back to back: one depthwise conv over 3HK channels. U(-1/sqrt(4), 1/sqrt(4)).
  off_conv_ = reg.info(reg.add(p + "q_conv1d.weight", {HK, 1, kConv}, Init::Uniform, -0.5, 0.5)).offset;
  reg.add(p + "k_conv1d.weight", {HK, 1, kConv}, Init::Uniform, -0.5, 0.5, true, true);
  reg.add(p + "v_conv1d.weight", {HK, 1, kConv}, Init::Uniform, -0.5, 0.5, true, true);
  off_alog_ = reg.info(reg.add(p + "A_log", {H_}, Init::Custom, 0, 0, false)).offset;
  off_dtb_ = reg.info(reg.add(p + "dt_bias", {H_}, Init::Custom, 0, 0, false)).offset;
  off_onorm_ = reg.info(reg.add(p + "o_norm.weight", {K_}, Init::Ones, 0, 0, false)).offset;
  off_wo_ = reg.info(reg.add(p + "o_proj.weight", {D_, HK}, Init::Normal, spec.out_proj_init_std)).offset;
}

void GatedDeltaNetMixer::init_custom(Rng& rng) {
  // fla: A ~ U[0, 16], then dt ~ exp(U[ln 1e-3, ln 0.1]) (mixers/decay_init.h).
  init_a_log(rng, a_range_, init_view(off_alog_), H_);
  init_dt_bias(rng, dt_range_, init_view(off_dtb_), H_);
}

i64 GatedDeltaNetMixer::chunk_state_budget(i64 B, i64 T) const {
  return B * H_ * ((T + chunk_ - 1) / chunk_) * K_ * K_;
}

ops::CausalConv1dArgs<float> GatedDeltaNetMixer::conv_args(const float* proj, i64 B, i64 T, const int32_t* doc_start,
                                                    const float* conv_init) const {
  ops::CausalConv1dArgs<float> c;
  c.B = B, c.T = T, c.C = 3 * HK(), c.W = kConv, c.u_stride = Wp(), c.silu = true;
  c.u = proj, c.w = P(off_conv_), c.initial_state = conv_init, c.doc_start = doc_start;
  return c;
}

ops::GatedDeltaArgs<float> GatedDeltaNetMixer::delta_args(const float* qkv, const float* g, const float* beta, i64 B,
                                                          i64 T, const int32_t* doc_start, const float* S_init) const {
  const i64 HK = this->HK();
  ops::GatedDeltaArgs<float> a;
  a.B = B, a.T = T, a.H = H_, a.K = K_, a.V = K_, a.chunk = chunk_;
  a.q = qkv, a.k = qkv + HK, a.v = qkv + 2 * HK, a.q_stride = a.k_stride = a.v_stride = 3 * HK;
  a.g = g, a.beta = beta, a.initial_state = S_init, a.doc_start = doc_start;
  return a;
}

void GatedDeltaNetMixer::qk_l2norm_forward(float* qkv, float* rq, float* rk, i64 N) const {
  const i64 HK = this->HK(), C3 = 3 * HK;
  const float qscale = 1.f / std::sqrt(static_cast<float>(K_));  // after the L2 norm (docs/algorithms.md §5.1)
  ops::l2norm_forward<float>(qkv, C3, qkv, C3, rq, N, H_, K_, kL2Eps, qscale);
  ops::l2norm_forward<float>(qkv + HK, C3, qkv + HK, C3, rk, N, H_, K_, kL2Eps, 1.f);
}

i64 GatedDeltaNetMixer::saved_floats(i64 B, i64 T) const {
  const i64 N = B * T;
  // proj, qkv, o, five [N, H] vectors, chunk states, doc_start (max span).
  return N * Wp() + N * 3 * HK() + N * HK() + 5 * N * H_ + chunk_state_budget(B, T) + ints_as_floats(N) + 10 * kPad;
}

i64 GatedDeltaNetMixer::scratch_floats(i64 B, i64 T) const {
  const i64 N = B * T;
  const i64 fwd = N * HK() + B * H_ * K_ * K_ + 2 * kPad;  // gated norm output; prefill's state copy
  const i64 bwd = 2 * N * HK() + N * Wp() + N * 3 * HK() + 2 * N * H_ + 6 * kPad;  // z|d_o, dz, dproj, dqkv, dg, dbeta
  return std::max(fwd, bwd);
}

FlopCount GatedDeltaNetMixer::flops_per_token(i64 T) const {
  FlopCount f;
  f.matmul = 2.0 * (static_cast<double>(Wp()) * D_ + static_cast<double>(D_) * HK());
  // Chunked gated delta rule per head (docs/gated_delta.md §3.5 at K = V): 4C(K + V) + 6KV, plus the
  // depthwise conv (2 * width per channel).
  const double C = static_cast<double>(std::min(chunk_, std::max<i64>(T, 1))), K = static_cast<double>(K_);
  f.core = static_cast<double>(H_) * (8.0 * C * K + 6.0 * K * K) + 2.0 * kConv * 3.0 * HK();
  return f;
}

void GatedDeltaNetMixer::run(const float* x, float* y, i64 B, i64 T, const int32_t* doc_start, const float* conv_init,
                             float* conv_fin, const float* S_init, float* S_fin, bool save_states, Arena& arena) {
  const i64 N = B * T, HK = H_ * K_, W = Wp(), C3 = 3 * HK;
  ds_ = doc_start;
  proj_ = arena.floats(N * W, "gdn proj");
  ops::linear_forward(x, P(off_w_), proj_, N, D_, W);  // [N, Wp]: q | k | v | gp | b | a

  qkv_ = arena.floats(N * C3, "gdn qkv");
  ops::causal_conv1d_forward(conv_args(proj_, B, T, doc_start, conv_init), qkv_, conv_fin);  // [N, 3HK]

  rq_ = arena.floats(N * H_, "gdn q rstd");
  rk_ = arena.floats(N * H_, "gdn k rstd");
  qk_l2norm_forward(qkv_, rq_, rk_, N);

  g_ = arena.floats(N * H_, "gdn g");
  beta_ = arena.floats(N * H_, "gdn beta");
  gates_forward(proj_, W, 4 * HK, N, H_, P(off_alog_), P(off_dtb_), g_, beta_);

  const ops::GatedDeltaArgs<float> a = delta_args(qkv_, g_, beta_, B, T, doc_start, S_init);
  cs_ = nullptr;
  if (save_states) {
    // Many short documents (or a short max span) mean more segments than the budget: then the backward
    // recomputes the entry states with one more scan instead.
    const i64 n = ops::gated_delta_chunk_states_numel(a);
    if (n <= chunk_state_budget(B, T)) cs_ = arena.floats(n, "gdn chunk states");
  }
  o_ = arena.floats(N * HK, "gdn o");
  ops::gated_delta_chunked_forward(a, o_, S_fin, cs_);  // [N, H, K]

  orstd_ = arena.floats(N * H_, "gdn o_norm rstd");
  auto mark = arena.mark();
  float* z = arena.floats(N * HK, "gdn gated norm");
  ops::norm_silu_gate_forward(o_, proj_ + 3 * HK, W, P(off_onorm_), orstd_, true, z, N, H_, K_, kNormEps);
  ops::linear_forward(z, P(off_wo_), y, N, HK, D_);
  arena.release_to(mark);
}

void GatedDeltaNetMixer::forward(const float* x, float* y, const SeqInfo& s, Arena& arena) {
  const int32_t* ds = span_doc_start(s.doc_start, s.B, s.T, 0, arena);
  run(x, y, s.B, s.T, ds, nullptr, nullptr, nullptr, nullptr, true, arena);
}

void GatedDeltaNetMixer::backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) {
  const i64 B = s.B, T = s.T, N = B * T, HK = H_ * K_, W = Wp(), C3 = 3 * HK;
  auto mark = arena.mark();
  float* buf = arena.floats(N * HK, "gdn z / d_o");  // [N, HK]
  float* dz = arena.floats(N * HK, "gdn dz");        // [N, HK]
  float* dproj = arena.floats(N * W, "gdn dproj");   // [N, Wp]
  float* dqkv = arena.floats(N * C3, "gdn dqkv");    // [N, 3HK]
  float* dg = arena.floats(N * H_, "gdn dg");        // [N, H]
  float* dbeta = arena.floats(N * H_, "gdn dbeta");  // [N, H]

  // Output: recompute z (cheaper than keeping it), then o_proj, gate and o_norm.
  ops::norm_silu_gate_forward(o_, proj_ + 3 * HK, W, P(off_onorm_), orstd_, false, buf, N, H_, K_, kNormEps);
  ops::linear_backward(buf, P(off_wo_), dy, dz, G(off_wo_), N, HK, D_);
  ops::norm_silu_gate_backward(o_, proj_ + 3 * HK, W, P(off_onorm_), orstd_, dz, buf, dproj + 3 * HK, G(off_onorm_), N,
                               H_, K_);

  ops::GatedDeltaGrads<float> gr;
  gr.dq = dqkv, gr.dk = dqkv + HK, gr.dv = dqkv + 2 * HK, gr.dg = dg, gr.dbeta = dbeta;
  ops::gated_delta_chunked_backward(delta_args(qkv_, g_, beta_, B, T, ds_, nullptr), cs_, buf, nullptr, gr);

  const float qscale = 1.f / std::sqrt(static_cast<float>(K_));
  ops::l2norm_backward<float>(qkv_, C3, rq_, dqkv, C3, dqkv, C3, N, H_, K_, qscale);
  ops::l2norm_backward<float>(qkv_ + HK, C3, rk_, dqkv + HK, C3, dqkv + HK, C3, N, H_, K_, 1.f);

  // Gates: d b = dbeta beta (1 - beta); d a = dg (-exp(A_log)) sigmoid(a + dt_bias) = d dt_bias;
  // d A_log = dg g. The per-head sums run serially over tokens (N*H terms, fixed order).
  {
    const float* alog = P(off_alog_);
    const float* dtb = P(off_dtb_);
    std::vector<double> dA(static_cast<size_t>(H_), 0.0), dB(static_cast<size_t>(H_), 0.0);
    for (i64 n = 0; n < N; ++n) {
      const float* r = proj_ + n * W + 4 * HK;
      float* dr = dproj + n * W + 4 * HK;
      for (i64 h = 0; h < H_; ++h) {
        // beta (1 - beta) from the pre-activation in double: 1 - beta of the float beta cancels when beta ~ 1.
        const double be = sigmoid(r[h]), gg = dg[n * H_ + h];
        dr[h] = static_cast<float>(dbeta[n * H_ + h] * be * (1.0 - be));
        const double da = -gg * std::exp(static_cast<double>(alog[h])) * sigmoid(double(r[H_ + h]) + dtb[h]);
        dr[H_ + h] = static_cast<float>(da);
        dB[h] += da;
        dA[h] += gg * g_[n * H_ + h];
      }
    }
    for (i64 h = 0; h < H_; ++h) {
      G(off_alog_)[h] += static_cast<float>(dA[h]);
      G(off_dtb_)[h] += static_cast<float>(dB[h]);
    }
  }

  // First 3HK columns of dproj.
  ops::causal_conv1d_backward(conv_args(proj_, B, T, ds_, nullptr), dqkv, {.du = dproj, .dw = G(off_conv_)});

  ops::linear_backward(x, P(off_w_), dproj, dx, G(off_w_), N, D_, W);
  arena.release_to(mark);
}

std::unique_ptr<MixerState> GatedDeltaNetMixer::new_state(i64 B, i64 max_len) const {
  auto st = std::make_unique<GdnState>();
  st->B = B;
  st->conv.assign(static_cast<size_t>(B * (kConv - 1) * 3 * HK()), 0.f);
  st->S.assign(static_cast<size_t>(B * H_ * K_ * K_), 0.f);
  return st;
}

void GatedDeltaNetMixer::step(const float* x, float* y, MixerState& state, i64 B) {
  auto& st = static_cast<GdnState&>(state);
  HLM_CHECK(B == st.B, "gdn step: batch {} but the state has {} rows", B, st.B);
  const i64 HK = H_ * K_, W = Wp(), C3 = 3 * HK;
  if (max_span_ > 0 && st.pos > 0 && st.pos % max_span_ == 0) {  // probe: a new span block starts here
    std::fill(st.conv.begin(), st.conv.end(), 0.f);
    std::fill(st.S.begin(), st.S.end(), 0.f);
  }
  st.work.resize(static_cast<size_t>(B * (W + C3 + 3 * H_ + 2 * HK)));
  float* proj = st.work.data();  // [B, Wp]
  float* qkv = proj + B * W;     // [B, 3HK]
  float* rs = qkv + B * C3;      // [B, H] (q, k, then o_norm rstd; only o's is used)
  float* g = rs + B * H_;        // [B, H]
  float* beta = g + B * H_;      // [B, H]
  float* o = beta + B * H_;      // [B, HK]
  float* z = o + B * HK;         // [B, HK]
  ops::linear_forward(x, P(off_w_), proj, B, D_, W);
  ops::causal_conv1d_step(conv_args(proj, B, 1, nullptr, nullptr), st.conv.data(), qkv);
  qk_l2norm_forward(qkv, rs, rs, B);
  gates_forward(proj, W, 4 * HK, B, H_, P(off_alog_), P(off_dtb_), g, beta);
  ops::gated_delta_step(delta_args(qkv, g, beta, B, 1, nullptr, nullptr), st.S.data(), o);
  ops::norm_silu_gate_forward(o, proj + 3 * HK, W, P(off_onorm_), rs, true, z, B, H_, K_, kNormEps);
  ops::linear_forward(z, P(off_wo_), y, B, HK, D_);
  st.pos++;
}

void GatedDeltaNetMixer::prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) {
  auto& st = static_cast<GdnState&>(state);
  HLM_CHECK(B == st.B, "gdn prefill: batch {} but the state has {} rows", B, st.B);
  if (max_span_ > 0 && st.pos > 0 && st.pos % max_span_ == 0) {
    std::fill(st.conv.begin(), st.conv.end(), 0.f);
    std::fill(st.S.begin(), st.S.end(), 0.f);
  }
  auto mark = arena.mark();
  const int32_t* ds = span_doc_start(nullptr, B, T, st.pos, arena);
  // The kernel reads the initial state and writes the final one; give it a private copy of the former.
  float* S0 = arena.floats(static_cast<i64>(st.S.size()), "gdn prefill state");
  std::copy(st.S.begin(), st.S.end(), S0);
  run(x, y, B, T, ds, st.conv.data(), st.conv.data(), S0, st.S.data(), false, arena);
  arena.release_to(mark);
  st.pos += T;
}

}  // namespace hlm
