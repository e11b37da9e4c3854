#include "mixers/gdn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/arena_count.h"
#include "core/parallel.h"
#include "mixers/decay_init.h"
#include "ops/l2norm.h"
#include "ops/matmul.h"
#include "ops/mixer_gates.h"

namespace hlm {

namespace {

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

// beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) for N tokens; proj rows (`stride` apart) hold b at
// column c_b and a at c_b + H.
void gates_forward(const float* proj, i64 stride, i64 c_b, i64 N, i64 H, const float* alog, const float* dtb, float* g,
                   float* beta) {
  parallel_for(
      N,
      [&](i64 lo, i64 hi) {
        for (i64 n = lo; n < hi; ++n) {
          const float* r = proj + n * stride + c_b;
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
  c.B = B, c.T = T, c.C = 3 * HK(), c.W = kConv, c.u_stride = proj_stride(), c.silu = true;
  c.u = proj, c.w = P(off_conv_), c.initial_state = conv_init, c.doc_start = doc_start;
  return c;
}

ops::GatedDeltaArgs<float> GatedDeltaNetMixer::delta_shape(i64 B, i64 T, const int32_t* doc_start) const {
  ops::GatedDeltaArgs<float> a;
  a.B = B, a.T = T, a.H = H_, a.K = K_, a.V = K_, a.chunk = chunk_, a.doc_start = doc_start;
  return a;
}

ops::GatedDeltaArgs<float> GatedDeltaNetMixer::delta_args(const float* qkv, const float* g, const float* beta, i64 B,
                                                          i64 T, const int32_t* doc_start, const float* S_init) const {
  const i64 HK = this->HK();
  ops::GatedDeltaArgs<float> a = delta_shape(B, T, doc_start);
  a.q = qkv, a.k = qkv + HK, a.v = qkv + 2 * HK, a.q_stride = a.k_stride = a.v_stride = 3 * HK;
  a.g = g, a.beta = beta, a.initial_state = S_init;
  return a;
}

ops::GatedDeltaGrads<float> GatedDeltaNetMixer::delta_grads(float* dqkv, float* dg, float* dbeta) const {
  const i64 HK = this->HK();
  ops::GatedDeltaGrads<float> gr;
  gr.dq = dqkv, gr.dk = dqkv + HK, gr.dv = dqkv + 2 * HK, gr.dg = dg, gr.dbeta = dbeta;
  return gr;
}

void GatedDeltaNetMixer::qk_l2norm_forward(float* qkv, float* rq, float* rk, i64 N) const {
  const i64 HK = this->HK(), C3 = 3 * HK;
  const float qscale = 1.f / std::sqrt(static_cast<float>(K_));  // after the L2 norm (docs/algorithms.md §5.1)
  ops::l2norm_forward<float>(qkv, C3, qkv, C3, rq, N, H_, K_, kL2Eps, qscale);
  ops::l2norm_forward<float>(qkv + HK, C3, qkv + HK, C3, rk, N, H_, K_, kL2Eps, 1.f);
}

i64 GatedDeltaNetMixer::chunk_states_kept(i64 B, i64 T, const int32_t* doc_start) const {
  // Many short documents (or a short max span) mean more segments than the budget: then the backward
  // recomputes the entry states with one more scan instead.
  const i64 n = ops::gated_delta_chunk_states_numel(delta_shape(B, T, doc_start));
  return n <= chunk_state_budget(B, T) ? n : 0;
}

template <class Alloc>
GatedDeltaNetMixer::RunBuffers GatedDeltaNetMixer::run_buffers(Alloc& arena, i64 B, i64 T, i64 chunk_states) const {
  const i64 N = B * T, HK = this->HK();
  RunBuffers b;
  Saved& s = b.saved;
  s.proj = arena.floats(N * proj_stride(), "gdn proj");
  s.qkv = arena.floats(N * 3 * HK, "gdn qkv");
  s.rq = arena.floats(N * H_, "gdn q rstd");
  s.rk = arena.floats(N * H_, "gdn k rstd");
  s.g = arena.floats(N * H_, "gdn g");
  s.beta = arena.floats(N * H_, "gdn beta");
  if (chunk_states > 0) s.cs = arena.floats(chunk_states, "gdn chunk states");
  s.o = arena.floats(N * HK, "gdn o");
  s.orstd = arena.floats(N * H_, "gdn o_norm rstd");
  b.temp_mark = arena.mark();
  b.z = arena.floats(N * HK, "gdn gated norm");
  return b;
}

template <class Alloc>
GatedDeltaNetMixer::PrefillBuffers GatedDeltaNetMixer::prefill_buffers(Alloc& arena, i64 B, i64 T, bool span) const {
  PrefillBuffers b;
  b.span = span_buffer(arena, B, T, span);
  b.S0 = arena.floats(B * H_ * K_ * K_, "gdn prefill state");
  b.run = run_buffers(arena, B, T, 0);
  return b;
}

template <class Alloc>
GatedDeltaNetMixer::BackwardBuffers GatedDeltaNetMixer::backward_buffers(Alloc& arena, i64 B, i64 T) const {
  const i64 N = B * T, HK = this->HK();
  BackwardBuffers b;
  b.buf = arena.floats(N * HK, "gdn z / d_o");
  b.dz = arena.floats(N * HK, "gdn dz");
  b.dproj = arena.floats(N * proj_stride(), "gdn dproj");
  b.dqkv = arena.floats(N * 3 * HK, "gdn dqkv");
  b.dg = arena.floats(N * H_, "gdn dg");
  b.dbeta = arena.floats(N * H_, "gdn dbeta");
  // Doubles in the 64-byte-aligned float arena: two floats each.
  b.gate_terms = reinterpret_cast<double*>(arena.floats(2 * 2 * N * H_, "gdn gate-gradient terms"));
  return b;
}

ArenaUse GatedDeltaNetMixer::arena_use(i64 B, i64 T) const {
  // Forward as forward() lists it, in the worst case: a span set, every chunk state kept (the budget, which
  // they fill exactly without documents).
  return count_arena_use(
      [&](ArenaCount& c) {
        span_buffer(c, B, T, true);
        c.release_to(run_buffers(c, B, T, chunk_state_budget(B, T)).temp_mark);
      },
      [&](ArenaCount& c) { backward_buffers(c, B, T); }, [&](ArenaCount& c) { prefill_buffers(c, B, T, true); });
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
                             float* conv_fin, const float* S_init, float* S_fin, const RunBuffers& b, Arena& arena) {
  const i64 N = B * T, HK = H_ * K_, W = Wp(), S = proj_stride();
  const Saved& s = saved_ = b.saved;
  ds_ = doc_start;
  ops::linear_forward(x, P(off_w_), s.proj, N, D_, W, S);  // [N, Wp] in rows S apart: q | k | v | gp | b | a
  ops::causal_conv1d_forward(conv_args(s.proj, B, T, doc_start, conv_init), s.qkv, conv_fin);  // [N, 3HK]
  qk_l2norm_forward(s.qkv, s.rq, s.rk, N);
  gates_forward(s.proj, S, 4 * HK, N, H_, P(off_alog_), P(off_dtb_), s.g, s.beta);
  const ops::GatedDeltaArgs<float> a = delta_args(s.qkv, s.g, s.beta, B, T, doc_start, S_init);
  ops::gated_delta_chunked_forward(a, s.o, S_fin, s.cs);  // [N, H, K]
  ops::norm_silu_gate_forward(s.o, s.proj + 3 * HK, S, P(off_onorm_), s.orstd, true, b.z, N, H_, K_, kNormEps);
  ops::linear_forward(b.z, P(off_wo_), y, N, HK, D_);
  arena.release_to(b.temp_mark);
}

void GatedDeltaNetMixer::forward(const float* x, float* y, const SeqInfo& s, Arena& arena) {
  // The states kept depend on the documents the kernel sees: the span's when a span is set.
  int32_t* span = span_buffer(arena, s.B, s.T, max_span_ > 0);
  const int32_t* ds = span_doc_start(s.doc_start, s.B, s.T, 0, span);
  const RunBuffers b = run_buffers(arena, s.B, s.T, chunk_states_kept(s.B, s.T, ds));
  run(x, y, s.B, s.T, ds, nullptr, nullptr, nullptr, nullptr, b, arena);
}

void GatedDeltaNetMixer::backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) {
  const i64 B = s.B, T = s.T, N = B * T, HK = H_ * K_, W = Wp(), S = proj_stride(), C3 = 3 * HK;
  const Saved& sv = saved_;
  auto mark = arena.mark();
  const BackwardBuffers bb = backward_buffers(arena, B, T);
  float *buf = bb.buf, *dproj = bb.dproj, *dqkv = bb.dqkv, *dg = bb.dg, *dbeta = bb.dbeta;

  // Output: recompute z (cheaper than keeping it), then o_proj, gate and o_norm.
  ops::norm_silu_gate_forward(sv.o, sv.proj + 3 * HK, S, P(off_onorm_), sv.orstd, false, buf, N, H_, K_, kNormEps);
  ops::linear_backward(buf, P(off_wo_), dy, bb.dz, G(off_wo_), N, HK, D_);
  ops::norm_silu_gate_backward(sv.o, sv.proj + 3 * HK, S, P(off_onorm_), sv.orstd, bb.dz, buf, dproj + 3 * HK,
                               G(off_onorm_), N, H_, K_);

  ops::gated_delta_chunked_backward(delta_args(sv.qkv, sv.g, sv.beta, B, T, ds_, nullptr), sv.cs, buf, nullptr,
                                    delta_grads(dqkv, dg, dbeta));

  const float qscale = 1.f / std::sqrt(static_cast<float>(K_));
  ops::l2norm_backward<float>(sv.qkv, C3, sv.rq, dqkv, C3, dqkv, C3, N, H_, K_, qscale);
  ops::l2norm_backward<float>(sv.qkv + HK, C3, sv.rk, dqkv + HK, C3, dqkv + HK, C3, N, H_, K_, 1.f);

  // Gates: d b = dbeta beta (1 - beta); d a = dg (-exp(A_log)) sigmoid(a + dt_bias) = d dt_bias;
  // d A_log = dg g. The terms (three exps each) across threads, kept in double; the per-head sums then run serially
  // over tokens (N*H terms, fixed order: the same bits for any thread count).
  {
    const float* alog = P(off_alog_);
    const float* dtb = P(off_dtb_);
    double* da_t = bb.gate_terms;           // [N, H] d a
    double* dA_t = bb.gate_terms + N * H_;  // [N, H] dg g
    parallel_for(
        N,
        [&](i64 lo, i64 hi) {
          for (i64 n = lo; n < hi; ++n) {
            const float* r = sv.proj + n * S + 4 * HK;
            float* dr = dproj + n * S + 4 * HK;
            for (i64 h = 0; h < H_; ++h) {
              // beta (1 - beta) from the pre-activation in double: 1 - beta of the float beta cancels when beta ~ 1.
              const double be = sigmoid(r[h]), gg = dg[n * H_ + h];
              dr[h] = static_cast<float>(dbeta[n * H_ + h] * be * (1.0 - be));
              const double da = -gg * std::exp(static_cast<double>(alog[h])) * sigmoid(double(r[H_ + h]) + dtb[h]);
              dr[H_ + h] = static_cast<float>(da);
              da_t[n * H_ + h] = da;
              dA_t[n * H_ + h] = gg * sv.g[n * H_ + h];
            }
          }
        },
        256);
    std::vector<double> dA(static_cast<size_t>(H_), 0.0), dB(static_cast<size_t>(H_), 0.0);
    for (i64 n = 0; n < N; ++n)
      for (i64 h = 0; h < H_; ++h) {
        dB[h] += da_t[n * H_ + h];
        dA[h] += dA_t[n * H_ + h];
      }
    for (i64 h = 0; h < H_; ++h) {
      G(off_alog_)[h] += static_cast<float>(dA[h]);
      G(off_dtb_)[h] += static_cast<float>(dB[h]);
    }
  }

  // First 3HK columns of dproj.
  ops::causal_conv1d_backward(conv_args(sv.proj, B, T, ds_, nullptr), dqkv, {.du = dproj, .dw = G(off_conv_)});

  ops::linear_backward(x, P(off_w_), dproj, dx, G(off_w_), N, D_, W, false, S);
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
  const i64 HK = H_ * K_, W = Wp(), S = proj_stride(), C3 = 3 * HK;
  if (max_span_ > 0 && st.pos > 0 && st.pos % max_span_ == 0) {  // probe: a new span block starts here
    std::fill(st.conv.begin(), st.conv.end(), 0.f);
    std::fill(st.S.begin(), st.S.end(), 0.f);
  }
  st.work.resize(static_cast<size_t>(B * (S + C3 + 3 * H_ + 2 * HK)));
  float* proj = st.work.data();  // [B, Wp] in rows S apart
  float* qkv = proj + B * S;     // [B, 3HK]
  float* rs = qkv + B * C3;      // [B, H] (q, k, then o_norm rstd; only o's is used)
  float* g = rs + B * H_;        // [B, H]
  float* beta = g + B * H_;      // [B, H]
  float* o = beta + B * H_;      // [B, HK]
  float* z = o + B * HK;         // [B, HK]
  ops::linear_forward(x, P(off_w_), proj, B, D_, W, S);
  ops::causal_conv1d_step(conv_args(proj, B, 1, nullptr, nullptr), st.conv.data(), qkv);
  qk_l2norm_forward(qkv, rs, rs, B);
  gates_forward(proj, S, 4 * HK, B, H_, P(off_alog_), P(off_dtb_), g, beta);
  ops::gated_delta_step(delta_args(qkv, g, beta, B, 1, nullptr, nullptr), st.S.data(), o);
  ops::norm_silu_gate_forward(o, proj + 3 * HK, S, P(off_onorm_), rs, true, z, B, H_, K_, kNormEps);
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
  const PrefillBuffers b = prefill_buffers(arena, B, T, max_span_ > 0);
  const int32_t* ds = span_doc_start(nullptr, B, T, st.pos, b.span);
  // The kernel reads the initial state and writes the final one; give it a private copy of the former.
  std::copy(st.S.begin(), st.S.end(), b.S0);
  run(x, y, B, T, ds, st.conv.data(), st.conv.data(), b.S0, st.S.data(), b.run, arena);
  arena.release_to(mark);
  st.pos += T;
}

}  // namespace hlm
