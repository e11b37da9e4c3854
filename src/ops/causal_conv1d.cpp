#include "ops/causal_conv1d.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/fast_exp.h"

namespace hlm::ops {
namespace {

// sigmoid, vectorisable: the branch-free fast_exp for float, std::exp for double (reference precision).
#pragma omp declare simd
inline float sigmoid_v(float x) { return 1.f / (1.f + fast_exp(-x)); }
inline double sigmoid_v(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Tasks per thread so that each thread gets at least ~32K multiply-adds: tiny problems (decode steps, tests)
// stay on one thread instead of paying for a parallel region.
inline i64 min_tasks(i64 work_per_task) { return std::max<i64>(1, (i64{1} << 15) / std::max<i64>(1, work_per_task)); }

constexpr i64 kMaxW = 16;  // widths the kernels accept (the window is held in registers)
constexpr i64 kTile = 32;    // tokens per span; dw / dbias are summed in Real over one span, then in double
constexpr i64 kBlock = 256;  // channels per backward task (vector groups taking turns over a tile)

template <typename Real>
std::string shape_str(const CausalConv1dArgsT<Real>& a) {
  return fmt::format("B={} T={} C={} W={} u_row={}", a.B, a.T, a.C, a.W, a.u_row);
}

template <typename Real>
struct ConvGeo {
  i64 B, T, C, W, ur;
  bool silu;
  const Real *u, *w, *bias, *init;
  const int32_t* ds;
  std::vector<Real> wt;    // [W, C]: w transposed so that the inner loops run over contiguous channels
  std::vector<Real> zero;  // [C] zeros: read for taps outside the document (and for no bias)

  i64 lo(i64 b, i64 t) const { return ds ? ds[b * T + t] : 0; }
  // Row holding input position s (may be negative) as seen by output token t; nullptr = zero.
  const Real* src(i64 b, i64 t, i64 s) const {
    const i64 l = lo(b, t);
    if (s >= 0) return s >= l ? u + (b * T + s) * ur : nullptr;
    return (l == 0 && init) ? init + (b * (W - 1) + s + W - 1) * C : nullptr;
  }
  // The W input rows of output token (b, t), tap j = input position t-W+1+j (the zero row where the input is
  // zero): the document test runs once per tap and token, never per channel.
  void taps(i64 b, i64 t, const Real** p) const {
    for (i64 j = 0; j < W; ++j) {
      const Real* r = src(b, t, t - W + 1 + j);
      p[j] = r ? r : zero.data();
    }
  }
};

template <typename Real>
ConvGeo<Real> resolve(const CausalConv1dArgsT<Real>& a, const char* op) {
  HLM_CHECK(a.B >= 1 && a.T >= 1 && a.C >= 1 && a.W >= 1, "{}: sizes must be positive ({})", op, shape_str(a));
  const i64 ur = a.u_row ? a.u_row : a.C;
  HLM_CHECK(ur >= a.C, "{}: u_row must be >= C ({})", op, shape_str(a));
  HLM_CHECK(a.u && a.w, "{}: u and w are required ({})", op, shape_str(a));
  HLM_CHECK(a.W <= kMaxW, "{}: width W must be <= {} ({})", op, kMaxW, shape_str(a));
  if (a.doc_start) {
    for (i64 b = 0; b < a.B; ++b)
      for (i64 t = 0; t < a.T; ++t) {
        const i64 d = a.doc_start[b * a.T + t];
        const bool valid = t == 0 ? d == 0 : (d == t || d == a.doc_start[b * a.T + t - 1]);
        HLM_CHECK(valid, "{}: doc_start[{}] = {} is not a document start for token {} of row {} ({})", op, b * a.T + t,
                  d, t, b, shape_str(a));
      }
  }
  ConvGeo<Real> G{a.B, a.T, a.C, a.W, ur, a.silu, a.u, a.w, a.bias, a.initial_state, a.doc_start, {}, {}};
  G.wt.resize(a.W * a.C);
  for (i64 c = 0; c < a.C; ++c)
    for (i64 j = 0; j < a.W; ++j) G.wt[j * a.C + c] = a.w[c * a.W + j];
  G.zero.assign(a.C, Real(0));
  return G;
}

// y = silu(x) = x * sigmoid(x), in place.
template <typename Real>
void silu_inplace(Real* __restrict x, i64 n) {
#pragma omp simd
  for (i64 c = 0; c < n; ++c) x[c] *= sigmoid_v(x[c]);
}

// The backward runs over one row b and one group of kLanes<Real> channels in time order, with the conv window
// (the last W-1 inputs), the pending du rows and the dw / dbias sums held in vector registers (GCC vector
// extensions): each token's input, dy and du are read or written once, with no per-channel branch.
// Documents: at a document start the window is cleared (inputs before the start are zero).
template <typename Real>
constexpr int kLanes = 32 / static_cast<int>(sizeof(Real));  // one 32-byte vector (GCC prefers 256-bit AVX)
template <typename Real>
struct VecOf {
  typedef Real type __attribute__((vector_size(32)));
};
template <typename Real>
using Vec = typename VecOf<Real>::type;

// nl <= kLanes channels from p (the rest zero) / to p.
template <typename Real>
inline Vec<Real> vload(const Real* p, int nl) {
  Vec<Real> v = {};
  if (nl == kLanes<Real>)
    std::memcpy(&v, p, sizeof v);  // one unaligned vector load
  else
    std::memcpy(&v, p, sizeof(Real) * static_cast<size_t>(nl));
  return v;
}
template <typename Real>
inline void vstore(Real* p, const Vec<Real>& v, int nl) {
  if (nl == kLanes<Real>)
    std::memcpy(p, &v, sizeof v);
  else
    std::memcpy(p, &v, sizeof(Real) * static_cast<size_t>(nl));
}
template <typename Real>
inline Vec<Real> vsigmoid(Vec<Real> x) {
  alignas(32) Real a[kLanes<Real>];
  std::memcpy(a, &x, sizeof x);
#pragma omp simd
  for (int i = 0; i < kLanes<Real>; ++i) a[i] = sigmoid_v(a[i]);
  std::memcpy(&x, a, sizeof x);
  return x;
}

// Asks for rows [t0, t1) of row b's tokens, channels [c0, c0+n), of a [B*T, stride] buffer: the strided
// rows of a channel block are not something the hardware prefetcher predicts.
template <typename Real>
inline void prefetch_rows(const Real* base, i64 stride, i64 T, i64 b, i64 t0, i64 t1, i64 c0, i64 n) {
  for (i64 t = t0; t < t1; ++t) {
    const char* r = reinterpret_cast<const char*>(base + (b * T + t) * stride + c0);
    for (i64 off = 0; off < n * static_cast<i64>(sizeof(Real)); off += 64) __builtin_prefetch(r + off);
  }
}

// Stores the du of position s (a channel group of row b) as seen from a token whose document starts at l:
// positions before l belong to another document (dropped), negative ones are conv-state slots.
template <typename Real>
inline void put_du(const ConvGeo<Real>& G, Real* du, Real* dinit, i64 b, i64 c0, int nl, i64 s, i64 l,
                   const Vec<Real>& v) {
  if (s >= l)
    vstore(du + (b * G.T + s) * G.ur + c0, v, nl);
  else if (s < 0 && l == 0 && dinit)
    vstore(dinit + (b * (G.W - 1) + s + G.W - 1) * G.C + c0, v, nl);
}

// Forward of tokens [lo, hi) of the flattened [B*T], all channels: one pass over the contiguous channels of
// each token (rows stream through the cache in order). KW > 0: the width as a constant.
template <typename Real, int KW, bool SILU>
void forward_rows(const ConvGeo<Real>& G, Real* y, i64 lo, i64 hi) {
  const i64 W = KW > 0 ? KW : G.W, C = G.C;
  const Real* p[kMaxW];
  const Real* __restrict bb = G.bias ? G.bias : G.zero.data();
  const Real* __restrict wt = G.wt.data();
  for (i64 bt = lo; bt < hi; ++bt) {
    G.taps(bt / G.T, bt % G.T, p);
    Real* __restrict yr = y + bt * C;
#pragma omp simd
    for (i64 c = 0; c < C; ++c) {
      Real x = bb[c];
      for (i64 j = 0; j < W; ++j) x += wt[j * C + c] * p[j][c];
      yr[c] = SILU ? x * sigmoid_v(x) : x;
    }
  }
}

// State of one channel group of one row between token spans. KW > 0: the width as a constant (the tap loops
// unroll and a span keeps everything in registers); KW = 0: any width up to kMaxW.
template <typename Real, int KW>
struct LaneState {
  static constexpr i64 kCap = KW > 0 ? KW : kMaxW;
  using V = Vec<Real>;
  V w[kCap], bias;  // w[:, j], bias of these channels
  V x[kCap];        // x[k-1] = input at position t-k, k = 1..W-1 (t = the next token)
  V pend[kCap];     // backward: pend[i] = du of position t-1-i so far
  V acc[kCap + 1];  // backward: dw taps, then dbias, since the last flush
  i64 l = 0;        // document start of the last token seen

  // Channels [c0, c0+nl) of row b; the window starts as the conv state (slot W-1-k) or zeros.
  LaneState(const ConvGeo<Real>& G, i64 W, i64 b, i64 c0, int nl) {
    for (i64 j = 0; j < W; ++j) w[j] = vload(G.wt.data() + j * G.C + c0, nl);
    bias = G.bias ? vload(G.bias + c0, nl) : V{};
    for (i64 k = 1; k < W; ++k) x[k - 1] = G.init ? vload(G.init + (b * (W - 1) + W - 1 - k) * G.C + c0, nl) : V{};
    for (i64 i = 0; i < kCap; ++i) pend[i] = V{};
    for (i64 i = 0; i <= kCap; ++i) acc[i] = V{};
  }
};

// Backward over tokens [t0, t1) of a channel group, in time order:
//   dpre = dy * silu'(pre) (silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)), pre recomputed from the window;
//   acc[j] += dpre * tap_j (dw), acc[W] += dpre (dbias);
//   du: token t adds w[:, W-1-k] dpre to position t-k (k = 0..W-1). Position t-(W-1) is complete after token
//   t and is stored, as are the pending positions at a document end (here) and at the row end (caller).
//   Positions before the token's document start are dropped; negative ones (first document) are the
//   conv-state slots.
template <typename Real, int KW, bool SILU>
void backward_span(const ConvGeo<Real>& G, const Real* dy, Real* du, Real* dinit, i64 b, i64 c0, int nl, i64 t0,
                   i64 t1, LaneState<Real, KW>& st) {
  using V = Vec<Real>;
  const i64 W = KW > 0 ? KW : G.W, T = G.T, C = G.C;
  LaneState<Real, KW> s = st;
  for (i64 t = t0; t < t1; ++t) {
    if (t > 0 && G.lo(b, t) == t) {
      for (i64 i = 0; i + 1 < W; ++i) put_du(G, du, dinit, b, c0, nl, t - 1 - i, s.l, s.pend[i]);
      for (i64 i = 0; i + 1 < W; ++i) s.pend[i] = V{};
      for (i64 k = 1; k < W; ++k) s.x[k - 1] = V{};
      s.l = t;
    }
    const V x0 = vload(G.u + (b * T + t) * G.ur + c0, nl);
    V dp = vload(dy + (b * T + t) * C + c0, nl);
    if (SILU) {
      V p = s.bias + s.w[W - 1] * x0;
      for (i64 k = 1; k < W; ++k) p += s.w[W - 1 - k] * s.x[k - 1];
      const V sg = vsigmoid<Real>(p);
      dp *= sg * (Real(1) + p * (Real(1) - sg));
    }
    s.acc[W] += dp;
    s.acc[W - 1] += dp * x0;
    for (i64 k = 1; k < W; ++k) s.acc[W - 1 - k] += dp * s.x[k - 1];
    const V done = (W > 1 ? s.pend[W - 2] : V{}) + s.w[0] * dp;  // position t-(W-1)
    for (i64 i = W - 2; i >= 1; --i) s.pend[i] = s.pend[i - 1] + s.w[W - 1 - i] * dp;
    if (W > 1) s.pend[0] = s.w[W - 1] * dp;
    put_du(G, du, dinit, b, c0, nl, t - (W - 1), s.l, done);
    for (i64 k = W - 1; k > 1; --k) s.x[k - 1] = s.x[k - 2];
    if (W > 1) s.x[0] = x0;
  }
  st = s;
}

template <typename Real, typename Fn>
void dispatch(const ConvGeo<Real>& G, Fn&& fn) {
  // fn(std::integral_constant<int, KW>, std::bool_constant<SILU>)
  if (G.W == 4) {
    if (G.silu)
      fn(std::integral_constant<int, 4>{}, std::true_type{});
    else
      fn(std::integral_constant<int, 4>{}, std::false_type{});
  } else {
    if (G.silu)
      fn(std::integral_constant<int, 0>{}, std::true_type{});
    else
      fn(std::integral_constant<int, 0>{}, std::false_type{});
  }
}

}  // namespace

template <typename Real>
void causal_conv1d_forward(const CausalConv1dArgsT<Real>& a, CcOut<Real> y, CcOut<Real> final_state) {
  const auto G = resolve(a, "causal_conv1d_forward");
  HLM_CHECK(y != nullptr, "causal_conv1d_forward: y is required ({})", shape_str(a));
  parallel_for(
      G.B * G.T,
      [&](i64 lo, i64 hi) {
        dispatch(G, [&](auto kw, auto silu) {
          forward_rows<Real, decltype(kw)::value, decltype(silu)::value>(G, y, lo, hi);
        });
      },
      min_tasks(G.C * G.W));
  const i64 C = G.C;
  if (final_state && G.W > 1) {
    // Slot j holds input position T-(W-1)+j of the row's last document. Ascending j reads slot T+j > j of
    // the initial state before it is overwritten, so final_state may alias it.
    for (i64 b = 0; b < G.B; ++b)
      for (i64 j = 0; j < G.W - 1; ++j) {
        const Real* p = G.src(b, G.T - 1, G.T - (G.W - 1) + j);
        Real* dst = final_state + (b * (G.W - 1) + j) * C;
        if (p)
          std::copy(p, p + C, dst);
        else
          std::fill(dst, dst + C, Real(0));
      }
  }
}

// Tasks: (row, block of kBlock channels), each owning its du / d_initial_state entries. The block's vector
// groups take turns over tiles of kTile tokens (the next tile prefetched), so each cache line of u, dy and du
// is fetched once while every group keeps its window in registers. dw / dbias: Real sums over a tile, then
// per-row double partials [B, W+1, C] summed in row order: deterministic for any thread count.
template <typename Real>
void causal_conv1d_backward(const CausalConv1dArgsT<Real>& a, CcIn<Real> dy, CcOut<Real> du, CcOut<Real> dw,
                            CcOut<Real> dbias, CcOut<Real> d_initial_state) {
  const auto G = resolve(a, "causal_conv1d_backward");
  HLM_CHECK(dy && du, "causal_conv1d_backward: dy and du are required ({})", shape_str(a));
  const i64 C = G.C, W = G.W, T = G.T, L = kLanes<Real>, nblk = (C + kBlock - 1) / kBlock;
  if (d_initial_state) std::fill(d_initial_state, d_initial_state + G.B * (W - 1) * C, Real(0));
  std::vector<double> part(static_cast<size_t>(G.B * (W + 1) * C), 0.0);  // [B, W+1, C]: dw taps, then dbias
  parallel_for(
      G.B * nblk,
      [&](i64 lo, i64 hi) {
        dispatch(G, [&](auto kw, auto silu) {
          constexpr int KW = decltype(kw)::value;
          std::vector<LaneState<Real, KW>> st;
          for (i64 task = lo; task < hi; ++task) {
            const i64 b = task / nblk, c0 = (task % nblk) * kBlock, ng = (std::min(kBlock, C - c0) + L - 1) / L;
            auto nl = [&](i64 g) { return static_cast<int>(std::min(L, C - c0 - g * L)); };
            st.clear();
            for (i64 g = 0; g < ng; ++g) st.emplace_back(G, W, b, c0 + g * L, nl(g));
            const i64 nc = std::min(kBlock, C - c0);
            for (i64 t0 = 0; t0 < T; t0 += kTile) {
              prefetch_rows(G.u, G.ur, T, b, t0 + kTile, std::min(T, t0 + 2 * kTile), c0, nc);
              prefetch_rows(dy, C, T, b, t0 + kTile, std::min(T, t0 + 2 * kTile), c0, nc);
              for (i64 g = 0; g < ng; ++g) {
                auto& s = st[g];
                backward_span<Real, KW, decltype(silu)::value>(G, dy, du, d_initial_state, b, c0 + g * L, nl(g), t0,
                                                               std::min(T, t0 + kTile), s);
                double* pr = part.data() + b * (W + 1) * C + c0 + g * L;
                for (i64 j = 0; j <= W; ++j) {
                  for (int i = 0; i < nl(g); ++i) pr[j * C + i] += static_cast<double>(s.acc[j][i]);
                  s.acc[j] = Vec<Real>{};
                }
              }
            }
            for (i64 g = 0; g < ng; ++g)  // the pending positions of the row's last document
              for (i64 i = 0; i + 1 < W; ++i)
                put_du(G, du, d_initial_state, b, c0 + g * L, nl(g), T - 1 - i, st[g].l, st[g].pend[i]);
          }
        });
      },
      min_tasks(T * kBlock * W * 3));
  for (i64 j = 0; j <= W; ++j) {
    Real* out = j < W ? dw : dbias;
    if (!out) continue;
    for (i64 c = 0; c < C; ++c) {
      double sum = 0;
      for (i64 b = 0; b < G.B; ++b) sum += part[(b * (W + 1) + j) * C + c];
      out[j < W ? c * W + j : c] += static_cast<Real>(sum);
    }
  }
}

template <typename Real>
void causal_conv1d_step(const CausalConv1dArgsT<Real>& a, CcOut<Real> state, CcOut<Real> y) {
  const auto G = resolve(a, "causal_conv1d_step");
  HLM_CHECK(a.T == 1 && !a.initial_state && !a.doc_start && y && (state || a.W == 1),
            "causal_conv1d_step: needs T == 1, state and y, and no initial_state / doc_start ({})", shape_str(a));
  const i64 C = G.C, W = G.W;
  for (i64 b = 0; b < G.B; ++b) {
    Real* yr = y + b * C;
    const Real* ur = G.u + b * G.ur;
    Real* st = W > 1 ? state + b * (W - 1) * C : nullptr;
    for (i64 c = 0; c < C; ++c) yr[c] = G.bias ? G.bias[c] : Real(0);
    for (i64 j = 0; j < W; ++j) {
      const Real* p = j < W - 1 ? st + j * C : ur;
      const Real* wj = G.wt.data() + j * C;
      for (i64 c = 0; c < C; ++c) yr[c] += wj[c] * p[c];
    }
    if (W > 1) {
      std::copy(st + C, st + (W - 1) * C, st);
      std::copy(ur, ur + C, st + (W - 2) * C);
    }
    if (G.silu) silu_inplace(yr, C);
  }
}

#define HLM_INSTANTIATE(Real)                                                                                    \
  template void causal_conv1d_forward(const CausalConv1dArgsT<Real>&, Real*, Real*);                             \
  template void causal_conv1d_backward(const CausalConv1dArgsT<Real>&, const Real*, Real*, Real*, Real*, Real*); \
  template void causal_conv1d_step(const CausalConv1dArgsT<Real>&, Real*, Real*);
HLM_INSTANTIATE(float)
HLM_INSTANTIATE(double)
#undef HLM_INSTANTIATE

}  // namespace hlm::ops
