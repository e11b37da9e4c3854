// Causal softmax attention (flash style). Derivation, tiling and measured speed: docs/attention.md.
//
// Both passes split the work into items (b, kv head, segment of 64-row query tiles) that handle all query
// heads of the group, so each K/V tile is packed once per item.
// Forward: per query tile and each key tile in the band, S^T = K Q^T, an online softmax (running max and
// sum per query, log2 domain) and O += P V; lse is saved.
// Backward (flash-attention-2 algebra, P recomputed from q, k and lse): per query tile and key tile,
// S, dP = dO V^T, dS = P (dP - D); dQ accumulates in a tile buffer, dK/dV for the whole row in the item
// (summed over the group's heads). With several segments per (b, kv head), dK/dV partials are summed in
// segment order afterwards. No atomics, and the split depends on the shape only, so results are bitwise
// reproducible whatever the thread count.
//
// Within a tile pair, rows go in blocks of 4 and the other side in vectors of 16: a block only computes
// the vectors its rows can see (diagonal and window edges); elementwise masking uses per-row ranges.
//
// The SIMD code is written once with Google Highway and compiled per target (AVX-512, AVX2, NEON and a portable
// fallback; docs/performance.md); attention_forward/backward dispatch to the best target at run time. Vectors
// hold L floats (16 on AVX-512, 8 on AVX2, 4 on NEON, 1 or 4 on the fallback); the tiling logic works in groups
// of 16 columns (16 / L vectors).
#include "ops/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/simd_target.h"
#include "ops/bf16_pairs.h"
#include "ops/attention_tiles.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/microkernel-inl.h"
#include "ops/simd_math-inl.h"

// GCC 12's AVX-512 reduce/roundscale intrinsics start from _mm512_undefined_ps(): a false -Wmaybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using namespace hlm::ops::attn;
using micro::block;
using micro::DF;  // at most one 16-column group per vector
using micro::VF;

// Lanes whose column (`idx`, as integers) lies in the inclusive range [lo, hi]. Integer compares: turning lo and
// hi into floats for every key row (cvtsi2ss, then a broadcast) was a third of the forward softmax's time.
using DI = hn::RebindToSigned<DF>;
using VI = hn::Vec<DI>;
inline hn::Mask<DF> in_range(VI idx, int lo, int hi) {
  const DI di;
  return hn::RebindMask(DF(), hn::And(hn::Gt(idx, hn::Set(di, lo - 1)), hn::Lt(idx, hn::Set(di, hi + 1))));
}
// The same for the vector starting at column `first`.
inline hn::Mask<DF> in_range(int first, int lo, int hi) { return in_range(hn::Iota(DI(), first), lo, hi); }

// Dot product with L partial sums (fixed order, so still deterministic).
inline float dot(const float* a, const float* b, i64 n) {
  const DF d;
  const i64 L = static_cast<i64>(hn::Lanes(d));
  VF acc = hn::Zero(d);
  i64 i = 0;
  for (; i + L <= n; i += L) acc = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc);
  if (i < n) {
    const size_t c = static_cast<size_t>(n - i);
    acc = hn::MulAdd(load_part(d, a + i, c), load_part(d, b + i, c), acc);
  }
  return hn::GetLane(hn::SumOfLanes(d, acc));
}

// Transpose of n (<= 64) rows of one head, times mul: dst [hd][64], zero padded beyond n.
inline void pack_t(const float* src, i64 stride, int n, i64 hd, float mul, float* dst) {
  micro::transpose_rows(src, stride, n, kTile, hd, mul, dst, kTile);
}

// Under --precision bf16, the products run in bf16 with fp32 accumulation (ops/bf16_pairs.h) where the CPU has
// AVX512_BF16, whatever the Highway target; the softmax, its statistics, the accumulators and the outputs stay fp32.
// Pairs run along the head dimension, so hd is even (an odd hd keeps fp32 products).
inline bool bf16_products(const Geo& g) { return g.hd % 2 == 0 && bf16_pairs::active(); }

using bf16_pairs::Pair;
inline Pair* pair_scratch(int slot, i64 n) { return thread_scratch<Pair>(slot, n); }

}  // namespace

// ---- forward ------------------------------------------------------------------------------------------
void attention_forward_impl(const AttentionArgs& a, float* o, float* lse) {
  const Geo g = resolve(a, "attention_forward");
  const float *q = a.q, *k = a.k, *v = a.v;
  const i64 q_stride = g.q_stride, kv_stride = g.kv_stride;
  const int32_t* doc_start = a.doc_start;
  HLM_CHECK(q && k && v && o && lse, "attention_forward: null pointer (B={} T={} H={} hd={})", g.B, g.T, g.H, g.hd);
  const i64 B = g.B, T = g.T, H = g.H, Hkv = g.Hkv, hd = g.hd, nt = g.nt, Tk = g.Tk, off = g.off, ntk = g.ntk;
  const int32_t* lo = first_keys("attention_forward", g, doc_start);
  const float c2 = g.scale * kLog2e;  // scores in the log2 domain

  // Scores are computed transposed, S^T = K Q^T [keys, queries]: K rows are used as they are stored and
  // only the query tile is transposed. The softmax statistics then run down the key rows with 16 queries
  // per vector.
  // Work item = (b, kv head, segment of query tiles, see seg_of), all query heads of
  // the group, so each K/V tile is copied to contiguous rows once per item (rows of a fused qkv buffer sit
  // 3 KB apart at the bench config and share a few L1 sets, which costs the microkernel ~40%).
  // Segments spread a (b, kv head)'s query tiles over threads, each segment copying the keys it reads. With a key
  // offset (prefill on a cache) every query tile reads nearly all keys, so each extra segment re-copies the whole
  // cache: there, only as many items as threads (1 thread, 16K-token prefill: the copies were 18% of the time).
  const i64 want = off > 0 ? (g.par ? omp_get_max_threads() : 1) : kMinItems;
  const i64 nseg = std::clamp<i64>((want + B * Hkv - 1) / (B * Hkv), 1, nt);
  const i64 n_units = B * Hkv * nseg;
  const bool bf = bf16_products(g);
  const bool amx = bf && bf16_pairs::amx_active();  // bf16 products on whole tiles (ops/bf16_pairs.h product())
  const i64 hp = hd / 2;  // pairs per head row (bf16 products)
#pragma omp parallel if (g.par)
  {
    const size_t row_n = static_cast<size_t>(ntk * kTile * hd);
    float* k_all = bf ? nullptr : scratch(3, row_n);            // K rows [Tk, hd]
    float* v_all = bf ? nullptr : scratch(4, row_n);            // V rows [Tk, hd]
    float* st = scratch(0, kTile * kTile);                      // S^T then P^T  [64 keys, 64 queries]
    float* oacc = scratch(1, static_cast<size_t>(kTile * hd));  // O              [64 queries, hd]
    float* qt = bf ? nullptr : scratch(2, static_cast<size_t>(kTile * hd));  // Q^T * scale * log2(e)  [hd, 64]
    // bf16 products: K rows [Tk, hd/2 pairs], V row pairs [Tk/2, hd], Q^T pairs [hd/2, 64], P^T row pairs [32, 64].
    Pair* k2_all = bf ? pair_scratch(0, ntk * kTile * hp) : nullptr;
    Pair* v2_all = bf ? pair_scratch(1, ntk * kTile / 2 * hd) : nullptr;
    Pair* qt2 = bf ? pair_scratch(2, hp * kTile) : nullptr;
    Pair* pt2 = bf ? pair_scratch(3, kTile / 2 * kTile) : nullptr;
    std::vector<char> packed(static_cast<size_t>(ntk));
    alignas(64) float m[kTile], l[kTile], alpha[kTile];  // running max (log2 domain), sum, rescale
    int qv_a[kTile / 16], qv_z[kTile / 16];  // per 16-query vector: the keys any of its queries sees (z < 0: none)
    TileMask tm;
    Prefetcher pf;
    // Items handed out as threads free up: each writes only its own outputs, so the bits do not depend on which
    // thread runs it, and a vCPU that runs slower (or items that see fewer keys, with documents) leaves no thread
    // waiting at the end for a fixed share.
#pragma omp for schedule(dynamic, 1)
    for (i64 u = 0; u < n_units; ++u) {
      const i64 seg = u / (B * Hkv), b = (u / Hkv) % B, gh = u % Hkv;
      std::fill(packed.begin(), packed.end(), 0);
      for (i64 h = gh * g.hpg; h < (gh + 1) * g.hpg; ++h) {
        for (i64 it = next_tile(-1, seg, nseg, nt); it < nt; it = next_tile(it, seg, nseg, nt)) {
          const i64 i0 = it * kTile;
          const int nq = static_cast<int>(std::min<i64>(kTile, T - i0)), nqv = (nq + 15) / 16;
          const int32_t* lo_row = lo + b * T + i0;
          if (bf)
            bf16_pairs::round_rows_t(q + (b * T + i0) * q_stride + h * hd, q_stride, nq, hd, c2, qt2, kTile, kTile);
          else
            pack_t(q + (b * T + i0) * q_stride + h * hd, q_stride, nq, hd, c2, qt);
          const i64 j_first = lo_row[0] / kTile, j_last = (i0 + off + nq - 1) / kTile;
          // This tile's output rows, the next query tile and the next key tile not yet copied.
          pf.flush();
          pf.clear();
          pf.add(o + ((b * T + i0) * H + h) * hd, H * hd, nq, hd, true);
          if (const i64 it1 = next_tile(it, seg, nseg, nt); it1 < nt)
            pf.add(q + (b * T + it1 * kTile) * q_stride + h * hd, q_stride, std::min<i64>(kTile, T - it1 * kTile), hd,
                   false);
          if (j_last + 1 < ntk && !packed[j_last + 1]) {
            const i64 k1 = (b * Tk + (j_last + 1) * kTile) * kv_stride + gh * hd;
            const i64 n1 = std::min<i64>(kTile, Tk - (j_last + 1) * kTile);
            pf.add(k + k1, kv_stride, n1, hd, false);
            pf.add(v + k1, kv_stride, n1, hd, false);
          }
          std::fill(m, m + kTile, kNegInf);
          std::fill(l, l + kTile, 0.f);
          std::fill(oacc, oacc + nq * hd, 0.f);
          for (i64 j = j_first; j <= j_last; ++j) {
            const i64 k0 = j * kTile;
            const int nk = static_cast<int>(std::min<i64>(kTile, Tk - k0));
            tm.build(lo_row, i0 + off, nq, k0, nk);
            float* kbuf = bf ? nullptr : k_all + k0 * hd;  // [nk, hd]
            float* vbuf = bf ? nullptr : v_all + k0 * hd;
            Pair* k2 = bf ? k2_all + k0 * hp : nullptr;  // [nk, hd/2]
            Pair* v2 = bf ? v2_all + k0 / 2 * hd : nullptr;  // [(nk+1)/2, hd]
            if (!packed[j]) {
              const float* ksrc = k + (b * Tk + k0) * kv_stride + gh * hd;
              const float* vsrc = v + (b * Tk + k0) * kv_stride + gh * hd;
              if (bf) {
                bf16_pairs::round_rows(ksrc, kv_stride, nk, hd, 1.f, k2, hp);
                bf16_pairs::pair_rows(vsrc, kv_stride, 0, nk - 1, 0, (nk + 1) / 2, hd, v2, hd);
              } else {
                pack_rows(ksrc, kv_stride, nk, hd, kbuf);
                pack_rows(vsrc, kv_stride, nk, hd, vbuf);
              }
              packed[j] = 1;
            }
            // S^T[c0:c0+mc, visible query vectors] = K Q^T. On AMX the whole tile at once, over the query vectors
            // any key sees: the entries no query sees are computed too, and masked by the softmax as before.
            if (amx) {
              int w0 = kTile / 16, w1 = 0;
              for (int cb = 0; cb * kRB < nk; ++cb)
                if (tm.w0[cb] < tm.w1[cb]) w0 = std::min(w0, tm.w0[cb]), w1 = std::max(w1, tm.w1[cb]);
              if (w0 < w1)
                bf16_pairs::product(nk, 16 * (w1 - w0), hp, k2, hp, 1, qt2 + 16 * w0, kTile, st + 16 * w0, kTile,
                                    false);
            }
            for (int cb = 0; !amx && cb * kRB < nk; ++cb) {
              const int c0 = cb * kRB, mc = std::min(kRB, nk - c0), w0 = tm.w0[cb], w1 = tm.w1[cb];
              if (w0 == w1) continue;
              pf.step(12);
              if (bf)
                bf16_pairs::block(mc, 16 * (w1 - w0), hp, k2 + c0 * hp, hp, 1, qt2 + 16 * w0, kTile,
                                 st + c0 * kTile + 16 * w0, kTile, false);
              else
                block(mc, 16 * (w1 - w0), hd, kbuf + c0 * hd, hd, 1, qt + 16 * w0, kTile, st + c0 * kTile + 16 * w0,
                      kTile, false);
            }
            // Online softmax for 16 queries at a time over the keys any of them sees ([ca, cz]).
            for (int qv = 0; qv < nqv; ++qv) {
              int ca = kTile, cz = -1;
              for (int r = 16 * qv; r < std::min(nq, 16 * qv + 16); ++r)
                if (tm.cl[r] <= tm.ch[r]) ca = std::min(ca, tm.cl[r]), cz = std::max(cz, tm.ch[r]);
              qv_a[qv] = ca, qv_z[qv] = cz;
              if (cz < 0) {
                std::fill(alpha + 16 * qv, alpha + 16 * qv + 16, 1.f);
                continue;
              }
              const DF d;
              const VF ninf = hn::Set(d, kNegInf);
              // Where every query of the tile sees every key, the masks below are all true: skipped (same bits).
              const bool unmasked = tm.all_see_all;
              const auto all_lanes = hn::FirstN(d, hn::Lanes(d));
              for (int q0 = 16 * qv; q0 < 16 * qv + 16; q0 += static_cast<int>(hn::Lanes(d))) {
                const VI qidx = hn::Iota(DI(), q0);
                VF vmax = ninf;
                if (unmasked)
                  for (int c = ca; c <= cz; ++c) vmax = hn::Max(vmax, hn::LoadU(d, st + c * kTile + q0));
                else
                  for (int c = ca; c <= cz; ++c)
                    vmax = hn::Max(vmax, hn::IfThenElse(in_range(qidx, tm.ql[c], tm.qh[c]),
                                                        hn::LoadU(d, st + c * kTile + q0), ninf));
                const VF m_old = hn::Load(d, m + q0), m_new = hn::Max(m_old, vmax);
                // Lanes that had no key yet get alpha = 0 (their O and l are still zero).
                const VF a = exp2_masked(d, hn::Sub(m_old, m_new), hn::Ne(m_old, ninf));
                VF vsum = hn::Zero(d);
                for (int c = ca; c <= cz; ++c) {
                  float* sc = st + c * kTile + q0;
                  const auto seen = unmasked ? all_lanes : in_range(qidx, tm.ql[c], tm.qh[c]);
                  const VF p = exp2_masked(d, hn::Sub(hn::LoadU(d, sc), m_new), seen);
                  vsum = hn::Add(vsum, p);
                  hn::StoreU(p, d, sc);
                }
                hn::Store(hn::MulAdd(hn::Load(d, l + q0), a, vsum), d, l + q0);
                hn::Store(m_new, d, m + q0);
                hn::Store(a, d, alpha + q0);
              }
              // P^T rows [ca, cz] as key pairs for the bf16 PV product (keys outside read as zero).
              if (bf) bf16_pairs::pair_rows(st + 16 * qv, kTile, ca, cz, ca / 2, cz / 2 + 1, 16, pt2 + 16 * qv, kTile);
            }
            // O = alpha * O + P V, per block of 4 queries over the keys they see.
            for (int r = 0; r < nq; ++r)
              if (alpha[r] != 1.f)
                for (i64 d = 0; d < hd; ++d) oacc[r * hd + d] *= alpha[r];
            // On AMX per 16 queries, over the key pairs any of them sees (P^T is zero where a query sees no key).
            for (int qv = 0; amx && qv < nqv; ++qv)
              if (qv_z[qv] >= 0) {
                const int pa = qv_a[qv] / 2, pz = qv_z[qv] / 2 + 1;
                bf16_pairs::product(std::min(16, nq - 16 * qv), hd, pz - pa, pt2 + pa * kTile + 16 * qv, 1, kTile,
                                    v2 + pa * hd, hd, oacc + 16 * qv * hd, hd, true);
              }
            for (int qb = 0; !amx && qb * kRB < nq; ++qb) {
              const int r0 = qb * kRB, mr = std::min(kRB, nq - r0), kb = tm.kb[qb], ke = tm.ke[qb];
              if (kb == ke) continue;
              pf.step(12);
              if (bf) {
                const int pa = kb / 2, pz = (ke + 1) / 2;  // the key pairs covering kb .. ke-1
                bf16_pairs::block(mr, hd, pz - pa, pt2 + pa * kTile + r0, 1, kTile, v2 + pa * hd, hd, oacc + r0 * hd,
                                  hd, true);
              } else {
                block(mr, hd, ke - kb, st + kb * kTile + r0, 1, kTile, vbuf + kb * hd, hd, oacc + r0 * hd, hd, true);
              }
            }
          }
          for (int r = 0; r < nq; ++r) {
            const float inv = 1.f / l[r];
            float* orow = o + ((b * T + i0 + r) * H + h) * hd;
            for (i64 d = 0; d < hd; ++d) orow[d] = oacc[r * hd + d] * inv;
            lse[(b * H + h) * T + i0 + r] = (m[r] + std::log2(l[r])) * kLn2;
          }
        }
      }
    }
  }
}

// ---- backward -----------------------------------------------------------------------------------------
namespace {

// One worker's part of the backward (docs/attention.md "Backward", steps 1-6): for its current work item
// (b, kv head, segment of query tiles) the item's packed key tiles and dK/dV accumulators [T, hd] (summed
// over the query heads of the group); for the current query tile its Q, dO, D, lse and dQ; for the current
// tile pair P and dS. The buffers are the worker's scratch slots 0-9.
struct BackwardWork {
  const Geo& g;
  const float *q, *k, *v, *o, *lse, *dout;
  float *dq, *dk, *dv;
  i64 q_stride, kv_stride, o_stride;  // o, dout: [B, T, H, hd]
  const int32_t* lo;                  // first visible key per query (first_keys)
  float c2, scale;                    // scale * log2(e) (P in the log2 domain), and scale

  // per key tile, packed on first use: K^T, V^T [nt][hd][64], K rows [T, hd]
  float *kt_all = nullptr, *vt_all = nullptr, *k_all = nullptr;
  float *dk_own, *dv_own;          // dK, dV accumulators [T, hd] when nseg == 1 (else the segment partials)
  float *qbuf, *dobuf, *dqacc;     // the query tile's Q, dO and dQ [64, hd]
  float *pbuf, *dsbuf;             // S then P, dP then dS * scale  [64 queries, 64 keys]
  std::vector<char> packed;        // key tile j already packed for this item
  TileMask tm;
  Prefetcher pf;
  float lse2[kTile], Drow[kTile];  // the query tile's lse (log2 domain) and D = rowsum(dO * O)
  // bf16 products (bf16_products): the same operands rounded and paired along the summed dimension. Per key tile:
  // K^T, V^T [hd/2][64] (pairs along hd) and K row pairs [32][hd]; per query tile: Q, dO rows [64][hd/2] and row
  // pairs [32][hd]; per tile pair: dS rows [64][32] and the row pairs of P and dS [32][64]. The fp32 K^T, V^T and
  // K rows are then not kept.
  bool bf = false, amx = false;  // amx: the bf16 products on whole tiles (ops/bf16_pairs.h product())
  i64 hp = 0;  // pairs per head row
  Pair *kt2_all = nullptr, *vt2_all = nullptr, *kp2_all = nullptr;
  Pair *q2 = nullptr, *do2 = nullptr, *qp2 = nullptr, *dop2 = nullptr, *ds2 = nullptr, *pp2 = nullptr, *dsp2 = nullptr;

  // The current item, query head and query tile.
  i64 b = 0, gh = 0, seg = 0, nseg = 1, h = 0, it = 0, i0 = 0;
  int nq = 0;
  const int32_t* lo_row = nullptr;
  float *dkacc = nullptr, *dvacc = nullptr;

  BackwardWork(const Geo& g_, i64 nseg_, const float* q_, i64 q_stride_, const float* k_, const float* v_,
               i64 kv_stride_, const float* o_, const float* lse_, const float* dout_, float* dq_, float* dk_,
               float* dv_, const int32_t* lo_)
      : g(g_), q(q_), k(k_), v(v_), o(o_), lse(lse_), dout(dout_), dq(dq_), dk(dk_), dv(dv_), q_stride(q_stride_),
        kv_stride(kv_stride_), o_stride(g_.H * g_.hd), lo(lo_), c2(g_.scale * kLog2e), scale(g_.scale), nseg(nseg_) {
    const size_t row_n = static_cast<size_t>(g.nt * kTile * g.hd), tile_n = static_cast<size_t>(kTile * g.hd);
    bf = bf16_products(g), hp = g.hd / 2, amx = bf && bf16_pairs::amx_active();
    if (bf) {
      kt2_all = pair_scratch(0, g.nt * hp * kTile);
      vt2_all = pair_scratch(1, g.nt * hp * kTile);
      kp2_all = pair_scratch(2, g.nt * kTile / 2 * g.hd);
      q2 = pair_scratch(3, kTile * hp);
      do2 = pair_scratch(4, kTile * hp);
      qp2 = pair_scratch(5, kTile / 2 * g.hd);
      dop2 = pair_scratch(6, kTile / 2 * g.hd);
      ds2 = pair_scratch(7, kTile * kTile / 2);
      pp2 = pair_scratch(8, kTile / 2 * kTile);
      dsp2 = pair_scratch(9, kTile / 2 * kTile);
    } else {
      kt_all = scratch(0, row_n);
      vt_all = scratch(1, row_n);
      k_all = scratch(2, row_n);
    }
    dk_own = nseg > 1 ? nullptr : scratch(3, row_n);
    dv_own = nseg > 1 ? nullptr : scratch(4, row_n);
    qbuf = scratch(5, tile_n);
    dobuf = scratch(6, tile_n);
    dqacc = scratch(7, tile_n);
    pbuf = scratch(8, kTile * kTile);
    dsbuf = scratch(9, kTile * kTile);
    packed.resize(static_cast<size_t>(g.nt));
  }

  // A new item: its dK/dV accumulators (its own, or its segment's partial) start at zero, no key tile packed.
  void start_item(i64 seg_, i64 b_, i64 gh_, float* dk_part, float* dv_part, i64 part_n) {
    seg = seg_, b = b_, gh = gh_;
    const i64 T = g.T, hd = g.hd;
    dkacc = nseg > 1 ? dk_part + seg * part_n + (b * g.Hkv + gh) * T * hd : dk_own;
    dvacc = nseg > 1 ? dv_part + seg * part_n + (b * g.Hkv + gh) * T * hd : dv_own;
    std::fill(dkacc, dkacc + T * hd, 0.f);
    std::fill(dvacc, dvacc + T * hd, 0.f);
    std::fill(packed.begin(), packed.end(), 0);
  }

  // Step 1: query tile `it` of head `h`: Q and dO rows copied, D = rowsum(dO * O), lse in the log2 domain,
  // dQ zeroed.
  void load_query_tile(i64 h_, i64 it_) {
    h = h_, it = it_, i0 = it * kTile;
    const i64 T = g.T, hd = g.hd;
    nq = static_cast<int>(std::min<i64>(kTile, T - i0));
    lo_row = lo + b * T + i0;
    pack_rows(q + (b * T + i0) * q_stride + h * hd, q_stride, nq, hd, qbuf);
    pack_rows(dout + (b * T + i0) * o_stride + h * hd, o_stride, nq, hd, dobuf);
    for (int r = 0; r < nq; ++r) {
      Drow[r] = dot(o + (b * T + i0 + r) * o_stride + h * hd, dobuf + r * hd, hd);
      lse2[r] = lse[(b * g.H + h) * T + i0 + r] * kLog2e;
    }
    std::fill(dqacc, dqacc + nq * hd, 0.f);
    if (bf) {
      bf16_pairs::round_rows(qbuf, hd, nq, hd, 1.f, q2, hp);
      bf16_pairs::round_rows(dobuf, hd, nq, hd, 1.f, do2, hp);
      bf16_pairs::pair_rows(qbuf, hd, 0, nq - 1, 0, (nq + 1) / 2, hd, qp2, hd);
      bf16_pairs::pair_rows(dobuf, hd, 0, nq - 1, 0, (nq + 1) / 2, hd, dop2, hd);
    }
  }

  // The rows to request while this tile is computed: its dQ rows, the item's next query tile (the next head's
  // first after the last) and the next key tile not yet packed.
  void plan_prefetch(i64 j_last) {
    const i64 T = g.T, hd = g.hd, nt = g.nt;
    pf.flush();
    pf.clear();
    pf.add(dq + (b * T + i0) * q_stride + h * hd, q_stride, nq, hd, true);
    const i64 it1 = next_tile(it, seg, nseg, nt);
    const i64 h1 = it1 < nt ? h : h + 1, i1 = (it1 < nt ? it1 : next_tile(-1, seg, nseg, nt)) * kTile;
    if (h1 < (gh + 1) * g.hpg) {
      const i64 n1 = std::min<i64>(kTile, T - i1);
      pf.add(q + (b * T + i1) * q_stride + h1 * hd, q_stride, n1, hd, false);
      pf.add(dout + (b * T + i1) * o_stride + h1 * hd, o_stride, n1, hd, false);
      pf.add(o + (b * T + i1) * o_stride + h1 * hd, o_stride, n1, hd, false);
    }
    if (j_last + 1 < nt && !packed[j_last + 1]) {
      const i64 k1 = (b * T + (j_last + 1) * kTile) * kv_stride + gh * hd;
      const i64 n1 = std::min<i64>(kTile, T - (j_last + 1) * kTile);
      pf.add(k + k1, kv_stride, n1, hd, false);
      pf.add(v + k1, kv_stride, n1, hd, false);
    }
  }

  // Step 2: key tile j as K^T, V^T (for S and dP) and K rows (for dQ), once per item, on first use.
  void pack_key_tile(i64 j, int nk) {
    if (packed[j]) return;
    const i64 hd = g.hd, src = (b * g.T + j * kTile) * kv_stride + gh * hd;
    if (bf) {
      bf16_pairs::round_rows_t(k + src, kv_stride, nk, hd, 1.f, kt2_all + j * hp * kTile, kTile, kTile);
      bf16_pairs::round_rows_t(v + src, kv_stride, nk, hd, 1.f, vt2_all + j * hp * kTile, kTile, kTile);
      bf16_pairs::pair_rows(k + src, kv_stride, 0, nk - 1, 0, (nk + 1) / 2, hd, kp2_all + j * kTile / 2 * hd, hd);
    } else {
      pack_t(k + src, kv_stride, nk, hd, 1.f, kt_all + j * hd * kTile);
      pack_t(v + src, kv_stride, nk, hd, 1.f, vt_all + j * hd * kTile);
      pack_rows(k + src, kv_stride, nk, hd, k_all + j * kTile * hd);
    }
    packed[j] = 1;
  }

  // Steps 3-5 for the query rows r0 .. r0+mr-1 of the tile pair with key tile j (a block of kRB rows).
  void query_block(i64 j, int rb) {
    const i64 hd = g.hd;
    const int r0 = rb * kRB, mr = std::min(kRB, nq - r0);
    const int v0 = tm.v0[rb], v1 = tm.v1[rb];
    float* prow0 = pbuf + r0 * kTile;
    float* dsrow0 = dsbuf + r0 * kTile;
    if (v0 == v1) {  // the block sees no key of this tile
      std::fill(prow0, prow0 + mr * kTile, 0.f);
      std::fill(dsrow0, dsrow0 + mr * kTile, 0.f);
      return;
    }
    // Step 3: S = Q K^T and dP = dO V^T on the visible vectors of this row block.
    pf.step(8);
    if (bf) {
      bf16_pairs::block(mr, 16 * (v1 - v0), hp, q2 + r0 * hp, hp, 1, kt2_all + j * hp * kTile + 16 * v0, kTile,
                       prow0 + 16 * v0, kTile, false);
      bf16_pairs::block(mr, 16 * (v1 - v0), hp, do2 + r0 * hp, hp, 1, vt2_all + j * hp * kTile + 16 * v0, kTile,
                       dsrow0 + 16 * v0, kTile, false);
    } else {
      block(mr, 16 * (v1 - v0), hd, qbuf + r0 * hd, hd, 1, kt_all + j * hd * kTile + 16 * v0, kTile, prow0 + 16 * v0,
            kTile, false);
      block(mr, 16 * (v1 - v0), hd, dobuf + r0 * hd, hd, 1, vt_all + j * hd * kTile + 16 * v0, kTile,
            dsrow0 + 16 * v0, kTile, false);
    }
    // Step 4: P = 2^(S c2 - lse2), dS = P (dP - D) scale; zero outside the visible range (the transposed
    // products of step 6 read whole columns).
    for (int r = r0; r < r0 + mr; ++r) softmax_grad_row(r, v0, v1);
    // Step 5: dQ[r0:r0+mr] += dS K over the keys these rows see (dS already carries the scale).
    const int kb = tm.kb[rb], ke = tm.ke[rb];
    if (bf) {
      // dS rows rounded (whole rows: keys outside the visible range are zero there); the key pairs covering kb..ke-1.
      constexpr int kp = kTile / 2;
      const int pa = kb / 2, pz = (ke + 1) / 2;
      bf16_pairs::round_rows(dsrow0, kTile, mr, kTile, 1.f, ds2 + r0 * kp, kp);
      bf16_pairs::block(mr, hd, pz - pa, ds2 + r0 * kp + pa, kp, 1, kp2_all + (j * kp + pa) * hd, hd, dqacc + r0 * hd,
                       hd, true);
    } else {
      block(mr, hd, ke - kb, dsrow0 + kb, kTile, 1, k_all + j * kTile * hd + kb * hd, hd, dqacc + r0 * hd, hd, true);
    }
  }

  // Steps 3-5 on AMX tiles, for the whole query tile: S and dP over the key vectors any of its rows sees, each
  // row's softmax gradient (which zeroes what the row does not see), then dQ += dS K over the key pairs any row sees.
  void query_tile_amx(i64 j) {
    const i64 hd = g.hd;
    constexpr int kp = kTile / 2;
    int v0 = kTile / 16, v1 = 0, kb = kTile, ke = 0;
    for (int rb = 0; rb * kRB < nq; ++rb)
      if (tm.v0[rb] < tm.v1[rb])
        v0 = std::min(v0, tm.v0[rb]), v1 = std::max(v1, tm.v1[rb]), kb = std::min(kb, tm.kb[rb]),
        ke = std::max(ke, tm.ke[rb]);
    if (v0 >= v1) {
      std::fill(pbuf, pbuf + nq * kTile, 0.f);
      std::fill(dsbuf, dsbuf + nq * kTile, 0.f);
      return;
    }
    pf.step(64);
    bf16_pairs::product(nq, 16 * (v1 - v0), hp, q2, hp, 1, kt2_all + j * hp * kTile + 16 * v0, kTile, pbuf + 16 * v0,
                        kTile, false);
    bf16_pairs::product(nq, 16 * (v1 - v0), hp, do2, hp, 1, vt2_all + j * hp * kTile + 16 * v0, kTile,
                        dsbuf + 16 * v0, kTile, false);
    for (int rb = 0; rb * kRB < nq; ++rb)
      for (int r = rb * kRB; r < std::min(nq, rb * kRB + kRB); ++r)
        if (tm.v0[rb] < tm.v1[rb]) {
          softmax_grad_row(r, tm.v0[rb], tm.v1[rb]);
        } else {
          std::fill(pbuf + r * kTile, pbuf + (r + 1) * kTile, 0.f);
          std::fill(dsbuf + r * kTile, dsbuf + (r + 1) * kTile, 0.f);
        }
    pf.step(64);
    const int pa = kb / 2, pz = (ke + 1) / 2;
    bf16_pairs::round_rows(dsbuf, kTile, nq, kTile, 1.f, ds2, kp);
    bf16_pairs::product(nq, hd, pz - pa, ds2 + pa, kp, 1, kp2_all + (j * kp + pa) * hd, hd, dqacc, hd, true);
  }

  // Step 6 on AMX tiles, for the whole key tile over the query pairs that see any of its keys.
  void key_tile_amx(i64 k0, int nk) {
    const i64 hd = g.hd;
    int ra = nq, rz = -1;
    for (int c = 0; c < nk; ++c)
      if (tm.ql[c] <= tm.qh[c]) ra = std::min(ra, tm.ql[c]), rz = std::max(rz, tm.qh[c]);
    if (rz < 0) return;
    pf.step(128);
    const int pa = ra / 2, pz = rz / 2 + 1;
    bf16_pairs::product(nk, hd, pz - pa, pp2 + pa * kTile, 1, kTile, dop2 + pa * hd, hd, dvacc + k0 * hd, hd, true);
    bf16_pairs::product(nk, hd, pz - pa, dsp2 + pa * kTile, 1, kTile, qp2 + pa * hd, hd, dkacc + k0 * hd, hd, true);
  }

  // Step 4 for query row r, whose visible keys lie in the 16-key vectors [v0, v1) of its block.
  void softmax_grad_row(int r, int v0, int v1) {
    float* prow = pbuf + r * kTile;
    float* dsrow = dsbuf + r * kTile;
    const int cl = tm.cl[r], ch = tm.ch[r];
    const DF d;
    const VF vc2 = hn::Set(d, c2), vl = hn::Set(d, lse2[r]), vD = hn::Set(d, Drow[r]), vs = hn::Set(d, scale);
    for (int c0 = 0; c0 < kTile; c0 += static_cast<int>(hn::Lanes(d))) {
      if (c0 < 16 * v0 || c0 >= 16 * v1) {
        hn::StoreU(hn::Zero(d), d, prow + c0);
        hn::StoreU(hn::Zero(d), d, dsrow + c0);
        continue;
      }
      const VF p = exp2_masked(d, hn::MulSub(hn::LoadU(d, prow + c0), vc2, vl), in_range(c0, cl, ch));
      const VF dp = hn::Sub(hn::LoadU(d, dsrow + c0), vD);
      hn::StoreU(p, d, prow + c0);
      hn::StoreU(hn::Mul(hn::Mul(p, dp), vs), d, dsrow + c0);
    }
  }

  // Step 6: dV += P^T dO and dK += dS^T Q for the keys c0 .. c0+mc-1 of the tile starting at k0 (a block of kRB
  // keys), over the query rows that see them.
  void key_block(i64 k0, int nk, int cb) {
    const i64 hd = g.hd;
    const int c0 = cb * kRB, mc = std::min(kRB, nk - c0);
    int ra = nq, rz = -1;
    for (int c = c0; c < c0 + mc; ++c)
      if (tm.ql[c] <= tm.qh[c]) ra = std::min(ra, tm.ql[c]), rz = std::max(rz, tm.qh[c]);
    if (rz < 0) return;
    const i64 nr = rz - ra + 1;
    pf.step(8);
    if (bf) {
      // The query pairs covering ra..rz; rows outside see none of these keys, so their P and dS are zero there.
      const int pa = ra / 2, pz = rz / 2 + 1;
      bf16_pairs::block(mc, hd, pz - pa, pp2 + pa * kTile + c0, 1, kTile, dop2 + pa * hd, hd, dvacc + (k0 + c0) * hd,
                        hd, true);
      bf16_pairs::block(mc, hd, pz - pa, dsp2 + pa * kTile + c0, 1, kTile, qp2 + pa * hd, hd, dkacc + (k0 + c0) * hd,
                       hd, true);
      return;
    }
    block(mc, hd, nr, pbuf + ra * kTile + c0, 1, kTile, dobuf + ra * hd, hd, dvacc + (k0 + c0) * hd, hd, true);
    block(mc, hd, nr, dsbuf + ra * kTile + c0, 1, kTile, qbuf + ra * hd, hd, dkacc + (k0 + c0) * hd, hd, true);
  }

  // Steps 2-6 for the current query tile and key tile j.
  void tile_pair(i64 j) {
    const i64 k0 = j * kTile;
    const int nk = static_cast<int>(std::min<i64>(kTile, g.T - k0));
    pack_key_tile(j, nk);
    tm.build(lo_row, i0, nq, k0, nk);
    if (amx)
      query_tile_amx(j);
    else
      for (int rb = 0; rb * kRB < nq; ++rb) query_block(j, rb);
    if (bf) {  // P and dS as query pairs for step 6 (the padding row of an odd nq reads as zero)
      bf16_pairs::pair_rows(pbuf, kTile, 0, nq - 1, 0, (nq + 1) / 2, kTile, pp2, kTile);
      bf16_pairs::pair_rows(dsbuf, kTile, 0, nq - 1, 0, (nq + 1) / 2, kTile, dsp2, kTile);
    }
    if (amx)
      key_tile_amx(k0, nk);
    else
      for (int cb = 0; cb * kRB < nk; ++cb) key_block(k0, nk, cb);
  }

  // Steps 1-6 for query tile `it` of head `h`, over the key tiles in its band; its dQ is written once.
  void query_tile(i64 h_, i64 it_) {
    load_query_tile(h_, it_);
    const i64 j_first = lo_row[0] / kTile, j_last = (i0 + nq - 1) / kTile;
    plan_prefetch(j_last);
    for (i64 j = j_first; j <= j_last; ++j) tile_pair(j);
    for (int r = 0; r < nq; ++r)
      std::memcpy(dq + (b * g.T + i0 + r) * q_stride + h * g.hd, dqacc + r * g.hd, g.hd * sizeof(float));
  }

  // The item's dK and dV rows (nseg == 1: its accumulators are the result).
  void store_dk_dv() {
    const i64 T = g.T, hd = g.hd;
    for (i64 t = 0; t < T; ++t) {
      if (t + 8 < T) {
        __builtin_prefetch(dk + (b * T + t + 8) * kv_stride + gh * hd, 1, 2);
        __builtin_prefetch(dv + (b * T + t + 8) * kv_stride + gh * hd, 1, 2);
      }
      std::memcpy(dk + (b * T + t) * kv_stride + gh * hd, dkacc + t * hd, hd * sizeof(float));
      std::memcpy(dv + (b * T + t) * kv_stride + gh * hd, dvacc + t * hd, hd * sizeof(float));
    }
  }
};

// nseg > 1: dK and dV as the sum of the segments' partials [nseg, B, Hkv, T, hd], in segment order.
void sum_segment_partials(const Geo& g, i64 nseg, const float* dk_part, const float* dv_part, float* dk, float* dv,
                          i64 kv_stride) {
  const i64 T = g.T, hd = g.hd, Hkv = g.Hkv, part_n = g.B * Hkv * T * hd;
#pragma omp parallel for schedule(static) if (g.par)
  for (i64 bt = 0; bt < g.B * T; ++bt) {
    const i64 b = bt / T, t = bt % T;
    for (i64 gh = 0; gh < Hkv; ++gh) {
      float* dkr = dk + bt * kv_stride + gh * hd;
      float* dvr = dv + bt * kv_stride + gh * hd;
      const i64 off = ((b * Hkv + gh) * T + t) * hd;
      std::memcpy(dkr, dk_part + off, hd * sizeof(float));
      std::memcpy(dvr, dv_part + off, hd * sizeof(float));
      for (i64 sg = 1; sg < nseg; ++sg)
        for (i64 d = 0; d < hd; ++d) {
          dkr[d] += dk_part[sg * part_n + off + d];
          dvr[d] += dv_part[sg * part_n + off + d];
        }
    }
  }
}

}  // namespace

void attention_backward_impl(const AttentionArgs& a, const float* o, const float* lse, const float* dout,
                             const AttentionGrads& gr) {
  const Geo g = resolve(a, "attention_backward");
  const float *q = a.q, *k = a.k, *v = a.v;
  float *dq = gr.dq, *dk = gr.dk, *dv = gr.dv;
  const i64 q_stride = g.q_stride, kv_stride = g.kv_stride;
  const int32_t* doc_start = a.doc_start;
  HLM_CHECK(g.off == 0, "attention_backward: needs Tk == T (got T={} Tk={}; the key offset is forward only)", g.T,
            g.Tk);
  HLM_CHECK(q && k && v && o && lse && dout && dq && dk && dv,
            "attention_backward: null pointer (B={} T={} H={} hd={})", g.B, g.T, g.H, g.hd);
  const i64 B = g.B, T = g.T, Hkv = g.Hkv, hd = g.hd, nt = g.nt, hpg = g.hpg;
  const int32_t* lo = first_keys("attention_backward", g, doc_start);

  // Work item = (b, kv head, segment of query tiles, see seg_of). An item keeps dK, dV
  // of the whole row [T, hd] (summing over the query heads of its group) and each query tile's dQ [64, hd]
  // on its own. With nseg > 1, items write dK/dV partials [nseg, B, Hkv, T, hd] that are summed afterwards
  // in segment order. nseg depends on the shape only: results are bitwise equal for any thread count.
  const i64 nseg = std::clamp<i64>((kMinItems + B * Hkv - 1) / (B * Hkv), 1, nt);
  const i64 part_n = B * Hkv * T * hd;  // floats per segment partial
  float* dk_part = nseg > 1 ? scratch(14, static_cast<size_t>(nseg * part_n)) : nullptr;
  float* dv_part = nseg > 1 ? scratch(13, static_cast<size_t>(nseg * part_n)) : nullptr;

  const i64 n_units = B * Hkv * nseg;
#pragma omp parallel if (g.par)
  {
    BackwardWork w(g, nseg, q, q_stride, k, v, kv_stride, o, lse, dout, dq, dk, dv, lo);
#pragma omp for schedule(dynamic, 1)  // as in the forward: items write disjoint outputs
    for (i64 u = 0; u < n_units; ++u) {
      const i64 seg = u / (B * Hkv), b = (u / Hkv) % B, gh = u % Hkv;
      w.start_item(seg, b, gh, dk_part, dv_part, part_n);
      for (i64 h = gh * hpg; h < (gh + 1) * hpg; ++h)
        for (i64 it = next_tile(-1, seg, nseg, nt); it < nt; it = next_tile(it, seg, nseg, nt)) w.query_tile(h, it);
      if (nseg == 1) w.store_dk_dv();
    }
  }
  if (nseg > 1) sum_segment_partials(g, nseg, dk_part, dv_part, dk, dv, kv_stride);
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(attention_forward_impl);
HWY_EXPORT(attention_backward_impl);

void attention_forward(const AttentionArgs& a, float* o, float* lse) {
  init_simd();
  HWY_DYNAMIC_DISPATCH(attention_forward_impl)(a, o, lse);
}

void attention_backward(const AttentionArgs& a, const float* o, const float* lse, const float* d_o,
                        const AttentionGrads& gr) {
  init_simd();
  HWY_DYNAMIC_DISPATCH(attention_backward_impl)(a, o, lse, d_o, gr);
}

}  // namespace hlm::ops
#endif  // HWY_ONCE
