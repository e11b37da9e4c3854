#include "ops/causal_conv1d.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/fast_exp.h"

namespace hlm::ops {
namespace {

// exp over an array: the vectorised fast_exp for float (masked entries are -inf and give exactly 0),
// std::exp for double.
inline void exp_inplace(float* x, i64 n) {
#pragma omp simd
  for (i64 i = 0; i < n; ++i) x[i] = fast_exp(x[i]);
}
inline void exp_inplace(double* x, i64 n) {
  for (i64 i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}

// Tasks per thread so that each thread gets at least ~32K multiply-adds: tiny problems (decode steps, tests)
// stay on one thread instead of paying for a parallel region.
inline i64 min_tasks(i64 work_per_task) { return std::max<i64>(1, (i64{1} << 15) / std::max<i64>(1, work_per_task)); }

constexpr i64 kChanBlock = 64;  // channels per backward task (each task owns its dw / dbias entries)

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
  std::vector<Real> wt;  // [W, C]: w transposed so the inner loops run over contiguous channels

  i64 lo(i64 b, i64 t) const { return ds ? ds[b * T + t] : 0; }
  // Row holding input position s (may be negative) as seen by output token t; nullptr = zero.
  const Real* src(i64 b, i64 t, i64 s) const {
    const i64 l = lo(b, t);
    if (s >= 0) return s >= l ? u + (b * T + s) * ur : nullptr;
    return (l == 0 && init) ? init + (b * (W - 1) + s + W - 1) * C : nullptr;
  }
  // pre[c0:c0+n] of token (b, t).
  void pre(i64 b, i64 t, i64 c0, i64 n, Real* out) const {
    for (i64 c = 0; c < n; ++c) out[c] = bias ? bias[c0 + c] : Real(0);
    for (i64 j = 0; j < W; ++j) {
      const Real* p = src(b, t, t - W + 1 + j);
      if (!p) continue;
      const Real* wj = wt.data() + j * C + c0;
      for (i64 c = 0; c < n; ++c) out[c] += wj[c] * p[c0 + c];
    }
  }
};

template <typename Real>
ConvGeo<Real> resolve(const CausalConv1dArgsT<Real>& a, const char* op) {
  HLM_CHECK(a.B >= 1 && a.T >= 1 && a.C >= 1 && a.W >= 1, "{}: sizes must be positive ({})", op, shape_str(a));
  const i64 ur = a.u_row ? a.u_row : a.C;
  HLM_CHECK(ur >= a.C, "{}: u_row must be >= C ({})", op, shape_str(a));
  HLM_CHECK(a.u && a.w, "{}: u and w are required ({})", op, shape_str(a));
  if (a.doc_start) {
    for (i64 b = 0; b < a.B; ++b)
      for (i64 t = 0; t < a.T; ++t) {
        const i64 d = a.doc_start[b * a.T + t];
        const bool valid = t == 0 ? d == 0 : (d == t || d == a.doc_start[b * a.T + t - 1]);
        HLM_CHECK(valid, "{}: doc_start[{}] = {} is not a document start for token {} of row {} ({})", op, b * a.T + t,
                  d, t, b, shape_str(a));
      }
  }
  ConvGeo<Real> G{a.B, a.T, a.C, a.W, ur, a.silu, a.u, a.w, a.bias, a.initial_state, a.doc_start, {}};
  G.wt.resize(a.W * a.C);
  for (i64 c = 0; c < a.C; ++c)
    for (i64 j = 0; j < a.W; ++j) G.wt[j * a.C + c] = a.w[c * a.W + j];
  return G;
}

// y = silu(x) = x * sigmoid(x), in place; sig (n) is scratch.
template <typename Real>
void silu_inplace(Real* x, Real* sig, i64 n) {
  for (i64 c = 0; c < n; ++c) sig[c] = -x[c];
  exp_inplace(sig, n);
  for (i64 c = 0; c < n; ++c) x[c] = x[c] / (Real(1) + sig[c]);
}

}  // namespace

template <typename Real>
void causal_conv1d_forward(const CausalConv1dArgsT<Real>& a, CcOut<Real> y, CcOut<Real> final_state) {
  const auto G = resolve(a, "causal_conv1d_forward");
  HLM_CHECK(y != nullptr, "causal_conv1d_forward: y is required ({})", shape_str(a));
  const i64 C = G.C;
  parallel_for(
      G.B * G.T,
      [&](i64 lo, i64 hi) {
        std::vector<Real> sig(G.silu ? C : 0);
        for (i64 bt = lo; bt < hi; ++bt) {
          Real* yr = y + bt * C;
          G.pre(bt / G.T, bt % G.T, 0, C, yr);
          if (G.silu) silu_inplace(yr, sig.data(), C);
        }
      },
      min_tasks(G.C * G.W));
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

template <typename Real>
void causal_conv1d_backward(const CausalConv1dArgsT<Real>& a, CcIn<Real> dy, CcOut<Real> du, CcOut<Real> dw,
                            CcOut<Real> dbias, CcOut<Real> d_initial_state) {
  const auto G = resolve(a, "causal_conv1d_backward");
  HLM_CHECK(dy && du, "causal_conv1d_backward: dy and du are required ({})", shape_str(a));
  const i64 C = G.C, T = G.T, W = G.W, nblk = (C + kChanBlock - 1) / kChanBlock;
  parallel_for(
      nblk,
      [&](i64 lo, i64 hi) {
        std::vector<Real> dpre(T * kChanBlock), pre(kChanBlock), sig(kChanBlock);
        std::vector<double> dwacc(W * kChanBlock), dbacc(kChanBlock);
        for (i64 blk = lo; blk < hi; ++blk) {
          const i64 c0 = blk * kChanBlock, n = std::min(kChanBlock, C - c0);
          std::fill(dwacc.begin(), dwacc.end(), 0.0);
          std::fill(dbacc.begin(), dbacc.end(), 0.0);
          for (i64 b = 0; b < G.B; ++b) {
            // dpre = dy * silu'(pre), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
            for (i64 t = 0; t < T; ++t) {
              const Real* dyr = dy + (b * T + t) * C + c0;
              Real* dp = dpre.data() + t * kChanBlock;
              if (!G.silu) {
                std::copy(dyr, dyr + n, dp);
                continue;
              }
              G.pre(b, t, c0, n, pre.data());
              for (i64 c = 0; c < n; ++c) sig[c] = -pre[c];
              exp_inplace(sig.data(), n);
              for (i64 c = 0; c < n; ++c) {
                const Real s = Real(1) / (Real(1) + sig[c]);
                dp[c] = dyr[c] * s * (Real(1) + pre[c] * (Real(1) - s));
              }
            }
            // du[s] = sum_j w[:, j] dpre[s + W-1-j] over taps that stay inside the output token's document.
            for (i64 s = 0; s < T; ++s) {
              Real* dur = du + (b * T + s) * G.ur + c0;
              std::fill(dur, dur + n, Real(0));
              for (i64 j = 0; j < W; ++j) {
                const i64 t = s + W - 1 - j;
                if (t >= T || s < G.lo(b, t)) continue;
                const Real* wj = G.wt.data() + j * C + c0;
                const Real* dp = dpre.data() + t * kChanBlock;
                for (i64 c = 0; c < n; ++c) dur[c] += wj[c] * dp[c];
              }
            }
            // dw[:, j] += sum_t dpre[t] * input(t - W+1+j); dbias += sum_t dpre[t]
            for (i64 t = 0; t < T; ++t) {
              const Real* dp = dpre.data() + t * kChanBlock;
              for (i64 c = 0; c < n; ++c) dbacc[c] += dp[c];
              for (i64 j = 0; j < W; ++j) {
                const Real* p = G.src(b, t, t - W + 1 + j);
                if (!p) continue;
                double* acc = dwacc.data() + j * kChanBlock;
                for (i64 c = 0; c < n; ++c) acc[c] += static_cast<double>(dp[c] * p[c0 + c]);
              }
            }
            // State slot k is input position k-(W-1): output t reads it through tap j = k - t (first document).
            if (d_initial_state)
              for (i64 k = 0; k < W - 1; ++k) {
                Real* di = d_initial_state + (b * (W - 1) + k) * C + c0;
                std::fill(di, di + n, Real(0));
                for (i64 t = 0; t <= std::min(k, T - 1); ++t) {
                  if (G.lo(b, t) != 0) break;
                  const Real* wj = G.wt.data() + (k - t) * C + c0;
                  const Real* dp = dpre.data() + t * kChanBlock;
                  for (i64 c = 0; c < n; ++c) di[c] += wj[c] * dp[c];
                }
              }
          }
          if (dw)
            for (i64 c = 0; c < n; ++c)
              for (i64 j = 0; j < W; ++j) dw[(c0 + c) * W + j] += static_cast<Real>(dwacc[j * kChanBlock + c]);
          if (dbias)
            for (i64 c = 0; c < n; ++c) dbias[c0 + c] += static_cast<Real>(dbacc[c]);
        }
      },
      min_tasks(G.B * T * kChanBlock * W * 3));
}

template <typename Real>
void causal_conv1d_step(const CausalConv1dArgsT<Real>& a, CcOut<Real> state, CcOut<Real> y) {
  const auto G = resolve(a, "causal_conv1d_step");
  HLM_CHECK(a.T == 1 && !a.initial_state && !a.doc_start && y && (state || a.W == 1),
            "causal_conv1d_step: needs T == 1, state and y, and no initial_state / doc_start ({})", shape_str(a));
  const i64 C = G.C, W = G.W;
  std::vector<Real> sig(G.silu ? C : 0);
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
    if (G.silu) silu_inplace(yr, sig.data(), C);
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
