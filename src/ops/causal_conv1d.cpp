// Depthwise causal conv1d, forward / backward / decode step, written once with Google Highway and dispatched per
// SIMD target at run time (docs/performance.md), for float and for double (the test oracle).
#include "ops/causal_conv1d.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/simd_target.h"
#include "ops/doc_start.h"
#include "ops/kernel_grain.h"
#include "ops/thread_scratch.h"

// ---- shared by every target (this file is included once per target by foreach_target) ----------------------
#ifndef HLM_OPS_CAUSAL_CONV1D_SHARED_
#define HLM_OPS_CAUSAL_CONV1D_SHARED_
namespace hlm::ops::conv1d {

constexpr i64 kMaxW = 16;    // widths the kernels accept (the window is held in registers)
constexpr i64 kTile = 32;    // tokens per span; dw / dbias are summed in Real over one span, then in double
constexpr i64 kBlock = 256;  // channels per backward task (vector groups taking turns over a tile)
// Per-thread scratch slots (ops/thread_scratch.h): the calling thread's (weights, zeros, partials) apart from a
// worker's (windows), since the calling thread is also worker 0; distinct across element types (Real may be
// double).
enum ScratchSlot : int { kSlotWindows = 1, kSlotWeights = 10, kSlotZeros, kSlotPartials };

template <typename Real>
std::string shape_str(const CausalConv1dArgs<Real>& a) {
  return fmt::format("B={} T={} C={} W={} u_stride={}", a.B, a.T, a.C, a.W, a.u_stride);
}

template <typename Real>
struct Geo {
  i64 B, T, C, W, ur;
  bool silu;
  const Real *u, *w, *bias, *init;
  const int32_t* ds;
  std::span<Real> wt;    // [W, C]: w transposed so that the inner loops run over contiguous channels
  std::span<Real> zero;  // [C] zeros: read for taps outside the document (and for no bias)

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
Geo<Real> resolve(const CausalConv1dArgs<Real>& a, const char* op) {
  HLM_CHECK(a.B >= 1 && a.T >= 1 && a.C >= 1 && a.W >= 1, "{}: sizes must be positive ({})", op, shape_str(a));
  const i64 ur = stride_or(a.u_stride, a.C);
  check_row_layout(op, "u", ur, a.C, 1, a.C, [&] { return shape_str(a); });
  HLM_CHECK(a.u && a.w, "{}: u and w are required ({})", op, shape_str(a));
  HLM_CHECK(a.W <= kMaxW, "{}: width W must be <= {} ({})", op, kMaxW, shape_str(a));
  check_doc_start(op, a.doc_start, a.B, a.T);
  Geo<Real> G{a.B, a.T, a.C, a.W, ur, a.silu, a.u, a.w, a.bias, a.initial_state, a.doc_start, {}, {}};
  G.wt = thread_scratch_span<Real>(kSlotWeights, a.W * a.C);
  for (i64 c = 0; c < a.C; ++c)
    for (i64 j = 0; j < a.W; ++j) G.wt[j * a.C + c] = a.w[c * a.W + j];
  G.zero = thread_scratch_span<Real>(kSlotZeros, a.C);
  std::fill(G.zero.begin(), G.zero.end(), Real(0));
  return G;
}

// fn(std::integral_constant<int, KW>, std::bool_constant<SILU>): the common width 4 as a constant (the tap
// loops unroll), any other width as KW = 0.
template <typename Real, typename Fn>
void with_width(const Geo<Real>& G, Fn&& fn) {
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

// Asks for rows [t0, t1) of row b's tokens, channels [c0, c0+n), of a [B*T, stride] buffer: the strided
// rows of a channel block are not something the hardware prefetcher predicts.
template <typename Real>
inline void prefetch_rows(const Real* base, i64 stride, i64 T, i64 b, i64 t0, i64 t1, i64 c0, i64 n) {
  for (i64 t = t0; t < t1; ++t) {
    const char* r = reinterpret_cast<const char*>(base + (b * T + t) * stride + c0);
    for (i64 off = 0; off < n * static_cast<i64>(sizeof(Real)); off += 64) __builtin_prefetch(r + off);
  }
}

}  // namespace hlm::ops::conv1d
#endif  // HLM_OPS_CAUSAL_CONV1D_SHARED_

// ---- per-target kernels ----------------------------------------------------------------------------------------
#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/causal_conv1d.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {
using namespace hlm::ops::conv1d;
namespace {

namespace hn = hwy::HWY_NAMESPACE;

// sigmoid(x) = 1 / (1 + e^-x): float through the vector exp (exp() is 0 / saturated at the extremes, so this
// stays finite), double lane by lane through std::exp (reference precision).
template <class D>
HWY_INLINE hn::Vec<D> sigmoid(D d, hn::Vec<D> x) {
  using T = hn::TFromD<D>;
  const hn::Vec<D> one = hn::Set(d, T(1));
  if constexpr (std::is_same_v<T, float>) {
    return hn::Div(one, hn::Add(one, exp(d, hn::Neg(x))));
  } else {
    T a[HWY_MAX_BYTES / sizeof(T)];
    hn::StoreU(x, d, a);
    for (size_t i = 0; i < hn::Lanes(d); ++i) a[i] = T(1) / (T(1) + std::exp(-a[i]));
    return hn::LoadU(d, a);
  }
}

// One output row (all C channels) from its W tap rows p[j] (tap j = input t-W+1+j): y = bias + sum_j w[:, j] p[j],
// then SiLU. The forward and the decode step share it, so a step gives bitwise the forward's output.
template <int KW, bool SILU, class D>
HWY_INLINE void conv_row(D d, const Geo<hn::TFromD<D>>& G, const hn::TFromD<D>* const* p,
                         hn::TFromD<D>* HWY_RESTRICT y) {
  using V = hn::Vec<D>;
  const i64 W = KW > 0 ? KW : G.W, C = G.C;
  const auto* bias = G.bias ? G.bias : G.zero.data();
  const auto* wt = G.wt.data();
  for_each_vector(d, C, [&](i64 c, size_t n) {
    V x = load_part(d, bias + c, n);
    for (i64 j = 0; j < W; ++j) x = hn::MulAdd(load_part(d, wt + j * C + c, n), load_part(d, p[j] + c, n), x);
    if (SILU) x = hn::Mul(x, sigmoid(d, x));
    store_part(d, x, y + c, n);
  });
}

// Forward of tokens [lo, hi) of the flattened [B*T], all channels: one pass over the contiguous channels of
// each token (rows stream through the cache in order).
template <typename Real>
void forward(const Geo<Real>& G, Real* y) {
  parallel_for(
      G.B * G.T,
      [&](i64 lo, i64 hi) {
        const hn::ScalableTag<Real> d;
        with_width(G, [&](auto kw, auto silu) {
          const Real* p[kMaxW];
          for (i64 bt = lo; bt < hi; ++bt) {
            G.taps(bt / G.T, bt % G.T, p);
            conv_row<decltype(kw)::value, decltype(silu)::value>(d, G, p, y + bt * G.C);
          }
        });
      },
      min_tasks(G.C * G.W));
}

// One decode token per row: taps = the W-1 state rows, then the input; the state then shifts by one.
template <typename Real>
void step(const Geo<Real>& G, Real* state, Real* y) {
  const hn::ScalableTag<Real> d;
  const i64 C = G.C, W = G.W;
  with_width(G, [&](auto kw, auto silu) {
    const Real* p[kMaxW];
    for (i64 b = 0; b < G.B; ++b) {
      const Real* ur = G.u + b * G.ur;
      Real* st = W > 1 ? state + b * (W - 1) * C : nullptr;
      for (i64 j = 0; j + 1 < W; ++j) p[j] = st + j * C;
      p[W - 1] = ur;
      conv_row<decltype(kw)::value, decltype(silu)::value>(d, G, p, y + b * C);
      if (W > 1) {
        std::copy(st + C, st + (W - 1) * C, st);
        std::copy(ur, ur + C, st + (W - 2) * C);
      }
    }
  });
}

// Windows of a task's channel groups (one vector of lanes each) between token spans, kept in memory: vectors
// live in registers only inside a span (a portable build's heap does not align them for the wider targets).
// Group g: x[k-1] = input at position t-k (k = 1..W-1, t = the next token), pend[i] = du of position t-1-i so
// far, l = document start of the last token seen.
template <typename Real>
struct Windows {
  i64 L = 0;
  std::span<Real> buf;  // [ng, 2, kMaxW, L]
  std::span<i64> l;     // [ng]
  Real* x(i64 g) { return buf.data() + g * 2 * kMaxW * L; }
  Real* pend(i64 g) { return x(g) + kMaxW * L; }
  // Channels [c0, ...) of row b in groups of L lanes: the window starts as the conv state (slot W-1-k) or zeros.
  void reset(const Geo<Real>& G, i64 b, i64 c0, i64 ng, i64 nc) {
    buf = thread_scratch_span<Real>(kSlotWindows, ng * 2 * kMaxW * L);
    l = thread_scratch_span<i64>(kSlotWindows, ng);
    std::fill(buf.begin(), buf.end(), Real(0));
    std::fill(l.begin(), l.end(), i64{0});
    if (!G.init) return;
    for (i64 g = 0; g < ng; ++g)
      for (i64 k = 1; k < G.W; ++k) {
        const Real* src = G.init + (b * (G.W - 1) + G.W - 1 - k) * G.C + c0 + g * L;
        std::copy(src, src + std::min(L, nc - g * L), x(g) + (k - 1) * L);
      }
  }
};

// Stores the du of position s (a channel group of row b) as seen from a token whose document starts at l:
// positions before l belong to another document (dropped), negative ones are conv-state slots.
template <class D>
HWY_INLINE void put_du(D d, const Geo<hn::TFromD<D>>& G, hn::TFromD<D>* du, hn::TFromD<D>* dinit, i64 b, i64 c0,
                       size_t nl, i64 s, i64 l, hn::Vec<D> v) {
  if (s >= l)
    store_part(d, v, du + (b * G.T + s) * G.ur + c0, nl);
  else if (s < 0 && l == 0 && dinit)
    store_part(d, v, dinit + (b * (G.W - 1) + s + G.W - 1) * G.C + c0, nl);
}

// Backward over tokens [t0, t1) of a channel group, in time order:
//   dpre = dy * silu'(pre) (silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)), pre recomputed from the window;
//   acc[j] += dpre * tap_j (dw), acc[W] += dpre (dbias), added to the double partials pr[j * C] at the end;
//   du: token t adds w[:, W-1-k] dpre to position t-k (k = 0..W-1). Position t-(W-1) is complete after token
//   t and is stored, as are the pending positions at a document end (here) and at the row end (caller).
//   Positions before the token's document start are dropped; negative ones (first document) are the
//   conv-state slots. At a document start the window is cleared (inputs before the start are zero).
// KW > 0: the width as a constant (the tap loops unroll and the span keeps everything in registers).
template <int KW, bool SILU, class D>
void backward_span(D d, const Geo<hn::TFromD<D>>& G, const hn::TFromD<D>* dy, hn::TFromD<D>* du,
                   hn::TFromD<D>* dinit, i64 b, i64 c0, size_t nl, i64 t0, i64 t1, hn::TFromD<D>* xs,
                   hn::TFromD<D>* ps, i64& l, double* pr) {
  using V = hn::Vec<D>;
  using T = hn::TFromD<D>;
  constexpr i64 kCap = KW > 0 ? KW : kMaxW;
  const i64 W = KW > 0 ? KW : G.W, C = G.C, L = static_cast<i64>(hn::Lanes(d));
  const V one = hn::Set(d, T(1));
  V w[kCap], x[kCap], pend[kCap], acc[kCap + 1];
  for (i64 j = 0; j < W; ++j) w[j] = load_part(d, G.wt.data() + j * C + c0, nl);
  const V bias = G.bias ? load_part(d, G.bias + c0, nl) : hn::Zero(d);
  for (i64 k = 0; k + 1 < W; ++k) x[k] = hn::LoadU(d, xs + k * L), pend[k] = hn::LoadU(d, ps + k * L);
  for (i64 j = 0; j <= W; ++j) acc[j] = hn::Zero(d);
  for (i64 t = t0; t < t1; ++t) {
    if (t > 0 && G.lo(b, t) == t) {
      for (i64 i = 0; i + 1 < W; ++i) put_du(d, G, du, dinit, b, c0, nl, t - 1 - i, l, pend[i]);
      for (i64 i = 0; i + 1 < W; ++i) pend[i] = hn::Zero(d);
      for (i64 k = 1; k < W; ++k) x[k - 1] = hn::Zero(d);
      l = t;
    }
    const V x0 = load_part(d, G.u + (b * G.T + t) * G.ur + c0, nl);
    V dp = load_part(d, dy + (b * G.T + t) * C + c0, nl);
    if (SILU) {
      V p = hn::MulAdd(w[W - 1], x0, bias);
      for (i64 k = 1; k < W; ++k) p = hn::MulAdd(w[W - 1 - k], x[k - 1], p);
      const V sg = sigmoid(d, p);
      dp = hn::Mul(dp, hn::Mul(sg, hn::MulAdd(p, hn::Sub(one, sg), one)));
    }
    acc[W] = hn::Add(acc[W], dp);
    acc[W - 1] = hn::MulAdd(dp, x0, acc[W - 1]);
    for (i64 k = 1; k < W; ++k) acc[W - 1 - k] = hn::MulAdd(dp, x[k - 1], acc[W - 1 - k]);
    const V done = hn::MulAdd(w[0], dp, W > 1 ? pend[W - 2] : hn::Zero(d));  // position t-(W-1)
    for (i64 i = W - 2; i >= 1; --i) pend[i] = hn::MulAdd(w[W - 1 - i], dp, pend[i - 1]);
    if (W > 1) pend[0] = hn::Mul(w[W - 1], dp);
    put_du(d, G, du, dinit, b, c0, nl, t - (W - 1), l, done);
    for (i64 k = W - 1; k > 1; --k) x[k - 1] = x[k - 2];
    if (W > 1) x[0] = x0;
  }
  for (i64 k = 0; k + 1 < W; ++k) hn::StoreU(x[k], d, xs + k * L), hn::StoreU(pend[k], d, ps + k * L);
  T lanes[HWY_MAX_BYTES / sizeof(T)] = {};
  for (i64 j = 0; j <= W; ++j) {
    hn::StoreU(acc[j], d, lanes);
    for (size_t i = 0; i < nl; ++i) pr[j * C + static_cast<i64>(i)] += static_cast<double>(lanes[i]);
  }
}

// Tasks: (row, block of kBlock channels), each owning its du / d_initial_state entries. The block's vector
// groups take turns over tiles of kTile tokens (the next tile prefetched), so each cache line of u, dy and du
// is fetched once. dw / dbias: Real sums over a tile, then added to the row's double partials part [B, W+1, C].
template <typename Real>
void backward(const Geo<Real>& G, const Real* dy, Real* du, Real* dinit, double* part) {
  const hn::ScalableTag<Real> d;
  const i64 C = G.C, W = G.W, T = G.T, L = static_cast<i64>(hn::Lanes(d)), nblk = (C + kBlock - 1) / kBlock;
  parallel_for(
      G.B * nblk,
      [&](i64 lo, i64 hi) {
        with_width(G, [&](auto kw, auto silu) {
          Windows<Real> win;
          win.L = L;
          for (i64 task = lo; task < hi; ++task) {
            const i64 b = task / nblk, c0 = (task % nblk) * kBlock, nc = std::min(kBlock, C - c0),
                      ng = (nc + L - 1) / L;
            auto nl = [&](i64 g) { return static_cast<size_t>(std::min(L, nc - g * L)); };
            win.reset(G, b, c0, ng, nc);
            for (i64 t0 = 0; t0 < T; t0 += kTile) {
              prefetch_rows(G.u, G.ur, T, b, t0 + kTile, std::min(T, t0 + 2 * kTile), c0, nc);
              prefetch_rows(dy, C, T, b, t0 + kTile, std::min(T, t0 + 2 * kTile), c0, nc);
              for (i64 g = 0; g < ng; ++g)
                backward_span<decltype(kw)::value, decltype(silu)::value>(
                    d, G, dy, du, dinit, b, c0 + g * L, nl(g), t0, std::min(T, t0 + kTile), win.x(g), win.pend(g),
                    win.l[g], part + b * (W + 1) * C + c0 + g * L);
            }
            for (i64 g = 0; g < ng; ++g)  // the pending positions of the row's last document
              for (i64 i = 0; i + 1 < W; ++i)
                put_du(d, G, du, dinit, b, c0 + g * L, nl(g), T - 1 - i, win.l[g], hn::LoadU(d, win.pend(g) + i * L));
          }
        });
      },
      min_tasks(T * kBlock * W * 3));
}

}  // namespace

// Entry points per element type (HWY_EXPORT takes plain functions).
void conv_forward_f32(const Geo<float>& G, float* y) { forward(G, y); }
void conv_forward_f64(const Geo<double>& G, double* y) { forward(G, y); }
void conv_step_f32(const Geo<float>& G, float* state, float* y) { step(G, state, y); }
void conv_step_f64(const Geo<double>& G, double* state, double* y) { step(G, state, y); }
void conv_backward_f32(const Geo<float>& G, const float* dy, float* du, float* dinit, double* part) {
  backward(G, dy, du, dinit, part);
}
void conv_backward_f64(const Geo<double>& G, const double* dy, double* du, double* dinit, double* part) {
  backward(G, dy, du, dinit, part);
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// ---- public ops ------------------------------------------------------------------------------------------------
#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(conv_forward_f32);
HWY_EXPORT(conv_forward_f64);
HWY_EXPORT(conv_step_f32);
HWY_EXPORT(conv_step_f64);
HWY_EXPORT(conv_backward_f32);
HWY_EXPORT(conv_backward_f64);

using namespace conv1d;
namespace {

void run_forward(const Geo<float>& G, float* y) { HWY_DYNAMIC_DISPATCH(conv_forward_f32)(G, y); }
void run_forward(const Geo<double>& G, double* y) { HWY_DYNAMIC_DISPATCH(conv_forward_f64)(G, y); }
void run_step(const Geo<float>& G, float* st, float* y) { HWY_DYNAMIC_DISPATCH(conv_step_f32)(G, st, y); }
void run_step(const Geo<double>& G, double* st, double* y) { HWY_DYNAMIC_DISPATCH(conv_step_f64)(G, st, y); }
void run_backward(const Geo<float>& G, const float* dy, float* du, float* dinit, double* part) {
  HWY_DYNAMIC_DISPATCH(conv_backward_f32)(G, dy, du, dinit, part);
}
void run_backward(const Geo<double>& G, const double* dy, double* du, double* dinit, double* part) {
  HWY_DYNAMIC_DISPATCH(conv_backward_f64)(G, dy, du, dinit, part);
}
}  // namespace

template <typename Real>
void causal_conv1d_forward(const CausalConv1dArgs<Real>& a, OutBuf<Real> y, OutBuf<Real> final_state) {
  const auto G = resolve(a, "causal_conv1d_forward");
  HLM_CHECK(y != nullptr, "causal_conv1d_forward: y is required ({})", shape_str(a));
  init_simd();
  run_forward(G, y);
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

// dw / dbias: per-row double partials [B, W+1, C] summed in row order: deterministic for any thread count.
template <typename Real>
void causal_conv1d_backward(const CausalConv1dArgs<Real>& a, InBuf<Real> dy, const CausalConv1dGrads<Real>& gr) {
  const auto G = resolve(a, "causal_conv1d_backward");
  Real *du = gr.du, *dw = gr.dw, *dbias = gr.dbias, *d_initial_state = gr.d_initial_state;
  HLM_CHECK(dy && du, "causal_conv1d_backward: dy and du are required ({})", shape_str(a));
  const i64 C = G.C, W = G.W;
  if (d_initial_state) std::fill(d_initial_state, d_initial_state + G.B * (W - 1) * C, Real(0));
  std::span<double> part = thread_scratch_span<double>(kSlotPartials, G.B * (W + 1) * C);  // dw taps, then dbias
  std::fill(part.begin(), part.end(), 0.0);
  init_simd();
  run_backward(G, dy, du, d_initial_state, part.data());
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
void causal_conv1d_step(const CausalConv1dArgs<Real>& a, OutBuf<Real> state, OutBuf<Real> y) {
  const auto G = resolve(a, "causal_conv1d_step");
  HLM_CHECK(a.T == 1 && !a.initial_state && !a.doc_start && y && (state || a.W == 1),
            "causal_conv1d_step: needs T == 1, state and y, and no initial_state / doc_start ({})", shape_str(a));
  init_simd();
  run_step(G, state, y);
}

#define HLM_INSTANTIATE(Real)                                                                                    \
  template void causal_conv1d_forward(const CausalConv1dArgs<Real>&, Real*, Real*);                             \
  template void causal_conv1d_backward(const CausalConv1dArgs<Real>&, const Real*, const CausalConv1dGrads<Real>&); \
  template void causal_conv1d_step(const CausalConv1dArgs<Real>&, Real*, Real*);
HLM_INSTANTIATE(float)
HLM_INSTANTIATE(double)
#undef HLM_INSTANTIATE

}  // namespace hlm::ops
#endif  // HWY_ONCE
