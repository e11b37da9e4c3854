// Gated delta rule: recurrent (oracle/decode) and chunked WY/UT (training) forms, forward and backward.
// Formulas and their derivation: docs/gated_delta.md (section numbers below refer to it).
#include "ops/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/doc_start.h"
#include "ops/kernel_blas.h"
#include "ops/thread_scratch.h"
#include "ops/scan_simd.h"

namespace hlm::ops {
namespace {

// ------------------------------------------------------------------------------------------------
// Small helpers

// Shapes with strides resolved, checked once per call.
struct Geo {
  i64 B, T, H, K, V, C, qs, ks, vs;
  const int32_t* ds;
  bool reset(i64 b, i64 t) const { return starts_document(ds, T, b, t); }
};

template <typename F>
Geo resolve(const GatedDeltaArgs<F>& a, const char* op, bool need_inputs = true) {
  Geo d{a.B,
        a.T,
        a.H,
        a.K,
        a.V,
        a.chunk,
        stride_or(a.q_stride, a.H * a.K),
        stride_or(a.k_stride, a.H * a.K),
        stride_or(a.v_stride, a.H * a.V),
        a.doc_start};
  auto shape = [&] { return fmt::format("B={} T={} H={} K={} V={} chunk={}", d.B, d.T, d.H, d.K, d.V, d.C); };
  HLM_CHECK(d.B >= 1 && d.T >= 1 && d.H >= 1 && d.K >= 1 && d.V >= 1 && d.C >= 1, "{}: bad shape {}", op, shape());
  check_row_layout(op, "q", d.qs, d.K, d.H, d.K, shape);
  check_row_layout(op, "k", d.ks, d.K, d.H, d.K, shape);
  check_row_layout(op, "v", d.vs, d.V, d.H, d.V, shape);
  if (need_inputs)
    HLM_CHECK(a.q && a.k && a.v && a.g && a.beta, "{}: q, k, v, g and beta are required ({})", op, shape());
  check_doc_start(op, d.ds, d.B, d.T);
  return d;
}

// Segments of row b: chunks of C tokens cut from each document's own start (the last one of a document may
// be shorter), so a segment never straddles a document boundary. fn(t0, L).
template <typename Fn>
void for_segments(const Geo& d, i64 b, Fn&& fn) {
  i64 t0 = 0;
  while (t0 < d.T) {
    const i64 lim = std::min(d.C, d.T - t0);
    i64 L = 1;
    if (d.ds)
      while (L < lim && d.ds[b * d.T + t0 + L] != t0 + L) ++L;
    else
      L = lim;
    fn(t0, L);
    t0 += L;
  }
}

i64 max_segments(const Geo& d) {
  i64 mx = 0;
  for (i64 b = 0; b < (d.ds ? d.B : 1); ++b) {
    i64 n = 0;
    for_segments(d, b, [&](i64, i64) { ++n; });
    mx = std::max(mx, n);
  }
  return mx;
}

// ------------------------------------------------------------------------------------------------
// Recurrent form (docs/gated_delta.md §1, §2)

// The delta rule's middle step, shared by token_forward and token_step: with rk = S^T k and rq = S^T q of the state
// before the token, rk becomes u = beta (v - a S^T k), and o (if given) the read-out a S^T q + u (k . q).
template <typename F>
void delta_and_readout(i64 V, F a, F beta, const F* v, F kq, F* rk, const F* rq, F* o) {
  for (i64 j = 0; j < V; ++j) {
    const F u = beta * (v[j] - a * rk[j]);
    if (o) o[j] = a * rq[j] + u * kq;
    rk[j] = u;
  }
}

// One token on state S [K, V] in place: S~ = a S; u = beta (v - S~^T k); S = S~ + k u^T; o = S^T q.
// Uses S^T q = a S_prev^T q + u (k.q) so the state is read once and updated once. o may be nullptr.
template <typename F>
void token_forward(i64 K, i64 V, F* S, const F* q, const F* k, const F* v, F g, F beta, F* o, F* rk, F* rq) {
  const F a = std::exp(g);
  std::fill(rk, rk + V, F(0));
  if (o) std::fill(rq, rq + V, F(0));
  F kq = 0;
  for (i64 i = 0; i < K; ++i) {
    const F* Si = S + i * V;
    const F ki = k[i];
    for (i64 j = 0; j < V; ++j) rk[j] += ki * Si[j];
    if (o) {
      const F qi = q[i];
      kq += ki * qi;
      for (i64 j = 0; j < V; ++j) rq[j] += qi * Si[j];
    }
  }
  delta_and_readout(V, a, beta, v, kq, rk, rq, o);
  for (i64 i = 0; i < K; ++i) {
    F* Si = S + i * V;
    const F ki = k[i];
    for (i64 j = 0; j < V; ++j) Si[j] = a * Si[j] + ki * rk[j];
  }
}

// token_forward for decoding, the same arithmetic on the dispatched vector kernels (ops/scan_simd.h): one pass
// reads S^T k and S^T q, a second writes a S + k u^T. token_forward stays the plain reference the tests check.
template <typename F>
void token_step(i64 K, i64 V, F* S, const F* q, const F* k, const F* v, F g, F beta, F* o, F* rk, F* rq) {
  const F a = std::exp(g);
  state_transpose_products(S, K, V, k, q, rk, rq);
  delta_and_readout(V, a, beta, v, dot(k, q, K), rk, rq, o);
  state_decay_rank1(S, K, V, a, k, rk, F(0), static_cast<const F*>(nullptr), static_cast<F*>(nullptr));
}

// Backward of one token (docs/gated_delta.md §2). Sp = state before the token (nullptr = zero, i.e. a document
// start), St = state after it; dS [K, V] holds dL/dS_t on entry and dL/dS_{t-1} on exit.
template <typename F>
void token_backward(i64 K, i64 V, const F* Sp, const F* St, F* dS, const F* q, const F* k, const F* v, F g, F beta,
                    const F* dout, F* dq, F* dk, F* dv, F* dg, F* dbeta, F* r, F* dd) {
  const F a = std::exp(g);
  for (i64 i = 0; i < K; ++i) {
    F* dSi = dS + i * V;
    const F qi = q[i];
    for (i64 j = 0; j < V; ++j) dSi[j] += qi * dout[j];
    dq[i] = dot(St + i * V, dout, V);
  }
  // r = S~^T k = a Sp^T k;  dd = d(delta) = dS^T k
  std::fill(r, r + V, F(0));
  std::fill(dd, dd + V, F(0));
  for (i64 i = 0; i < K; ++i) {
    const F ki = k[i];
    const F* dSi = dS + i * V;
    for (i64 j = 0; j < V; ++j) dd[j] += ki * dSi[j];
    if (Sp) {
      const F* Si = Sp + i * V;
      for (i64 j = 0; j < V; ++j) r[j] += ki * Si[j];
    }
  }
  F db = 0;
  for (i64 j = 0; j < V; ++j) {
    const F vr = v[j] - a * r[j];
    db += dd[j] * vr;
    dv[j] = beta * dd[j];
    r[j] = beta * vr;       // r now holds delta = u_t
    dd[j] = -beta * dd[j];  // dd now holds dr
  }
  *dbeta = db;
  // dk = dS delta + a Sp dr;  dS~ = dS + k dr^T;  dg = a <dS~, Sp>;  dS <- a dS~
  double dgs = 0;  // a K*V-term inner product with cancellations: rows in F, their sum in double
  for (i64 i = 0; i < K; ++i) {
    F* dSi = dS + i * V;
    F s = dot(dSi, r, V);
    const F ki = k[i];
    if (Sp) {
      const F* Si = Sp + i * V;
      s += a * dot(Si, dd, V);
      F row = 0;
      for (i64 j = 0; j < V; ++j) {
        const F x = dSi[j] + ki * dd[j];
        row += x * Si[j];
        dSi[j] = a * x;
      }
      dgs += row;
    } else {
      for (i64 j = 0; j < V; ++j) dSi[j] = a * (dSi[j] + ki * dd[j]);
    }
    dk[i] = s;
  }
  *dg = a * F(dgs);
}

// ------------------------------------------------------------------------------------------------
// Chunked form (docs/gated_delta.md §3). One segment of L <= C tokens of one (b, h).

template <typename F>
struct Seg {
  const F *q, *k, *v, *g, *beta;  // at the segment's first token, head h
  i64 qs, ks, vs, gs;             // token strides (gs = H for g and beta)
  i64 L;
};

template <typename F>
struct ChunkWork {
  i64 C, K, V;
  // [C, C], row stride C (>= chunk, a multiple of 16)
  F *A, *QK, *Gam, *Tm, *dP, *Z, *dT, *tmp;
  // [C, K], row stride K
  F *X, *W, *Kf, *dW, *dX, *Vd;
  // [C, V], row stride V
  F *Y, *Vn, *dVn, *dY;
  // [C]
  F *e, *f, *bt, *dgam, *dbt, *de, *df, *wexp;
  F eL = 0;
  // gamma, the in-chunk cumulative log-decay, in double: its differences gamma_i - gamma_j are the exponents
  // of Gamma, and in fp32 a large |gamma| (strong decays earlier in the chunk) would swamp small differences.
  std::vector<double> gam;

  static i64 round(i64 n) { return (n + 15) / 16 * 16; }
  // The chunk-by-chunk matrices use the row stride C = chunk rounded up to 16 (see the forward substitution).
  static i64 numel(i64 chunk, i64 K, i64 V) {
    const i64 C = round(chunk);
    return 8 * C * C + 6 * round(C * K) + 4 * round(C * V) + 8 * C;
  }
  void carve(F* p, i64 chunk, i64 K_, i64 V_) {
    C = round(chunk), K = K_, V = V_;
    auto take = [&](i64 n) {
      F* r = p;
      p += round(n);
      return r;
    };
    for (F** m : {&A, &QK, &Gam, &Tm, &dP, &Z, &dT, &tmp}) *m = take(C * C);
    for (F** m : {&X, &W, &Kf, &dW, &dX, &Vd}) *m = take(C * K);
    for (F** m : {&Y, &Vn, &dVn, &dY}) *m = take(C * V);
    for (F** m : {&e, &f, &bt, &dgam, &dbt, &de, &df, &wexp}) *m = take(C);
    gam.resize(C);
  }

  // Everything the forward and the backward share: gamma = in-chunk cumsum of g, Gamma (masked before exp),
  // A = K K^T, T = (I + StrictLower(diag(beta) A o Gamma))^-1, X = diag(beta e^gamma) K, W = T X,
  // Y = diag(beta) V, V' = T Y - W S. S == nullptr means a zero incoming state. QK = Q K^T when need_qk.
  void prepare(const Seg<F>& s, const F* S, bool need_qk) {
    const i64 L = s.L;
    double acc = 0;
    for (i64 i = 0; i < L; ++i) {
      acc += double(s.g[i * s.gs]);
      gam[i] = acc;
      bt[i] = s.beta[i * s.gs];
    }
    const double gL = gam[L - 1];
    for (i64 i = 0; i < L; ++i) {
      e[i] = F(gam[i]);
      f[i] = F(gL - gam[i]);
    }
    exp_inplace(e, L);
    exp_inplace(f, L);
    eL = e[L - 1];
    // Gamma_ij = exp(gamma_i - gamma_j) for i >= j only (the exponent is then <= 0). Inside 16x16 diagonal
    // blocks directly; left of a block starting at p as exp(gamma_i - gamma_p) exp(gamma_p - gamma_j), two
    // factors <= 1, which needs 3x fewer exps.
    for (i64 pb = 0; pb < L; pb += 16) {
      for (i64 j = 0; j < pb; ++j) wexp[j] = F(gam[pb] - gam[j]);
      exp_inplace(wexp, pb);
      for (i64 i = pb; i < std::min(L, pb + 16); ++i) {
        F* Gi = Gam + i * C;
        scale_rows(std::exp(F(gam[i] - gam[pb])), static_cast<const F*>(nullptr), wexp, 0, Gi, 0, 1, pb);
        for (i64 j = pb; j <= i; ++j) Gi[j] = F(gam[i] - gam[j]);
        exp_inplace(Gi + pb, i - pb + 1);
      }
    }
    gemm(false, true, L, L, K, 1, s.k, s.ks, s.k, s.ks, 0, A, C);
    if (need_qk) gemm(false, true, L, L, K, 1, s.q, s.qs, s.k, s.ks, 0, QK, C);
    // Forward substitution, row by row: T_i = e_i - sum_{m<i} M_im T_m with M_im = beta_i A_im Gamma_im
    // (rows are padded to a multiple of 16 with zeros).
    unit_lower_inverse(A, Gam, bt, Tm, L, C);
    for (i64 i = 0; i < L; ++i) wexp[i] = bt[i] * e[i];  // wexp is free again once Gamma is built
    scale_rows(F(1), wexp, s.k, s.ks, X, K, L, K);
    scale_rows(F(1), bt, s.v, s.vs, Y, V, L, V);
    gemm(false, false, L, K, L, 1, Tm, C, X, K, 0, W, K);
    gemm(false, false, L, V, L, 1, Tm, C, Y, V, 0, Vn, V);
    if (S) gemm(false, false, L, V, K, -1, W, K, S, V, 1, Vn, V);
  }

  // Kf = diag(e^{gamma_L - gamma}) K
  void make_kf(const Seg<F>& s) {
    scale_rows(F(1), f, s.k, s.ks, Kf, K, s.L, K);
  }

  // S <- e^{gamma_L} S + Kf^T V' (after prepare). zero: S is known to be zero (its contents are ignored).
  void update_state(const Seg<F>& s, F* S, bool zero) {
    make_kf(s);
    gemm(true, false, K, V, s.L, 1, Kf, K, Vn, V, zero ? F(0) : eL, S, V);
  }

  // O = diag(e^gamma) Q S + (QK o Gamma) V' (after prepare with need_qk); O rows have stride ldo.
  void output(const Seg<F>& s, const F* S, F* O, i64 ldo) {
    const i64 L = s.L;
    if (S) {
      gemm(false, false, L, V, K, 1, s.q, s.qs, S, V, 0, O, ldo);
      scale_rows(F(1), e, O, ldo, O, ldo, L, V);
    } else {
      for (i64 i = 0; i < L; ++i) std::fill(O + i * ldo, O + i * ldo + V, F(0));
    }
    lower_product(QK, Gam, QK, L, C);
    gemm(false, false, L, V, L, 1, QK, C, Vn, V, 1, O, ldo);
  }

  // Backward of one segment (docs/gated_delta.md §3.3), after prepare(s, S, true). dS holds dL/dS_out on entry and
  // dL/dS_in on exit when need_dS_in (else it is left as is). Writes the segment's rows of dq, dk, dv and
  // its entries of dg, dbeta.
  void backward(const Seg<F>& s, const F* S, F* dS, bool need_dS_in, const F* dO, i64 ldo, F* dq, F* dk, F* dv, F* dg,
                F* dbeta) {
    const i64 L = s.L;
    // 1. P = QK o Gamma (in tmp);  dV' = P^T dO + Kf dS_out;  dP = dO V'^T, masked and times Gamma.
    lower_product(QK, Gam, tmp, L, C);
    gemm(true, false, L, V, L, 1, tmp, C, dO, ldo, 0, dVn, V);
    make_kf(s);
    gemm(false, false, L, V, K, 1, Kf, K, dS, V, 1, dVn, V);
    gemm(false, true, L, L, V, 1, dO, ldo, Vn, V, 0, dP, C);
    // Z_ij = dGamma_ij Gamma_ij (strictly lower; the diagonal cancels in d gamma), collected for step 8.
    lower_product(dP, Gam, dP, L, C);
    lower_product(dP, QK, Z, L, C);
    for (i64 i = 0; i < L; ++i) Z[i * C + i] = 0;
    // 2. dQ = diag(e) dO S^T + dP~ K;  dK = dP~^T Q + diag(f) V' dS_out^T;  de, df, de_L.
    const i64 ldq = s.qs, ldk = s.ks;
    // de_i = dO_i . (Q S)_i = Q_i . (dO S^T)_i, so the dO S^T of dQ serves both.
    F deL = 0;
    if (S) {
      gemm(false, true, L, K, V, 1, dO, ldo, S, V, 0, dq, ldq);
      for (i64 i = 0; i < L; ++i) de[i] = dot(s.q + i * s.qs, dq + i * ldq, K);
      scale_rows(F(1), e, dq, ldq, dq, ldq, L, K);
      deL = dot(dS, S, K * V);
    } else {
      std::fill(de, de + L, F(0));
      for (i64 i = 0; i < L; ++i) std::fill(dq + i * ldq, dq + i * ldq + K, F(0));
    }
    gemm(false, false, L, K, L, 1, dP, C, s.k, s.ks, 1, dq, ldq);
    gemm(true, false, L, K, L, 1, dP, C, s.q, s.qs, 0, dk, ldk);
    gemm(false, true, L, K, V, 1, Vn, V, dS, V, 0, Vd, K);
    for (i64 i = 0; i < L; ++i) df[i] = dot(s.k + i * s.ks, Vd + i * K, K);
    axpy_rows(f, Vd, K, dk, ldk, L, K);
    // 3. dS_in = Q^T diag(e) dO + e_L dS_out - W^T dV'  (Kf is free again: it holds diag(e) Q).
    if (need_dS_in) {
      scale_rows(F(1), e, s.q, s.qs, Kf, K, L, K);
      gemm(true, false, K, V, L, 1, Kf, K, dO, ldo, eL, dS, V);
      gemm(true, false, K, V, L, -1, W, K, dVn, V, 1, dS, V);
    }
    // 4. dW = -dV' S^T;  dT = dV' Y^T + dW X^T;  dX = T^T dW;  dY = T^T dV'.
    gemm(false, true, L, L, V, 1, dVn, V, Y, V, 0, dT, C);
    if (S) {
      gemm(false, true, L, K, V, -1, dVn, V, S, V, 0, dW, K);
      gemm(false, true, L, L, K, 1, dW, K, X, K, 1, dT, C);
      gemm(true, false, L, K, L, 1, Tm, C, dW, K, 0, dX, K);
    }
    gemm(true, false, L, V, L, 1, Tm, C, dVn, V, 0, dY, V);
    // 5. dM = -T^T dT T^T (only its strict lower triangle is used).
    gemm(false, true, L, L, L, 1, dT, C, Tm, C, 0, tmp, C);
    gemm(true, false, L, L, L, -1, Tm, C, tmp, C, 0, dT, C);
    // 6. dA0 = dM o Gamma with A0 = diag(beta) K K^T: dK += (B + B^T) K with B = diag(beta) dA0;
    //    dbeta_i += sum_j dA0_ij A_ij;  Z += dA0 o A0.
    delta_a0_grads(dT, Gam, A, bt, Z, tmp, dbt, L, C);
    for (i64 i = 0; i < L; ++i)
      for (i64 j = i + 1; j < L; ++j) tmp[i * C + j] = tmp[j * C + i];
    gemm(false, false, L, K, L, 1, tmp, C, s.k, s.ks, 1, dk, ldk);
    // 7. X = diag(beta e) K and Y = diag(beta) V.
    for (i64 i = 0; i < L; ++i) {
      if (S) {
        const F r = dot(dX + i * K, s.k + i * s.ks, K);
        wexp[i] = bt[i] * e[i];  // the row scales of X (wexp is free after prepare)
        dbt[i] += e[i] * r;
        de[i] += bt[i] * r;
      }
      dbt[i] += dot(dY + i * V, s.v + i * s.vs, V);
    }
    if (S) axpy_rows(wexp, dX, K, dk, ldk, L, K);
    scale_rows(F(1), bt, dY, V, dv, s.vs, L, V);
    // 8. d gamma: Gamma_ij = exp(gamma_i - gamma_j), e, e_L, f = exp(gamma_L - gamma).
    // f_{L-1} = 1 enters with + and - and would cancel in rounding; leave it out of both (exact, and it keeps
    // dg accurate when all decays are tiny).
    for (i64 i = 0; i < L; ++i) dgam[i] = de[i] * e[i] - (i + 1 < L ? df[i] * f[i] : F(0));
    lower_row_minus_col_sums(Z, dgam, L, C);
    F sf = 0;
    for (i64 i = 0; i + 1 < L; ++i) sf += df[i] * f[i];
    dgam[L - 1] += deL * eL + sf;
    // 9. dg = suffix sum of d gamma.
    F acc = 0;
    for (i64 i = L - 1; i >= 0; --i) {
      acc += dgam[i];
      dg[i * s.gs] = acc;
      dbeta[i * s.gs] = dbt[i];
    }
  }
};

template <typename F>
Seg<F> make_seg(const GatedDeltaArgs<F>& a, const Geo& d, i64 b, i64 h, i64 t0, i64 L) {
  const i64 row = b * d.T + t0;
  return Seg<F>{a.q + row * d.qs + h * d.K,
                a.k + row * d.ks + h * d.K,
                a.v + row * d.vs + h * d.V,
                a.g + row * d.H + h,
                a.beta + row * d.H + h,
                d.qs,
                d.ks,
                d.vs,
                d.H,
                L};
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Recurrent entry points

template <typename F>
void gated_delta_recurrent_forward(const GatedDeltaArgs<F>& a, OutBuf<F> o,
                                   OutBuf<F> final_state) {
  const Geo d = resolve(a, "gated_delta_recurrent_forward");
  HLM_CHECK(o, "gated_delta_recurrent_forward: o is required (B={} T={} H={} V={})", d.B, d.T, d.H, d.V);
  const i64 KV = d.K * d.V;
  parallel_for(d.B * d.H, [&](i64 lo, i64 hi) {
    F* S = thread_scratch<F>(0, KV + 2 * d.V);
    F *rk = S + KV, *rq = rk + d.V;
    for (i64 bh = lo; bh < hi; ++bh) {
      const i64 b = bh / d.H, h = bh % d.H;
      if (a.initial_state)
        std::copy(a.initial_state + bh * KV, a.initial_state + (bh + 1) * KV, S);
      else
        std::fill(S, S + KV, F(0));
      for (i64 t = 0; t < d.T; ++t) {
        if (d.reset(b, t)) std::fill(S, S + KV, F(0));
        const i64 row = b * d.T + t;
        token_forward(d.K, d.V, S, a.q + row * d.qs + h * d.K, a.k + row * d.ks + h * d.K, a.v + row * d.vs + h * d.V,
                      a.g[row * d.H + h], a.beta[row * d.H + h], o + (row * d.H + h) * d.V, rk, rq);
      }
      if (final_state) std::copy(S, S + KV, final_state + bh * KV);
    }
  });
}

template <typename F>
void gated_delta_recurrent_backward(const GatedDeltaArgs<F>& a, InBuf<F> d_o,
                                    InBuf<F> d_final_state, const GatedDeltaGrads<F>& gr) {
  const Geo d = resolve(a, "gated_delta_recurrent_backward");
  HLM_CHECK(d_o && gr.dq && gr.dk && gr.dv && gr.dg && gr.dbeta,
            "gated_delta_recurrent_backward: d_o, dq, dk, dv, dg, dbeta are required (B={} T={} H={})", d.B, d.T, d.H);
  const i64 KV = d.K * d.V, Cb = d.C, nb = (d.T + Cb - 1) / Cb;
  parallel_for(d.B * d.H, [&](i64 lo, i64 hi) {
    // [nb, K, V] states before each block, [Cb, K, V] states after each token of the current block.
    F* bst = thread_scratch<F>(0, (nb + Cb + 1) * KV + 2 * d.V);
    F* blk = bst + nb * KV;
    F* dS = blk + Cb * KV;
    F *r = dS + KV, *dd = r + d.V;
    for (i64 bh = lo; bh < hi; ++bh) {
      const i64 b = bh / d.H, h = bh % d.H;
      auto tok = [&](i64 t, const F*& q, const F*& k, const F*& v, F& g, F& be) {
        const i64 row = b * d.T + t;
        q = a.q + row * d.qs + h * d.K;
        k = a.k + row * d.ks + h * d.K;
        v = a.v + row * d.vs + h * d.V;
        g = a.g[row * d.H + h];
        be = a.beta[row * d.H + h];
      };
      // Forward sweep keeping only block-boundary states (S is the running state in dS's buffer).
      F* S = dS;
      if (a.initial_state)
        std::copy(a.initial_state + bh * KV, a.initial_state + (bh + 1) * KV, S);
      else
        std::fill(S, S + KV, F(0));
      for (i64 t = 0; t < d.T; ++t) {
        if (t % Cb == 0) std::copy(S, S + KV, bst + (t / Cb) * KV);
        if (d.reset(b, t)) std::fill(S, S + KV, F(0));
        const F *q, *k, *v;
        F g, be;
        tok(t, q, k, v, g, be);
        token_forward<F>(d.K, d.V, S, q, k, v, g, be, nullptr, r, dd);
      }
      if (d_final_state)
        std::copy(d_final_state + bh * KV, d_final_state + (bh + 1) * KV, dS);
      else
        std::fill(dS, dS + KV, F(0));
      for (i64 ib = nb - 1; ib >= 0; --ib) {
        const i64 t0 = ib * Cb, t1 = std::min(d.T, t0 + Cb);
        for (i64 t = t0; t < t1; ++t) {
          F* St = blk + (t - t0) * KV;
          const F* prev = t == t0 ? bst + ib * KV : St - KV;
          if (d.reset(b, t))
            std::fill(St, St + KV, F(0));
          else
            std::copy(prev, prev + KV, St);
          const F *q, *k, *v;
          F g, be;
          tok(t, q, k, v, g, be);
          token_forward<F>(d.K, d.V, St, q, k, v, g, be, nullptr, r, dd);
        }
        for (i64 t = t1 - 1; t >= t0; --t) {
          const bool rs = d.reset(b, t);
          const F* Sp = rs ? nullptr : (t == t0 ? bst + ib * KV : blk + (t - t0 - 1) * KV);
          const F *q, *k, *v;
          F g, be;
          tok(t, q, k, v, g, be);
          const i64 row = b * d.T + t;
          token_backward<F>(d.K, d.V, Sp, blk + (t - t0) * KV, dS, q, k, v, g, be, d_o + (row * d.H + h) * d.V,
                            gr.dq + row * d.qs + h * d.K, gr.dk + row * d.ks + h * d.K, gr.dv + row * d.vs + h * d.V,
                            gr.dg + row * d.H + h, gr.dbeta + row * d.H + h, r, dd);
          if (rs) std::fill(dS, dS + KV, F(0));  // the previous document does not see this one
        }
      }
      if (gr.d_initial_state) std::copy(dS, dS + KV, gr.d_initial_state + bh * KV);
    }
  });
}

template <typename F>
void gated_delta_step(const GatedDeltaArgs<F>& a, OutBuf<F> state, OutBuf<F> o) {
  GatedDeltaArgs<F> one = a;
  one.doc_start = nullptr;  // ignored: the caller resets the state at a document start
  const Geo d = resolve(one, "gated_delta_step");
  HLM_CHECK(d.T == 1 && state && o, "gated_delta_step: needs T == 1, a state and o (B={} T={} H={} K={} V={})", d.B,
            d.T, d.H, d.K, d.V);
  const i64 KV = d.K * d.V;
  parallel_for(d.B * d.H, [&](i64 lo, i64 hi) {
    F* rk = thread_scratch<F>(0, 2 * d.V);
    for (i64 bh = lo; bh < hi; ++bh) {
      const i64 b = bh / d.H, h = bh % d.H;
      token_step(d.K, d.V, state + bh * KV, a.q + b * d.qs + h * d.K, a.k + b * d.ks + h * d.K,
                 a.v + b * d.vs + h * d.V, a.g[bh], a.beta[bh], o + bh * d.V, rk, rk + d.V);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// Chunked entry points

template <typename F>
i64 gated_delta_chunk_states_numel(const GatedDeltaArgs<F>& a) {
  const Geo d = resolve(a, "gated_delta_chunk_states_numel", false);
  return d.B * d.H * max_segments(d) * d.K * d.V;
}

template <typename F>
void gated_delta_chunked_forward(const GatedDeltaArgs<F>& a, OutBuf<F> o,
                                 OutBuf<F> final_state, OutBuf<F> chunk_states) {
  const Geo d = resolve(a, "gated_delta_chunked_forward");
  HLM_CHECK(o, "gated_delta_chunked_forward: o is required (B={} T={} H={} V={})", d.B, d.T, d.H, d.V);
  const i64 KV = d.K * d.V, nseg = chunk_states ? max_segments(d) : 0;
  parallel_for(d.B * d.H, [&](i64 lo, i64 hi) {
    const i64 wn = ChunkWork<F>::numel(d.C, d.K, d.V);
    F* base = thread_scratch<F>(0, wn + KV);
    ChunkWork<F> w;
    w.carve(base, d.C, d.K, d.V);
    F* S = base + wn;
    for (i64 bh = lo; bh < hi; ++bh) {
      const i64 b = bh / d.H, h = bh % d.H;
      bool zero = !a.initial_state;  // S is known to be zero: skip its products
      if (!zero) std::copy(a.initial_state + bh * KV, a.initial_state + (bh + 1) * KV, S);
      i64 si = 0;
      for_segments(d, b, [&](i64 t0, i64 L) {
        if (d.reset(b, t0)) zero = true;
        if (chunk_states) {
          F* cs = chunk_states + (bh * nseg + si) * KV;
          if (zero)
            std::fill(cs, cs + KV, F(0));
          else
            std::copy(S, S + KV, cs);
        }
        const Seg<F> s = make_seg(a, d, b, h, t0, L);
        w.prepare(s, zero ? nullptr : S, true);
        w.output(s, zero ? nullptr : S, o + ((b * d.T + t0) * d.H + h) * d.V, d.H * d.V);
        w.update_state(s, S, zero);
        zero = false;
        ++si;
      });
      if (final_state) {
        if (zero)
          std::fill(final_state + bh * KV, final_state + (bh + 1) * KV, F(0));
        else
          std::copy(S, S + KV, final_state + bh * KV);
      }
    }
  });
}

template <typename F>
void gated_delta_chunked_backward(const GatedDeltaArgs<F>& a, InBuf<F> chunk_states,
                                  InBuf<F> d_o, InBuf<F> d_final_state,
                                  const GatedDeltaGrads<F>& gr) {
  const Geo d = resolve(a, "gated_delta_chunked_backward");
  HLM_CHECK(d_o && gr.dq && gr.dk && gr.dv && gr.dg && gr.dbeta,
            "gated_delta_chunked_backward: d_o, dq, dk, dv, dg, dbeta are required (B={} T={} H={})", d.B, d.T, d.H);
  const i64 KV = d.K * d.V, nseg = max_segments(d);
  parallel_for(d.B * d.H, [&](i64 lo, i64 hi) {
    const i64 wn = ChunkWork<F>::numel(d.C, d.K, d.V);
    F* base = thread_scratch<F>(0, wn + KV + (chunk_states ? 0 : nseg * KV));
    ChunkWork<F> w;
    w.carve(base, d.C, d.K, d.V);
    F* dS = base + wn;
    F* own = dS + KV;  // recomputed entry states [nseg, K, V] when none were saved
    thread_local std::vector<std::pair<i64, i64>> segs;
    for (i64 bh = lo; bh < hi; ++bh) {
      const i64 b = bh / d.H, h = bh % d.H;
      segs.clear();
      for_segments(d, b, [&](i64 t0, i64 L) { segs.emplace_back(t0, L); });
      const i64 ns = static_cast<i64>(segs.size());
      // zero_in[s]: the state entering segment s is zero (document start, or no initial state at t = 0).
      auto zero_in = [&](i64 si) { return segs[si].first == 0 ? !a.initial_state : d.reset(b, segs[si].first); };
      const F* st = chunk_states ? chunk_states + bh * nseg * KV : own;
      if (!chunk_states) {
        // One more scan over chunks to recover the entry states (docs/gated_delta.md §3.4).
        for (i64 si = 0; si < ns; ++si) {
          F* S = own + si * KV;  // set by the previous iteration when si > 0
          if (si == 0) {
            if (zero_in(0))
              std::fill(S, S + KV, F(0));
            else
              std::copy(a.initial_state + bh * KV, a.initial_state + (bh + 1) * KV, S);
          }
          if (si + 1 == ns) break;
          F* Sn = S + KV;
          if (zero_in(si + 1)) {
            std::fill(Sn, Sn + KV, F(0));
          } else {
            const Seg<F> s = make_seg(a, d, b, h, segs[si].first, segs[si].second);
            w.prepare(s, zero_in(si) ? nullptr : S, false);
            std::copy(S, S + KV, Sn);
            w.update_state(s, Sn, zero_in(si));
          }
        }
      }
      if (d_final_state)
        std::copy(d_final_state + bh * KV, d_final_state + (bh + 1) * KV, dS);
      else
        std::fill(dS, dS + KV, F(0));
      for (i64 si = ns - 1; si >= 0; --si) {
        const auto [t0, L] = segs[si];
        const bool zero = zero_in(si);
        const bool need_in = t0 == 0 ? gr.d_initial_state != nullptr : !d.reset(b, t0);
        const F* S = zero ? nullptr : st + si * KV;
        const Seg<F> s = make_seg(a, d, b, h, t0, L);
        w.prepare(s, S, true);
        const i64 row = b * d.T + t0;
        w.backward(s, S, dS, need_in, d_o + (row * d.H + h) * d.V, d.H * d.V, gr.dq + row * d.qs + h * d.K,
                   gr.dk + row * d.ks + h * d.K, gr.dv + row * d.vs + h * d.V, gr.dg + row * d.H + h,
                   gr.dbeta + row * d.H + h);
        if (!need_in) std::fill(dS, dS + KV, F(0));
      }
      if (gr.d_initial_state) std::copy(dS, dS + KV, gr.d_initial_state + bh * KV);
    }
  });
}

#define HLM_GATED_DELTA_INSTANTIATE(F)                                                                             \
  template void gated_delta_recurrent_forward<F>(const GatedDeltaArgs<F>&, OutBuf<F>,               \
                                                 OutBuf<F>);                                        \
  template void gated_delta_recurrent_backward<F>(const GatedDeltaArgs<F>&, InBuf<F>,        \
                                                  InBuf<F>, const GatedDeltaGrads<F>&);      \
  template void gated_delta_step<F>(const GatedDeltaArgs<F>&, OutBuf<F>, OutBuf<F>); \
  template i64 gated_delta_chunk_states_numel<F>(const GatedDeltaArgs<F>&);                                        \
  template void gated_delta_chunked_forward<F>(const GatedDeltaArgs<F>&, OutBuf<F>,                 \
                                               OutBuf<F>, OutBuf<F>);                \
  template void gated_delta_chunked_backward<F>(const GatedDeltaArgs<F>&, InBuf<F>,          \
                                                InBuf<F>, InBuf<F>,    \
                                                const GatedDeltaGrads<F>&);
HLM_GATED_DELTA_INSTANTIATE(float)
HLM_GATED_DELTA_INSTANTIATE(double)
#undef HLM_GATED_DELTA_INSTANTIATE

}  // namespace hlm::ops
