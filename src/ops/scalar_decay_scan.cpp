#include "ops/scalar_decay_scan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/doc_start.h"
#include "ops/kernel_blas.h"
#include "ops/kernel_grain.h"
#include "ops/scan_simd.h"
#include "ops/thread_scratch.h"

namespace hlm::ops {
namespace {

// Per-thread scratch (ops/thread_scratch.h) of this file, one slot per buffer a thread holds at once; the numbers
// are distinct across element types because Real may be double too. The workers' buffers, then the calling
// thread's whole-call ones (the chunk decays; the chunk states or workspace when the caller passes none), apart
// because the calling thread is also worker 0.
enum ScratchSlot : int {
  kSlotGam = 1, kSlotDgam, kSlotWork, kSlotDecay, kSlotRows, kSlotSeg,  // workers'
  kSlotChunkDecays, kSlotOwn                                            // the calling thread's
};

// A whole-call buffer of n elements the caller did not pass, zeroed (as a fresh std::vector would be).
template <typename Real>
Real* own_buffer(i64 n) {
  std::span<Real> s = thread_scratch_span<Real>(kSlotOwn, n);
  std::fill(s.begin(), s.end(), Real(0));
  return s.data();
}

// ---- resolved arguments -------------------------------------------------------------------------------

template <typename Real>
struct Geo {
  i64 B, T, H, Hk, K, V, C, NC, G;  // G = heads per q/k head
  i64 qr, qh, kr, kh, vr, vh;
  Real scale;
  const Real *q, *k, *v, *g, *init;
  const int32_t* ds;

  i64 KV() const { return K * V; }
  const Real* qp(i64 b, i64 t, i64 hk) const { return q + (b * T + t) * qr + hk * qh; }
  const Real* kp(i64 b, i64 t, i64 hk) const { return k + (b * T + t) * kr + hk * kh; }
  const Real* vp(i64 b, i64 t, i64 h) const { return v + (b * T + t) * vr + h * vh; }
  Real gv(i64 b, i64 t, i64 h) const { return g[(b * T + t) * H + h]; }
  i64 orow(i64 b, i64 t, i64 h) const { return ((b * T + t) * H + h) * V; }  // o / dout offset
  // Token t > 0 starts a new document (t = 0 never resets: the initial state feeds the row's first doc).
  bool reset(i64 b, i64 t) const { return starts_document(ds, T, b, t); }
};

template <typename Real>
std::string shape_str(const ScalarDecayArgs<Real>& a) {
  return fmt::format("B={} T={} H={} Hk={} K={} V={} chunk={}", a.B, a.T, a.H, a.Hk, a.K, a.V, a.chunk);
}

template <typename Real>
Geo<Real> resolve(const ScalarDecayArgs<Real>& a, const char* op) {
  HLM_CHECK(a.B >= 1 && a.T >= 1 && a.H >= 1 && a.Hk >= 1 && a.K >= 1 && a.V >= 1 && a.chunk >= 1,
            "{}: sizes must be positive ({})", op, shape_str(a));
  HLM_CHECK(a.H % a.Hk == 0, "{}: H must be a multiple of Hk ({})", op, shape_str(a));
  HLM_CHECK(a.q && a.k && a.v && a.g, "{}: q, k, v and g are required ({})", op, shape_str(a));
  Geo<Real> G{};
  G.B = a.B, G.T = a.T, G.H = a.H, G.Hk = a.Hk, G.K = a.K, G.V = a.V, G.C = a.chunk;
  G.NC = (a.T + a.chunk - 1) / a.chunk;
  G.G = a.H / a.Hk;
  G.qh = stride_or(a.q_head_stride, a.K);
  G.kh = stride_or(a.k_head_stride, a.K);
  G.vh = stride_or(a.v_head_stride, a.V);
  G.qr = stride_or(a.q_stride, a.Hk * a.K);
  G.kr = stride_or(a.k_stride, a.Hk * a.K);
  G.vr = stride_or(a.v_stride, a.H * a.V);
  auto shape = [&] { return shape_str(a); };
  check_row_layout(op, "q", G.qr, G.qh, a.Hk, a.K, shape);
  check_row_layout(op, "k", G.kr, G.kh, a.Hk, a.K, shape);
  check_row_layout(op, "v", G.vr, G.vh, a.H, a.V, shape);
  G.scale = a.scale;
  G.q = a.q, G.k = a.k, G.v = a.v, G.g = a.g, G.init = a.initial_state, G.ds = a.doc_start;
  check_doc_start(op, a.doc_start, a.B, a.T);
  return G;
}

// ---- per-chunk decay factors --------------------------------------------------------------------------
// For chunk c of (b, h), tokens t0 .. t0+n-1, in-chunk index i:
//   gam_i = sum_{m<=i} g_{t0+m}   (double: differences of long sums stay exact)
//   e_i   = exp(gam_i)            for tokens still in the document the carried state belongs to, else 0
//   f_j   = exp(gam_{n-1}-gam_j)  for tokens in the chunk's last document, else 0
//   eC    = exp(gam_{n-1})        if no document starts inside the chunk, else 0
//   Gamma_ij = exp(gam_i - gam_j) for seg_i <= j <= i (same document), else 0 (masked before exp)
template <typename Real>
struct ChunkDecay {
  i64 t0 = 0, n = 0, first_reset = 0, last_start = 0;
  Real eC = 0;
  std::span<double> gam;
  std::span<Real> e, f;
  std::span<i64> seg;

  explicit ChunkDecay(i64 C)
      : gam(thread_scratch_span<double>(kSlotGam, C)),
        e(thread_scratch_span<Real>(kSlotDecay, 2 * C).first(C)),
        f(thread_scratch_span<Real>(kSlotDecay, 2 * C).last(C)),
        seg(thread_scratch_span<i64>(kSlotSeg, C)) {}

  void compute(const Geo<Real>& G, i64 b, i64 h, i64 c) {
    t0 = c * G.C;
    n = std::min(G.C, G.T - t0);
    first_reset = n;
    last_start = 0;
    double s = 0;
    for (i64 i = 0; i < n; ++i) {
      if (G.reset(b, t0 + i)) {
        if (first_reset == n) first_reset = i;
        last_start = i;
      }
      s += G.gv(b, t0 + i, h);
      gam[i] = s;
      seg[i] = last_start;
    }
    constexpr Real ninf = -std::numeric_limits<Real>::infinity();
    for (i64 i = 0; i < n; ++i) e[i] = i < first_reset ? static_cast<Real>(gam[i]) : ninf;
    for (i64 j = 0; j < n; ++j) f[j] = j >= last_start ? static_cast<Real>(gam[n - 1] - gam[j]) : ninf;
    exp_inplace(e.data(), n);
    exp_inplace(f.data(), n);
    eC = first_reset == n ? static_cast<Real>(std::exp(gam[n - 1])) : Real(0);
  }

  // Gm[n, n] = Gamma (zeros outside the causal, same-document band).
  void gamma(Real* Gm) const {
    for (i64 i = 0; i < n; ++i) {
      Real* row = Gm + i * n;
      const i64 s = seg[i];
      for (i64 j = 0; j < s; ++j) row[j] = 0;
      for (i64 j = s; j <= i; ++j) row[j] = static_cast<Real>(gam[i] - gam[j]);
      exp_inplace(row + s, i - s + 1);
      for (i64 j = i + 1; j < n; ++j) row[j] = 0;
    }
  }
};

// eC of every (b, h, c): [B*H*NC], in the calling thread's scratch (every entry written). Same arithmetic as
// ChunkDecay::compute.
template <typename Real>
std::span<const Real> chunk_decays(const Geo<Real>& G) {
  std::span<Real> out = thread_scratch_span<Real>(kSlotChunkDecays, G.B * G.H * G.NC);
  parallel_for(
      G.B * G.H * G.NC,
      [&](i64 lo, i64 hi) {
        for (i64 task = lo; task < hi; ++task) {
          const i64 bh = task / G.NC, c = task % G.NC, b = bh / G.H, h = bh % G.H;
          const i64 t0 = c * G.C, n = std::min(G.C, G.T - t0);
          bool any_reset = false;
          double s = 0;
          for (i64 i = 0; i < n; ++i) {
            any_reset = any_reset || G.reset(b, t0 + i);
            s += G.gv(b, t0 + i, h);
          }
          out[task] = any_reset ? Real(0) : static_cast<Real>(std::exp(s));
        }
      },
      min_tasks(G.C));
  return out;
}

constexpr i64 kScanBlock = 1024;  // state elements per task in the chunk scans

// states[B, H, NC, K, V] = state entering each chunk; final_state (optional) = state after the last chunk.
template <typename Real>
void compute_chunk_states(const Geo<Real>& G, std::span<const Real> eC, Real* states, Real* final_state) {
  const i64 KV = G.KV(), NC = G.NC, BH = G.B * G.H;
  // 1. Each chunk's own contribution (diag(f) K)^T V, written where the scan will add the carried state:
  //    slot c+1 for chunk c, the final state for the last chunk.
  parallel_for(
      BH * NC,
      [&](i64 lo, i64 hi) {
        ChunkDecay<Real> cd(G.C);
        std::span<Real> kf = thread_scratch_span<Real>(kSlotRows, G.C * G.K);
        for (i64 task = lo; task < hi; ++task) {
          const i64 bh = task / NC, c = task % NC, b = bh / G.H, h = bh % G.H, hk = h / G.G;
          Real* dst = c + 1 < NC ? states + (bh * NC + c + 1) * KV : final_state ? final_state + bh * KV : nullptr;
          if (!dst) continue;
          cd.compute(G, b, h, c);
          const i64 ls = cd.last_start, nn = cd.n - ls;
          scale_rows(Real(1), cd.f.data() + ls, G.kp(b, cd.t0 + ls, hk), G.kr, kf.data(), G.K, nn, G.K);
          gemm(true, false, G.K, G.V, nn, Real(1), kf.data(), G.K, G.vp(b, cd.t0 + ls, h), G.vr, Real(0), dst, G.V);
        }
      },
      min_tasks(G.C * G.KV()));
  // 2. Sequential scan over chunks: S_{c+1} = eC_c S_c + (own contribution of chunk c).
  const i64 nblk = (KV + kScanBlock - 1) / kScanBlock;
  parallel_for(
      BH * nblk,
      [&](i64 lo, i64 hi) {
        for (i64 task = lo; task < hi; ++task) {
          const i64 bh = task / nblk, r0 = (task % nblk) * kScanBlock, r1 = std::min(KV, r0 + kScanBlock);
          Real* S = states + bh * NC * KV;
          if (G.init)
            std::copy(G.init + bh * KV + r0, G.init + bh * KV + r1, S + r0);
          else
            std::fill(S + r0, S + r1, Real(0));
          for (i64 c = 0; c + 1 < NC; ++c) {
            const Real ec = eC[bh * NC + c];
            const Real* cur = S + c * KV;
            Real* nxt = S + (c + 1) * KV;
            if (ec != 0) axpy(ec, cur + r0, nxt + r0, r1 - r0);
          }
          if (final_state) {
            const Real ec = eC[bh * NC + NC - 1];
            const Real* cur = S + (NC - 1) * KV;
            Real* fin = final_state + bh * KV;
            if (ec != 0) axpy(ec, cur + r0, fin + r0, r1 - r0);
          }
        }
      },
      min_tasks(NC * std::min(KV, kScanBlock)));
}

// Work buffers of the chunk kernels, carved from this thread's scratch.
template <typename Real>
struct Scratch {
  std::span<Real> A, Gm, dP, dPG, rows, tmp, dQ, dK, colsum;
  std::span<double> dgam;
  Scratch(i64 C, i64 K, i64 V) {
    const i64 CC = C * C, CK = C * K, CM = C * std::max(K, V);
    std::span<Real> all = thread_scratch_span<Real>(kSlotWork, 4 * CC + 3 * CK + CM + C);
    auto take = [&](i64 n) {
      std::span<Real> part = all.first(static_cast<size_t>(n));
      all = all.subspan(static_cast<size_t>(n));
      return part;
    };
    A = take(CC), Gm = take(CC), dP = take(CC), dPG = take(CC), rows = take(CK), tmp = take(CM), dQ = take(CK),
    dK = take(CK), colsum = take(C);
    dgam = thread_scratch_span<double>(kSlotDgam, C);
  }
};

// ---- recurrent pieces -----------------------------------------------------------------------------------

// S <- (reset ? 0 : exp(g) S) + k v^T for token t of (b, h).
template <typename Real>
inline void advance(const Geo<Real>& G, i64 b, i64 t, i64 h, Real* S) {
  const i64 KV = G.KV();
  if (G.reset(b, t)) {
    std::fill(S, S + KV, Real(0));
  } else {
    const Real a = std::exp(G.gv(b, t, h));
    for (i64 r = 0; r < KV; ++r) S[r] *= a;
  }
  const Real* kt = G.kp(b, t, h / G.G);
  const Real* vt = G.vp(b, t, h);
  for (i64 i = 0; i < G.K; ++i) {
    const Real ki = kt[i];
    Real* row = S + i * G.V;
    for (i64 j = 0; j < G.V; ++j) row[j] += ki * vt[j];
  }
}

// o_t = scale S^T q_t
template <typename Real>
inline void emit(const Geo<Real>& G, i64 b, i64 t, i64 h, const Real* S, Real* o) {
  const Real* qt = G.qp(b, t, h / G.G);
  for (i64 j = 0; j < G.V; ++j) o[j] = 0;
  for (i64 i = 0; i < G.K; ++i) {
    const Real qi = G.scale * qt[i];
    const Real* row = S + i * G.V;
    for (i64 j = 0; j < G.V; ++j) o[j] += qi * row[j];
  }
}

}  // namespace

template <typename Real>
i64 scalar_decay_num_chunks(const ScalarDecayArgs<Real>& a) {
  HLM_CHECK(a.T >= 1 && a.chunk >= 1, "scalar_decay_num_chunks: bad T or chunk ({})", shape_str(a));
  return (a.T + a.chunk - 1) / a.chunk;
}

template <typename Real>
i64 scalar_decay_chunk_states_numel(const ScalarDecayArgs<Real>& a) {
  return a.B * a.H * scalar_decay_num_chunks(a) * a.K * a.V;
}

template <typename Real>
i64 scalar_decay_backward_workspace_numel(const ScalarDecayArgs<Real>& a) {
  // dS per chunk, plus room to recompute the chunk states when the forward did not save them.
  return 2 * scalar_decay_chunk_states_numel(a);
}

// ---- recurrent ------------------------------------------------------------------------------------------

template <typename Real>
void scalar_decay_recurrent_forward(const ScalarDecayArgs<Real>& a, OutBuf<Real> o, OutBuf<Real> final_state) {
  const auto G = resolve(a, "scalar_decay_recurrent_forward");
  HLM_CHECK(o != nullptr, "scalar_decay_recurrent_forward: o is required ({})", shape_str(a));
  const i64 KV = G.KV();
  parallel_for(
      G.B * G.H,
      [&](i64 lo, i64 hi) {
        std::span<Real> S = thread_scratch_span<Real>(kSlotWork, KV);
        for (i64 bh = lo; bh < hi; ++bh) {
          const i64 b = bh / G.H, h = bh % G.H;
          if (G.init)
            std::copy(G.init + bh * KV, G.init + (bh + 1) * KV, S.begin());
          else
            std::fill(S.begin(), S.end(), Real(0));
          for (i64 t = 0; t < G.T; ++t) {
            advance(G, b, t, h, S.data());
            emit(G, b, t, h, S.data(), o + G.orow(b, t, h));
          }
          if (final_state) std::copy(S.begin(), S.end(), final_state + bh * KV);
        }
      },
      min_tasks(G.T * G.KV() * 3));
}

template <typename Real>
void scalar_decay_recurrent_backward(const ScalarDecayArgs<Real>& a, InBuf<Real> dout, InBuf<Real> d_final_state,
                                     const ScalarDecayGrads<Real>& gr) {
  const auto G = resolve(a, "scalar_decay_recurrent_backward");
  Real *dq = gr.dq, *dk = gr.dk, *dv = gr.dv, *dg = gr.dg, *d_initial_state = gr.d_initial_state;
  HLM_CHECK(dout && dq && dk && dv && dg, "scalar_decay_recurrent_backward: d_o, dq, dk, dv, dg are required ({})",
            shape_str(a));
  const i64 KV = G.KV(), L = 64, nseg = (G.T + L - 1) / L;
  // One task per (b, q/k head): the heads sharing q/k add into dq/dk in a fixed order.
  parallel_for(
      G.B * G.Hk,
      [&](i64 lo, i64 hi) {
        std::span<Real> all = thread_scratch_span<Real>(kSlotWork, (nseg + L + 2) * KV);
        std::span<Real> ck = all.first(nseg * KV), buf = all.subspan(nseg * KV, L * KV),
                        dS = all.subspan((nseg + L) * KV, KV), S = all.last(KV);
        for (i64 task = lo; task < hi; ++task) {
          const i64 b = task / G.Hk, hk = task % G.Hk;
          for (i64 t = 0; t < G.T; ++t) {
            std::fill(dq + (b * G.T + t) * G.qr + hk * G.qh, dq + (b * G.T + t) * G.qr + hk * G.qh + G.K, Real(0));
            std::fill(dk + (b * G.T + t) * G.kr + hk * G.kh, dk + (b * G.T + t) * G.kr + hk * G.kh + G.K, Real(0));
          }
          for (i64 h = hk * G.G; h < (hk + 1) * G.G; ++h) {
            const i64 bh = b * G.H + h;
            // Segment-boundary states, then each segment's states recomputed on the way back.
            if (G.init)
              std::copy(G.init + bh * KV, G.init + (bh + 1) * KV, S.begin());
            else
              std::fill(S.begin(), S.end(), Real(0));
            for (i64 s = 0; s < nseg; ++s) {
              std::copy(S.begin(), S.end(), ck.begin() + s * KV);
              for (i64 t = s * L; t < std::min(G.T, (s + 1) * L); ++t) advance(G, b, t, h, S.data());
            }
            if (d_final_state)
              std::copy(d_final_state + bh * KV, d_final_state + (bh + 1) * KV, dS.begin());
            else
              std::fill(dS.begin(), dS.end(), Real(0));
            for (i64 s = nseg - 1; s >= 0; --s) {
              const i64 t0 = s * L, n = std::min(L, G.T - t0);
              std::copy(ck.begin() + s * KV, ck.begin() + (s + 1) * KV, S.begin());
              for (i64 i = 0; i < n; ++i) {
                advance(G, b, t0 + i, h, S.data());
                std::copy(S.begin(), S.end(), buf.begin() + i * KV);
              }
              for (i64 i = n - 1; i >= 0; --i) {
                const i64 t = t0 + i;
                const Real* St = buf.data() + i * KV;
                const Real* Sp = i > 0 ? buf.data() + (i - 1) * KV : ck.data() + s * KV;
                const Real* qt = G.qp(b, t, hk);
                const Real* kt = G.kp(b, t, hk);
                const Real* vt = G.vp(b, t, h);
                const Real* dot_ = dout + G.orow(b, t, h);
                Real* dqt = dq + (b * G.T + t) * G.qr + hk * G.qh;
                Real* dkt = dk + (b * G.T + t) * G.kr + hk * G.kh;
                Real* dvt = dv + (b * G.T + t) * G.vr + h * G.vh;
                for (i64 i2 = 0; i2 < G.K; ++i2) {
                  Real* row = dS.data() + i2 * G.V;
                  const Real qi = G.scale * qt[i2];
                  for (i64 j = 0; j < G.V; ++j) row[j] += qi * dot_[j];
                  dqt[i2] += G.scale * dot(St + i2 * G.V, dot_, G.V);
                  dkt[i2] += dot(row, vt, G.V);
                }
                for (i64 j = 0; j < G.V; ++j) dvt[j] = 0;
                for (i64 i2 = 0; i2 < G.K; ++i2) {
                  const Real ki = kt[i2];
                  const Real* row = dS.data() + i2 * G.V;
                  for (i64 j = 0; j < G.V; ++j) dvt[j] += ki * row[j];
                }
                Real& dgt = dg[(b * G.T + t) * G.H + h];
                if (G.reset(b, t)) {
                  dgt = 0;
                  std::fill(dS.begin(), dS.end(), Real(0));
                } else {
                  const Real at = std::exp(G.gv(b, t, h));
                  dgt = at * dot(dS.data(), Sp, KV);
                  for (i64 r = 0; r < KV; ++r) dS[r] *= at;
                }
              }
            }
            if (d_initial_state) std::copy(dS.begin(), dS.end(), d_initial_state + bh * KV);
          }
        }
      },
      min_tasks(G.G * G.T * G.KV() * 8));
}

template <typename Real>
void scalar_decay_step(const ScalarDecayArgs<Real>& a, OutBuf<Real> state, OutBuf<Real> o) {
  const auto G = resolve(a, "scalar_decay_step");
  HLM_CHECK(a.T == 1 && !a.initial_state && !a.doc_start && state && o,
            "scalar_decay_step: needs T == 1, state and o, and no initial_state / doc_start ({})", shape_str(a));
  parallel_for(
      G.B * G.H,
      [&](i64 lo, i64 hi) {
        for (i64 bh = lo; bh < hi; ++bh) {
          const i64 b = bh / G.H, h = bh % G.H;
          // advance then emit in one pass over S, on the dispatched kernel (no document start here).
          state_decay_rank1(state + bh * G.KV(), G.K, G.V, Real(std::exp(G.gv(b, 0, h))), G.kp(b, 0, h / G.G),
                            G.vp(b, 0, h), G.scale, G.qp(b, 0, h / G.G), o + G.orow(b, 0, h));
        }
      },
      min_tasks(G.KV() * 3));
}

// ---- chunked --------------------------------------------------------------------------------------------

template <typename Real>
void scalar_decay_chunked_forward(const ScalarDecayArgs<Real>& a, OutBuf<Real> o, OutBuf<Real> final_state,
                                  OutBuf<Real> chunk_states) {
  const auto G = resolve(a, "scalar_decay_chunked_forward");
  HLM_CHECK(o != nullptr, "scalar_decay_chunked_forward: o is required ({})", shape_str(a));
  const i64 KV = G.KV(), NC = G.NC, ldo = G.H * G.V;
  if (!chunk_states) chunk_states = own_buffer<Real>(G.B * G.H * NC * KV);
  const auto eC = chunk_decays(G);
  compute_chunk_states(G, eC, chunk_states, final_state);

  // Outputs, one task per (b, q/k head, chunk): Q K^T is shared by the G heads reading that q/k head.
  parallel_for(
      G.B * G.Hk * NC,
      [&](i64 lo, i64 hi) {
        ChunkDecay<Real> cd(G.C);
        Scratch<Real> sc(G.C, G.K, G.V);
        for (i64 task = lo; task < hi; ++task) {
          const i64 bhk = task / NC, c = task % NC, b = bhk / G.Hk, hk = bhk % G.Hk;
          const i64 t0 = c * G.C, n = std::min(G.C, G.T - t0);
          const Real* Qp = G.qp(b, t0, hk);
          // A[n, n] = scale Q K^T
          gemm(false, true, n, n, G.K, G.scale, Qp, G.qr, G.kp(b, t0, hk), G.kr, Real(0), sc.A.data(), n);
          for (i64 h = hk * G.G; h < (hk + 1) * G.G; ++h) {
            cd.compute(G, b, h, c);
            cd.gamma(sc.Gm.data());
            Real* P = sc.Gm.data();
            mul_inplace(P, sc.A.data(), n * n);
            Real* Op = o + G.orow(b, t0, h);
            // intra-chunk: O = (A .* Gamma) V
            gemm(false, false, n, G.V, n, Real(1), P, n, G.vp(b, t0, h), G.vr, Real(0), Op, ldo);
            // inter-chunk: O[:m] += diag(e) (scale Q) S_c, for the tokens still in the carried document
            const i64 m = cd.first_reset;
            if (m > 0 && (c > 0 || G.init)) {
              scale_rows(G.scale, cd.e.data(), Qp, G.qr, sc.rows.data(), G.K, m, G.K);
              const Real* Sc = chunk_states + ((b * G.H + h) * NC + c) * KV;
              gemm(false, false, m, G.V, G.K, Real(1), sc.rows.data(), G.K, Sc, G.V, Real(1), Op, ldo);
            }
          }
        }
      },
      min_tasks(G.G * G.C * G.KV() * 6));
}

// ---- chunked backward, in the stages of docs/scalar_decay_scan.md "Chunked backward" ---------------------

namespace {

// Stage 1: each chunk's own term of the gradient of its incoming state, (diag(e) scale Q)^T dO, written where
// the reverse scan adds the carried gradient: slot c-1 of dSo for chunk c, d_initial_state for chunk 0.
template <typename Real>
void state_grad_own_terms(const Geo<Real>& G, const Real* dout, Real* dSo, Real* d_initial_state) {
  const i64 KV = G.KV(), NC = G.NC, BH = G.B * G.H, ldo = G.H * G.V;
  parallel_for(
      BH * NC,
      [&](i64 lo, i64 hi) {
        ChunkDecay<Real> cd(G.C);
        std::span<Real> qe = thread_scratch_span<Real>(kSlotRows, G.C * G.K);
        for (i64 task = lo; task < hi; ++task) {
          const i64 bh = task / NC, c = task % NC, b = bh / G.H, h = bh % G.H, hk = h / G.G;
          Real* dst = c > 0 ? dSo + (bh * NC + c - 1) * KV : d_initial_state ? d_initial_state + bh * KV : nullptr;
          if (!dst) continue;
          cd.compute(G, b, h, c);
          const i64 m = cd.first_reset;
          if (m == 0) {
            std::fill(dst, dst + KV, Real(0));
            continue;
          }
          scale_rows(G.scale, cd.e.data(), G.qp(b, cd.t0, hk), G.qr, qe.data(), G.K, m, G.K);
          gemm(true, false, G.K, G.V, m, Real(1), qe.data(), G.K, dout + G.orow(b, cd.t0, h), ldo, Real(0), dst, G.V);
        }
      },
      min_tasks(G.C * G.KV()));
}

// Stage 2: the reverse scan over chunks, per (b, h, block of state elements):
// dS_out(c-1) = eC_c dS_out(c) + own(c); d_initial = eC_0 dS_out(0) + own(0).
template <typename Real>
void state_grad_reverse_scan(const Geo<Real>& G, std::span<const Real> eC, const Real* d_final_state, Real* dSo,
                             Real* d_initial_state) {
  const i64 KV = G.KV(), NC = G.NC, BH = G.B * G.H;
  const i64 nblk = (KV + kScanBlock - 1) / kScanBlock;
  parallel_for(
      BH * nblk,
      [&](i64 lo, i64 hi) {
        for (i64 task = lo; task < hi; ++task) {
          const i64 bh = task / nblk, r0 = (task % nblk) * kScanBlock, r1 = std::min(KV, r0 + kScanBlock);
          Real* D = dSo + bh * NC * KV;
          Real* last = D + (NC - 1) * KV;
          if (d_final_state)
            std::copy(d_final_state + bh * KV + r0, d_final_state + bh * KV + r1, last + r0);
          else
            std::fill(last + r0, last + r1, Real(0));
          for (i64 c = NC - 1; c >= 1; --c) {
            const Real ec = eC[bh * NC + c];
            if (ec != 0) axpy(ec, D + c * KV + r0, D + (c - 1) * KV + r0, r1 - r0);
          }
          if (d_initial_state) {
            const Real ec = eC[bh * NC];
            Real* di = d_initial_state + bh * KV;
            if (ec != 0) axpy(ec, D + r0, di + r0, r1 - r0);
          }
        }
      },
      min_tasks(NC * std::min(KV, kScanBlock)));
}

// Stage 3: the gradients of q, k, v and g of one (b, q/k head, chunk) task, given the states entering the chunks
// and the gradients dS of the states leaving them. Per head h sharing the q/k head: (a) the intra-chunk terms
// through P = A .* Gamma, (b) the terms through the state leaving the chunk, (c) those through the carried state,
// (d) dg from d gamma; then (e) the q/k terms of all those heads at once.
template <typename Real>
struct ChunkGrads {
  const Geo<Real>& G;
  const Real *states, *dSo, *dout;  // states entering / gradients of the states leaving each chunk, dO
  bool saved_states, has_d_final;   // the states came from the forward; dS of the last chunk is given
  ChunkDecay<Real> cd;
  Scratch<Real> sc;
  // The task (b, q/k head hk, chunk c: tokens t0 .. t0+n-1) and the head h.
  i64 b = 0, hk = 0, c = 0, t0 = 0, n = 0, h = 0;
  const Real *Qp = nullptr, *Kp = nullptr, *dOp = nullptr, *Vp = nullptr, *Sc = nullptr, *dS = nullptr;
  Real* dVp = nullptr;
  bool dS_zero = false, S_zero = false;

  ChunkGrads(const Geo<Real>& G_, const Real* states_, const Real* dSo_, const Real* dout_, bool saved_states_,
             bool has_d_final_)
      : G(G_), states(states_), dSo(dSo_), dout(dout_), saved_states(saved_states_), has_d_final(has_d_final_),
        cd(G_.C), sc(G_.C, G_.K, G_.V) {}

  void run(i64 b_, i64 hk_, i64 c_, Real* dq, Real* dk, Real* dv, Real* dg) {
    b = b_, hk = hk_, c = c_;
    t0 = c * G.C, n = std::min(G.C, G.T - t0);
    Qp = G.qp(b, t0, hk);
    Kp = G.kp(b, t0, hk);
    // A = scale Q K^T, shared by the heads; dQ, dK and dPG (the sum over heads of dP .* Gamma) start at zero.
    gemm(false, true, n, n, G.K, G.scale, Qp, G.qr, Kp, G.kr, Real(0), sc.A.data(), n);
    std::fill(sc.dQ.begin(), sc.dQ.begin() + n * G.K, Real(0));
    std::fill(sc.dK.begin(), sc.dK.begin() + n * G.K, Real(0));
    std::fill(sc.dPG.data(), sc.dPG.data() + n * n, Real(0));
    for (i64 hh = hk * G.G; hh < (hk + 1) * G.G; ++hh) {
      start_head(hh, dv);
      intra_chunk();
      if (!dS_zero) through_leaving_state();
      if (cd.first_reset > 0 && !S_zero) through_carried_state();
      decay_grads(dg);
    }
    shared_qk_grads(dq, dk);
  }

  void start_head(i64 h_, Real* dv) {
    h = h_;
    const i64 bh = b * G.H + h, NC = G.NC, KV = G.KV();
    cd.compute(G, b, h, c);
    cd.gamma(sc.Gm.data());
    dOp = dout + G.orow(b, t0, h);
    Vp = G.vp(b, t0, h);
    dVp = dv + (b * G.T + t0) * G.vr + h * G.vh;
    Sc = states + (bh * NC + c) * KV;
    dS = dSo + (bh * NC + c) * KV;
    dS_zero = c == NC - 1 && !has_d_final;
    // Saved states are trusted as given (slot 0 holds the initial state even if a.initial_state is unset).
    S_zero = c == 0 && !G.init && !saved_states;
    std::fill(sc.dgam.data(), sc.dgam.data() + n, 0.0);
  }

  // (a) dP = dO V^T (n x n). dPG += dP .* Gamma; with R = dP .* Gamma .* A (= dGamma .* Gamma),
  // dgam_i += rowsum_i(R) - colsum_i(R). The diagonal cancels exactly and is left out: it is O(1) while
  // the rest scales with the decay, so keeping it would bury tiny gradients (strong decay) in rounding.
  // Then P = A .* Gamma (in place over Gamma) and dV = P^T dO.
  void intra_chunk() {
    const i64 ldo = G.H * G.V;
    Real* A = sc.A.data();
    Real* Gm = sc.Gm.data();
    Real* dP = sc.dP.data();
    Real* dPG = sc.dPG.data();
    double* dgam = sc.dgam.data();
    gemm(false, true, n, n, G.V, Real(1), dOp, ldo, Vp, G.vr, Real(0), dP, n);
    decay_band_grads(dP, Gm, A, dPG, sc.colsum.data(), dgam, n);
    mul_inplace(Gm, A, n * n);
    gemm(true, false, n, G.V, n, Real(1), Gm, n, dOp, ldo, Real(0), dVp, G.vr);
  }

  // (b) Terms through the state leaving the chunk, S' = eC S + (diag(f) K)^T V: dV[j] += f_j (K dS)_j,
  // df_j = (K dS)_j . v_j, dK[j] += f_j (V dS^T)_j, and eC <dS, S> into dgam_{n-1}.
  void through_leaving_state() {
    const i64 K = G.K, V = G.V, KV = G.KV();
    double* dgam = sc.dgam.data();
    const i64 ls = cd.last_start, nn = n - ls;
    Real* tmp = sc.tmp.data();
    gemm(false, false, nn, V, K, Real(1), Kp + ls * G.kr, G.kr, dS, V, Real(0), tmp, V);
    double dfsum = 0;
    axpy_rows(cd.f.data() + ls, tmp, V, dVp + ls * G.vr, G.vr, nn, V);
    for (i64 j = 0; j < nn; ++j) {
      if (ls + j == n - 1) continue;  // f_{n-1} = 1 whatever gam is (same reason as the diagonal in (a))
      const Real fj = cd.f[ls + j];
      const double dff = static_cast<double>(dot(tmp + j * V, Vp + (ls + j) * G.vr, V)) * fj;
      dgam[ls + j] -= dff;
      dfsum += dff;
    }
    dgam[n - 1] += dfsum;
    gemm(false, true, nn, K, V, Real(1), Vp + ls * G.vr, G.vr, dS, V, Real(0), tmp, K);
    axpy_rows(cd.f.data() + ls, tmp, K, sc.dK.data() + ls * K, K, nn, K);
    if (cd.eC != 0 && !S_zero) dgam[n - 1] += static_cast<double>(dot(dS, Sc, KV)) * cd.eC;
  }

  // (c) Terms through the carried state, O[:m] += diag(e) scale Q S: with dO S^T, dgam_i through e_i and
  // dQ[i] += e_i (dO S^T)_i (scaled at the end).
  void through_carried_state() {
    const i64 K = G.K, ldo = G.H * G.V, m = cd.first_reset;
    double* dgam = sc.dgam.data();
    Real* tmp = sc.tmp.data();
    gemm(false, true, m, K, G.V, Real(1), dOp, ldo, Sc, G.V, Real(0), tmp, K);  // dO S^T
    for (i64 i = 0; i < m; ++i) dgam[i] += static_cast<double>(G.scale * dot(tmp + i * K, Qp + i * G.qr, K)) * cd.e[i];
    axpy_rows(cd.e.data(), tmp, K, sc.dQ.data(), K, m, K);
  }

  // (d) g_t enters gam_i for every i >= t in the chunk: dg is the suffix sum of dgam.
  void decay_grads(Real* dg) {
    const double* dgam = sc.dgam.data();
    double acc = 0;
    for (i64 i = n - 1; i >= 0; --i) {
      acc += dgam[i];
      dg[(b * G.T + t0 + i) * G.H + h] = static_cast<Real>(acc);
    }
  }

  // (e) Intra-chunk q/k terms once for all heads, dQ += dPG K, dK += dPG^T (scale Q); dq = scale dQ, dk = dK.
  void shared_qk_grads(Real* dq, Real* dk) {
    const i64 K = G.K;
    gemm(false, false, n, K, n, Real(1), sc.dPG.data(), n, Kp, G.kr, Real(1), sc.dQ.data(), K);
    gemm(true, false, n, K, n, G.scale, sc.dPG.data(), n, Qp, G.qr, Real(1), sc.dK.data(), K);
    scale_rows(G.scale, static_cast<const Real*>(nullptr), sc.dQ.data(), K, dq + (b * G.T + t0) * G.qr + hk * G.qh,
               G.qr, n, K);
    for (i64 i = 0; i < n; ++i) std::copy_n(sc.dK.data() + i * K, K, dk + (b * G.T + t0 + i) * G.kr + hk * G.kh);
  }
};

}  // namespace

template <typename Real>
void scalar_decay_chunked_backward(const ScalarDecayArgs<Real>& a, InBuf<Real> chunk_states, InBuf<Real> dout,
                                   InBuf<Real> d_final_state, const ScalarDecayGrads<Real>& gr,
                                   OutBuf<Real> workspace) {
  const auto G = resolve(a, "scalar_decay_chunked_backward");
  Real *dq = gr.dq, *dk = gr.dk, *dv = gr.dv, *dg = gr.dg, *d_initial_state = gr.d_initial_state;
  HLM_CHECK(dout && dq && dk && dv && dg, "scalar_decay_chunked_backward: d_o, dq, dk, dv, dg are required ({})",
            shape_str(a));
  const i64 NC = G.NC, nstate = G.B * G.H * NC * G.KV();
  if (!workspace) workspace = own_buffer<Real>(chunk_states ? nstate : 2 * nstate);
  const auto eC = chunk_decays(G);
  Real* dSo = workspace;  // [B, H, NC, K, V]: gradient of the state LEAVING each chunk
  const Real* states = chunk_states;
  if (!states) {
    Real* st = workspace + nstate;
    compute_chunk_states(G, eC, st, static_cast<Real*>(nullptr));
    states = st;
  }
  state_grad_own_terms(G, dout, dSo, d_initial_state);
  state_grad_reverse_scan(G, eC, d_final_state, dSo, d_initial_state);
  parallel_for(
      G.B * G.Hk * NC,
      [&](i64 lo, i64 hi) {
        ChunkGrads<Real> w(G, states, dSo, dout, chunk_states != nullptr, d_final_state != nullptr);
        for (i64 task = lo; task < hi; ++task) {
          const i64 bhk = task / NC, c = task % NC;
          w.run(bhk / G.Hk, bhk % G.Hk, c, dq, dk, dv, dg);
        }
      },
      min_tasks(G.G * G.C * G.KV() * 16));
}

#define HLM_INSTANTIATE(Real)                                                                                       \
  template i64 scalar_decay_num_chunks(const ScalarDecayArgs<Real>&);                                               \
  template i64 scalar_decay_chunk_states_numel(const ScalarDecayArgs<Real>&);                                       \
  template i64 scalar_decay_backward_workspace_numel(const ScalarDecayArgs<Real>&);                                 \
  template void scalar_decay_recurrent_forward(const ScalarDecayArgs<Real>&, Real*, Real*);                         \
  template void scalar_decay_recurrent_backward(const ScalarDecayArgs<Real>&, const Real*, const Real*,             \
                                                const ScalarDecayGrads<Real>&);                                     \
  template void scalar_decay_step(const ScalarDecayArgs<Real>&, Real*, Real*);                                      \
  template void scalar_decay_chunked_forward(const ScalarDecayArgs<Real>&, Real*, Real*, Real*);                    \
  template void scalar_decay_chunked_backward(const ScalarDecayArgs<Real>&, const Real*, const Real*, const Real*,  \
                                              const ScalarDecayGrads<Real>&, Real*);
HLM_INSTANTIATE(float)
HLM_INSTANTIATE(double)
#undef HLM_INSTANTIATE

}  // namespace hlm::ops
