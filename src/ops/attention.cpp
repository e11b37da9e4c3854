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
#include "ops/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12's reduce/roundscale intrinsics start from _mm512_undefined_ps(): a false -Wmaybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

#include "core/error.h"

namespace hlm::ops {
namespace {

constexpr int kTile = 64;      // query and key tile size
constexpr int kRB = 4;         // rows per register block
constexpr i64 kMinItems = 32;  // work items wanted per call (see nseg)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- scratch -------------------------------------------------------------------------------------
// Reused per thread (OpenMP keeps its pool), so steady-state calls allocate and page-fault nothing.
// Slots 0..9: per-worker buffers; 13..15: whole-call buffers owned by the calling thread (which is
// also worker 0 of the parallel regions, hence separate slots).
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
struct Scratch {
  std::unique_ptr<float, FreeDeleter> p;
  size_t n = 0;
};
float* scratch(int slot, size_t n) {
  thread_local Scratch s[16];
  Scratch& b = s[slot];
  if (b.n < n) {
    size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
    b.p.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    HLM_CHECK(b.p != nullptr, "attention: out of memory for {} floats of scratch", n);
    b.n = n;
  }
  return b.p.get();
}

// ---- microkernel: C[mr x 16*nv] (+)= A[mr x K] B[K x 16*nv] --------------------------------------------
// A element (row r, k) is A[r*a_rs + k*a_ks] (so A^T is a_rs = 1); B is row-major with row stride ldb;
// the last 16-wide column vector of B and C is masked by `tail`.
#if defined(__AVX512F__)
template <int MR, int NV>
void mk(i64 K, const float* A, i64 a_rs, i64 a_ks, const float* B, i64 ldb, float* C, i64 ldc, __mmask16 tail,
        bool acc) {
  // Unrolled explicitly: otherwise GCC 12 keeps c[][] on the stack and stores it every k (2.5x slower).
  __m512 c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      c[r][v] = acc ? _mm512_maskz_loadu_ps(v == NV - 1 ? tail : __mmask16(0xFFFF), C + r * ldc + 16 * v)
                    : _mm512_setzero_ps();
  for (i64 k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    const float* a = A + k * a_ks;
    __m512 bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(tail, b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m512 av = _mm512_set1_ps(a[r * a_rs]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(av, bv[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      if (v == NV - 1)
        _mm512_mask_storeu_ps(C + r * ldc + 16 * v, tail, c[r][v]);
      else
        _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
    }
}
#else
template <int MR, int NV>
void mk(i64 K, const float* A, i64 a_rs, i64 a_ks, const float* B, i64 ldb, float* C, i64 ldc, uint32_t tail,
        bool acc) {
  int n_last = 0;
  while (n_last < 16 && (tail >> n_last) & 1u) ++n_last;
  const int N = 16 * (NV - 1) + n_last;
  float c[MR][16 * NV];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < N; ++j) c[r][j] = acc ? C[r * ldc + j] : 0.f;
  for (i64 k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    for (int r = 0; r < MR; ++r) {
      const float a = A[r * a_rs + k * a_ks];
      for (int j = 0; j < N; ++j) c[r][j] += a * b[j];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < N; ++j) C[r * ldc + j] = c[r][j];
}
#endif

using MkFn = void (*)(i64, const float*, i64, i64, const float*, i64, float*, i64,
#if defined(__AVX512F__)
                      __mmask16,
#else
                      uint32_t,
#endif
                      bool);

template <int MR>
constexpr MkFn mk_row[4] = {mk<MR, 1>, mk<MR, 2>, mk<MR, 3>, mk<MR, 4>};
constexpr const MkFn* mk_table[4] = {mk_row<1>, mk_row<2>, mk_row<3>, mk_row<4>};

// Runs the microkernel for mr (1..4) rows and columns [0, N) in chunks of 64 (N >= 1).
inline void block(int mr, i64 N, i64 K, const float* A, i64 a_rs, i64 a_ks, const float* B, i64 ldb, float* C, i64 ldc,
                  bool acc) {
  for (i64 c0 = 0; c0 < N; c0 += 64) {
    const i64 n = std::min<i64>(64, N - c0);
    const int nv = static_cast<int>((n + 15) / 16);
    const int rem = static_cast<int>(n - 16 * (nv - 1));
    const uint32_t tail = rem == 16 ? 0xFFFFu : ((1u << rem) - 1u);
    mk_table[mr - 1][nv - 1](K, A, a_rs, a_ks, B + c0, ldb, C + c0, ldc, static_cast<uint16_t>(tail), acc);
  }
}

// Lanes of the 16-vector v that fall in the inclusive column range [lo, hi].
inline uint32_t range_mask(int lo, int hi, int v) {
  int a = std::max(lo - 16 * v, 0), b = std::min(hi - 16 * v, 15);
  if (a > b) return 0;
  return ((2u << b) - 1u) & ~((1u << a) - 1u);
}

#if defined(__AVX512F__)
// 2^x on the lanes in `valid` (0 elsewhere and where 2^x would be subnormal). Degree-7 Taylor series of
// e^(f ln2) on |f| <= 1/2: relative error < 1e-8, below fp32 rounding.
inline __m512 exp2_masked(__m512 x, __mmask16 valid) {
  const __m512 lo = _mm512_set1_ps(-125.f);
  valid &= _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_mul_ps(_mm512_sub_ps(x, n), _mm512_set1_ps(kLn2));
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(valid, p, n);
}
#endif

// ---- work split -------------------------------------------------------------------------------------
// Query tiles are dealt to nseg segments in zig-zag order (0 1 .. n-1 n-1 .. 1 0 0 1 ..), so with causal
// rows (tile i costs ~ i + 1) every segment gets about the same work.
inline i64 seg_of(i64 it, i64 nseg) {
  const i64 r = it % (2 * nseg);
  return r < nseg ? r : 2 * nseg - 1 - r;
}
// The segment's first query tile after `it` (nt when none).
inline i64 next_tile(i64 it, i64 seg, i64 nseg, i64 nt) {
  for (++it; it < nt; ++it)
    if (seg_of(it, nseg) == seg) return it;
  return nt;
}

// ---- shapes and masks -------------------------------------------------------------------------------
struct Geom {
  // W: effective window (Tk for full causal); nt: query tiles per row. Keys: Tk per row in ntk tiles, and
  // query t sits at key index t + off (off = Tk - T, 0 in training).
  i64 B, T, H, Hkv, hd, hpg, W, nt, Tk, off, ntk;
  float scale;
  bool par;  // worth a parallel region (tiny calls lose more to thread wake-ups than they gain)
};

Geom check_and_geom(const char* op, const AttentionShape& s, i64 q_stride, i64 kv_stride) {
  HLM_CHECK(s.B >= 1 && s.T >= 1 && s.H >= 1 && s.Hkv >= 1 && s.hd >= 1, "{}: bad shape B={} T={} H={} Hkv={} hd={}",
            op, s.B, s.T, s.H, s.Hkv, s.hd);
  HLM_CHECK(s.H % s.Hkv == 0, "{}: H={} is not a multiple of Hkv={} (B={} T={} hd={})", op, s.H, s.Hkv, s.B, s.T, s.hd);
  HLM_CHECK(s.window >= 0, "{}: negative window {} (B={} T={} H={} hd={})", op, s.window, s.B, s.T, s.H, s.hd);
  HLM_CHECK(std::isfinite(s.scale) && s.scale >= 0, "{}: bad scale {} (hd={})", op, s.scale, s.hd);
  HLM_CHECK(s.Tk == 0 || s.Tk >= s.T, "{}: Tk={} keys for T={} queries (need Tk >= T or Tk = 0; B={} H={} hd={})", op,
            s.Tk, s.T, s.B, s.H, s.hd);
  HLM_CHECK(q_stride >= s.H * s.hd, "{}: q_stride {} < H*hd = {}*{} (B={} T={})", op, q_stride, s.H, s.hd, s.B, s.T);
  HLM_CHECK(kv_stride >= s.Hkv * s.hd, "{}: kv_stride {} < Hkv*hd = {}*{} (B={} T={})", op, kv_stride, s.Hkv, s.hd, s.B,
            s.T);
  Geom g;
  g.B = s.B, g.T = s.T, g.H = s.H, g.Hkv = s.Hkv, g.hd = s.hd, g.hpg = s.H / s.Hkv;
  g.Tk = s.Tk > 0 ? s.Tk : s.T;
  g.off = g.Tk - s.T;
  g.W = (s.window == 0 || s.window >= g.Tk) ? g.Tk : s.window;
  g.nt = (s.T + kTile - 1) / kTile;
  g.ntk = (g.Tk + kTile - 1) / kTile;
  g.par = static_cast<double>(s.B * s.H * s.hd) * static_cast<double>(s.T) * static_cast<double>(g.W) >
          static_cast<double>(1 << 22);
  g.scale = s.scale != 0.f ? s.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.hd)));
  return g;
}

// lo[b*T + t] = first key index query t sees: max(doc start, t + off - W + 1). Documents must be contiguous
// runs (each doc_start is either the previous one or t itself), which makes lo non-decreasing in t.
const int32_t* first_keys(const char* op, const Geom& g, const int32_t* doc_start) {
  HLM_CHECK(g.Tk < (i64{1} << 30), "{}: T={} Tk={} too long", op, g.T, g.Tk);
  HLM_CHECK(!doc_start || g.off == 0, "{}: doc_start needs Tk == T (got T={} Tk={})", op, g.T, g.Tk);
  auto* lo = reinterpret_cast<int32_t*>(scratch(15, static_cast<size_t>(g.B * g.T)));
  for (i64 b = 0; b < g.B; ++b)
    for (i64 t = 0; t < g.T; ++t) {
      i64 l = std::max<i64>(0, t + g.off - g.W + 1);
      if (doc_start) {
        const i64 d = doc_start[b * g.T + t];
        const i64 prev = t > 0 ? doc_start[b * g.T + t - 1] : 0;
        HLM_CHECK(d == t || (t > 0 && d == prev),
                  "{}: doc_start[{}*T+{}] = {} is neither {} (same document) nor {} (new document); B={} T={}", op, b,
                  t, d, prev, t, g.B, g.T);
        l = std::max(l, d);
      }
      lo[b * g.T + t] = static_cast<int32_t>(l);
    }
  return lo;
}

// Visibility inside one (query tile, key tile) pair, all indices relative to the tiles and inclusive
// (a range is empty when its first index is past its last). Because lo is non-decreasing, the queries
// that see a key form one contiguous run too.
struct TileMask {
  int cl[kTile], ch[kTile];  // query r sees keys cl[r] .. ch[r]
  int ql[kTile], qh[kTile];  // key c is seen by queries ql[c] .. qh[c]
  // per 4-query block: 16-key vectors [v0, v1) and exact key range [kb, ke) its queries see;
  // per 4-key block: 16-query vectors [w0, w1) that see any of its keys (v0 == v1 etc.: nothing)
  int v0[kTile / kRB], v1[kTile / kRB], kb[kTile / kRB], ke[kTile / kRB];
  int w0[kTile / kRB], w1[kTile / kRB];
  // i0: key index of the tile's first query (its diagonal), k0: the key tile's first key index.
  void build(const int32_t* lo_row, i64 i0, int nq, i64 k0, int nk) {
    for (int r = 0; r < nq; ++r) {
      cl[r] = static_cast<int>(std::max<i64>(lo_row[r] - k0, 0));
      ch[r] = static_cast<int>(std::min<i64>(i0 + r - k0, nk - 1));
    }
    for (int rb = 0; rb * kRB < nq; ++rb) {
      int a = kTile, b = -1;
      for (int r = rb * kRB; r < std::min(nq, rb * kRB + kRB); ++r)
        if (cl[r] <= ch[r]) a = std::min(a, cl[r]), b = std::max(b, ch[r]);
      v0[rb] = b < 0 ? 0 : a / 16;
      v1[rb] = b < 0 ? 0 : b / 16 + 1;
      kb[rb] = b < 0 ? 0 : a;
      ke[rb] = b < 0 ? 0 : b + 1;
    }
    int r = 0;
    for (int c = 0; c < nk; ++c) {
      while (r < nq && lo_row[r] <= k0 + c) ++r;
      qh[c] = r - 1;
      ql[c] = static_cast<int>(std::max<i64>(k0 + c - i0, 0));
    }
    for (int cb = 0; cb * kRB < nk; ++cb) {
      int a = kTile, b = -1;
      for (int c = cb * kRB; c < std::min(nk, cb * kRB + kRB); ++c)
        if (ql[c] <= qh[c]) a = std::min(a, ql[c]), b = std::max(b, qh[c]);
      w0[cb] = b < 0 ? 0 : a / 16;
      w1[cb] = b < 0 ? 0 : b / 16 + 1;
    }
  }
};

// Rows the next tiles will need (strided 3 KB apart at the bench config, too far apart for the hardware
// prefetchers), requested a few cache lines at a time between microkernel calls: issued all at once the
// prefetches stall on the full miss queues instead of overlapping with the arithmetic.
class Prefetcher {
 public:
  void clear() { n_ = cur_ = 0, row_ = off_ = 0; }
  void add(const float* p, i64 stride, i64 rows, i64 hd, bool for_write) {
    if (rows > 0 && n_ < 8) r_[n_++] = {reinterpret_cast<const char*>(p), stride * 4, rows, hd * 4, for_write};
  }
  void step(int lines) {
    for (; lines > 0 && cur_ < n_; --lines) {
      const Range& r = r_[cur_];
      const char* a = r.p + row_ * r.stride + off_;
      if (r.write)
        __builtin_prefetch(a, 1, 2);
      else
        __builtin_prefetch(a, 0, 2);
      if ((off_ += 64) >= r.row_bytes) {
        off_ = 0;
        if (++row_ == r.rows) row_ = 0, ++cur_;
      }
    }
  }
  void flush() { step(1 << 30); }

 private:
  struct Range {
    const char* p;
    i64 stride, rows, row_bytes;
    bool write;
  };
  Range r_[8];
  int n_ = 0, cur_ = 0;
  i64 row_ = 0, off_ = 0;
};

// Dot product with 16 partial sums (fixed order, so still deterministic).
inline float dot(const float* a, const float* b, i64 n) {
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (i64 d = 0; d < n; d += 16) {
    const __mmask16 m = static_cast<__mmask16>(n - d >= 16 ? 0xFFFFu : (1u << (n - d)) - 1u);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), _mm512_maskz_loadu_ps(m, b + d), acc);
  }
  return _mm512_reduce_add_ps(acc);
#else
  float acc = 0.f;
  for (i64 d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
#endif
}

// Rows of one head copied to a contiguous [n, hd] block.
void pack_rows(const float* src, i64 stride, int n, i64 hd, float* dst) {
  for (int r = 0; r < n; ++r) std::memcpy(dst + r * hd, src + r * stride, hd * sizeof(float));
}

#if defined(__AVX512F__)
// In-register transpose of a 16 x 16 block (a[i] = row i on entry, column i on exit).
inline void transpose16(__m512 a[16]) {
  __m512 b[16], c[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    b[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
    b[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    c[4 * i] = _mm512_shuffle_ps(b[4 * i], b[4 * i + 2], 0x44);
    c[4 * i + 1] = _mm512_shuffle_ps(b[4 * i], b[4 * i + 2], 0xEE);
    c[4 * i + 2] = _mm512_shuffle_ps(b[4 * i + 1], b[4 * i + 3], 0x44);
    c[4 * i + 3] = _mm512_shuffle_ps(b[4 * i + 1], b[4 * i + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512 e = _mm512_shuffle_f32x4(c[j], c[4 + j], 0x44), f = _mm512_shuffle_f32x4(c[j], c[4 + j], 0xEE);
    const __m512 g = _mm512_shuffle_f32x4(c[8 + j], c[12 + j], 0x44);
    const __m512 h = _mm512_shuffle_f32x4(c[8 + j], c[12 + j], 0xEE);
    a[j] = _mm512_shuffle_f32x4(e, g, 0x88);
    a[4 + j] = _mm512_shuffle_f32x4(e, g, 0xDD);
    a[8 + j] = _mm512_shuffle_f32x4(f, h, 0x88);
    a[12 + j] = _mm512_shuffle_f32x4(f, h, 0xDD);
  }
}
#endif

// Transpose of n (<= 64) rows of one head, times mul: dst [hd][64], zero padded beyond n.
void pack_t(const float* src, i64 stride, int n, i64 hd, float mul, float* dst) {
#if defined(__AVX512F__)
  const __m512 vm = _mm512_set1_ps(mul);
  for (int r0 = 0; r0 < kTile; r0 += 16)
    for (i64 d0 = 0; d0 < hd; d0 += 16) {
      const int nd = static_cast<int>(std::min<i64>(16, hd - d0));
      const __mmask16 dm = static_cast<__mmask16>(nd == 16 ? 0xFFFFu : (1u << nd) - 1u);
      __m512 a[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        a[i] = r0 + i < n ? _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, src + (r0 + i) * stride + d0), vm)
                          : _mm512_setzero_ps();
      transpose16(a);
      for (int i = 0; i < nd; ++i) _mm512_storeu_ps(dst + (d0 + i) * kTile + r0, a[i]);
    }
#else
  for (i64 d = 0; d < hd; ++d)
    for (int c = 0; c < kTile; ++c) dst[d * kTile + c] = c < n ? src[c * stride + d] * mul : 0.f;
#endif
}

}  // namespace

// ---- forward ------------------------------------------------------------------------------------------
void attention_forward(const AttentionShape& s, const float* q, i64 q_stride, const float* k, const float* v,
                       i64 kv_stride, float* o, float* lse, const int32_t* doc_start) {
  const Geom g = check_and_geom("attention_forward", s, q_stride, kv_stride);
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
#pragma omp parallel if (g.par)
  {
    const size_t row_n = static_cast<size_t>(ntk * kTile * hd);
    float* k_all = scratch(3, row_n);                           // K rows [Tk, hd]
    float* v_all = scratch(4, row_n);                           // V rows [Tk, hd]
    float* st = scratch(0, kTile * kTile);                      // S^T then P^T  [64 keys, 64 queries]
    float* oacc = scratch(1, static_cast<size_t>(kTile * hd));  // O              [64 queries, hd]
    float* qt = scratch(2, static_cast<size_t>(kTile * hd));    // Q^T * scale * log2(e)  [hd, 64]
    std::vector<char> packed(static_cast<size_t>(ntk));
    alignas(64) float m[kTile], l[kTile], alpha[kTile];  // running max (log2 domain), sum, rescale
    TileMask tm;
    Prefetcher pf;
#pragma omp for schedule(static, 1)
    for (i64 u = 0; u < n_units; ++u) {
      const i64 seg = u / (B * Hkv), b = (u / Hkv) % B, gh = u % Hkv;
      std::fill(packed.begin(), packed.end(), 0);
      for (i64 h = gh * g.hpg; h < (gh + 1) * g.hpg; ++h) {
        for (i64 it = next_tile(-1, seg, nseg, nt); it < nt; it = next_tile(it, seg, nseg, nt)) {
          const i64 i0 = it * kTile;
          const int nq = static_cast<int>(std::min<i64>(kTile, T - i0)), nqv = (nq + 15) / 16;
          const int32_t* lo_row = lo + b * T + i0;
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
            float* kbuf = k_all + k0 * hd;  // [nk, hd]
            float* vbuf = v_all + k0 * hd;
            if (!packed[j]) {
              pack_rows(k + (b * Tk + k0) * kv_stride + gh * hd, kv_stride, nk, hd, kbuf);
              pack_rows(v + (b * Tk + k0) * kv_stride + gh * hd, kv_stride, nk, hd, vbuf);
              packed[j] = 1;
            }
            // S^T[c0:c0+mc, visible query vectors] = K Q^T
            for (int cb = 0; cb * kRB < nk; ++cb) {
              const int c0 = cb * kRB, mc = std::min(kRB, nk - c0), w0 = tm.w0[cb], w1 = tm.w1[cb];
              if (w0 == w1) continue;
              pf.step(12);
              mk_table[mc - 1][w1 - w0 - 1](hd, kbuf + c0 * hd, hd, 1, qt + 16 * w0, kTile, st + c0 * kTile + 16 * w0,
                                            kTile, 0xFFFF, false);
            }
            // Online softmax for 16 queries at a time over the keys any of them sees ([ca, cz]).
            for (int qv = 0; qv < nqv; ++qv) {
              int ca = kTile, cz = -1;
              for (int r = 16 * qv; r < std::min(nq, 16 * qv + 16); ++r)
                if (tm.cl[r] <= tm.ch[r]) ca = std::min(ca, tm.cl[r]), cz = std::max(cz, tm.ch[r]);
              if (cz < 0) {
                std::fill(alpha + 16 * qv, alpha + 16 * qv + 16, 1.f);
                continue;
              }
#if defined(__AVX512F__)
              const __m512 ninf = _mm512_set1_ps(kNegInf);
              __m512 vmax = ninf;
              for (int c = ca; c <= cz; ++c) {
                const __mmask16 mv = static_cast<__mmask16>(range_mask(tm.ql[c], tm.qh[c], qv));
                vmax = _mm512_max_ps(vmax, _mm512_mask_mov_ps(ninf, mv, _mm512_loadu_ps(st + c * kTile + 16 * qv)));
              }
              const __m512 m_old = _mm512_load_ps(m + 16 * qv), m_new = _mm512_max_ps(m_old, vmax);
              // Lanes that had no key yet get alpha = 0 (their O and l are still zero).
              const __m512 a = exp2_masked(_mm512_sub_ps(m_old, m_new), _mm512_cmp_ps_mask(m_old, ninf, _CMP_NEQ_OQ));
              __m512 vsum = _mm512_setzero_ps();
              for (int c = ca; c <= cz; ++c) {
                const __mmask16 mv = static_cast<__mmask16>(range_mask(tm.ql[c], tm.qh[c], qv));
                const __m512 p = exp2_masked(_mm512_sub_ps(_mm512_loadu_ps(st + c * kTile + 16 * qv), m_new), mv);
                vsum = _mm512_add_ps(vsum, p);
                _mm512_storeu_ps(st + c * kTile + 16 * qv, p);
              }
              _mm512_store_ps(l + 16 * qv, _mm512_fmadd_ps(_mm512_load_ps(l + 16 * qv), a, vsum));
              _mm512_store_ps(m + 16 * qv, m_new);
              _mm512_store_ps(alpha + 16 * qv, a);
#else
              for (int r = 16 * qv; r < 16 * qv + 16; ++r) {
                const bool any = r < nq && tm.cl[r] <= tm.ch[r];
                float mt = kNegInf;
                if (any)
                  for (int c = tm.cl[r]; c <= tm.ch[r]; ++c) mt = std::max(mt, st[c * kTile + r]);
                const float m_new = std::max(m[r], mt);
                float psum = 0.f;
                for (int c = ca; c <= cz; ++c) {
                  const bool in = any && c >= tm.cl[r] && c <= tm.ch[r];
                  const float p = in ? std::exp2(st[c * kTile + r] - m_new) : 0.f;
                  st[c * kTile + r] = p;
                  psum += p;
                }
                alpha[r] = !any ? 1.f : m[r] == kNegInf ? 0.f : std::exp2(m[r] - m_new);
                l[r] = l[r] * alpha[r] + psum;
                m[r] = m_new;
              }
#endif
            }
            // O = alpha * O + P V, per block of 4 queries over the keys they see.
            for (int r = 0; r < nq; ++r)
              if (alpha[r] != 1.f)
                for (i64 d = 0; d < hd; ++d) oacc[r * hd + d] *= alpha[r];
            for (int qb = 0; qb * kRB < nq; ++qb) {
              const int r0 = qb * kRB, mr = std::min(kRB, nq - r0), kb = tm.kb[qb], ke = tm.ke[qb];
              if (kb == ke) continue;
              pf.step(12);
              block(mr, hd, ke - kb, st + kb * kTile + r0, 1, kTile, vbuf + kb * hd, hd, oacc + r0 * hd, hd, true);
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
void attention_backward(const AttentionShape& s, const float* q, i64 q_stride, const float* k, const float* v,
                        i64 kv_stride, const float* o, const float* lse, const float* dout, float* dq, float* dk,
                        float* dv, const int32_t* doc_start) {
  const Geom g = check_and_geom("attention_backward", s, q_stride, kv_stride);
  HLM_CHECK(g.off == 0, "attention_backward: needs Tk == T (got T={} Tk={}; the key offset is forward only)", g.T,
            g.Tk);
  HLM_CHECK(q && k && v && o && lse && dout && dq && dk && dv,
            "attention_backward: null pointer (B={} T={} H={} hd={})", g.B, g.T, g.H, g.hd);
  const i64 B = g.B, T = g.T, H = g.H, Hkv = g.Hkv, hd = g.hd, nt = g.nt, hpg = g.hpg;
  const i64 o_stride = H * hd;  // o, dout: [B, T, H, hd]
  const int32_t* lo = first_keys("attention_backward", g, doc_start);
  const float c2 = g.scale * kLog2e, scale = g.scale;

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
    const size_t row_n = static_cast<size_t>(nt * kTile * hd);
    float* kt_all = scratch(0, row_n);                           // K^T per key tile [nt][hd][64]
    float* vt_all = scratch(1, row_n);                           // V^T per key tile [nt][hd][64]
    float* k_all = scratch(2, row_n);                            // K rows [T, hd]
    float* dk_own = nseg > 1 ? nullptr : scratch(3, row_n);      // dK accumulator [T, hd] (nseg == 1)
    float* dv_own = nseg > 1 ? nullptr : scratch(4, row_n);      // dV accumulator [T, hd]
    float* qbuf = scratch(5, static_cast<size_t>(kTile * hd));   // Q tile  [64, hd]
    float* dobuf = scratch(6, static_cast<size_t>(kTile * hd));  // dO tile [64, hd]
    float* dqacc = scratch(7, static_cast<size_t>(kTile * hd));  // dQ tile [64, hd]
    float* pbuf = scratch(8, kTile * kTile);                     // S then P          [64 q, 64 k]
    float* dsbuf = scratch(9, kTile * kTile);                    // dP then dS*scale  [64 q, 64 k]
    std::vector<char> packed(static_cast<size_t>(nt));
    TileMask tm;
    Prefetcher pf;
    float lse2[kTile], Drow[kTile];
#pragma omp for schedule(static, 1)
    for (i64 u = 0; u < n_units; ++u) {
      const i64 seg = u / (B * Hkv), b = (u / Hkv) % B, gh = u % Hkv;
      float* dkacc = nseg > 1 ? dk_part + seg * part_n + (b * Hkv + gh) * T * hd : dk_own;
      float* dvacc = nseg > 1 ? dv_part + seg * part_n + (b * Hkv + gh) * T * hd : dv_own;
      std::fill(dkacc, dkacc + T * hd, 0.f);
      std::fill(dvacc, dvacc + T * hd, 0.f);
      std::fill(packed.begin(), packed.end(), 0);
      for (i64 h = gh * hpg; h < (gh + 1) * hpg; ++h) {
        for (i64 it = next_tile(-1, seg, nseg, nt); it < nt; it = next_tile(it, seg, nseg, nt)) {
          const i64 i0 = it * kTile;
          const int nq = static_cast<int>(std::min<i64>(kTile, T - i0));
          const int32_t* lo_row = lo + b * T + i0;
          // Q and dO rows of this tile, D = rowsum(dO * O), lse in the log2 domain.
          pack_rows(q + (b * T + i0) * q_stride + h * hd, q_stride, nq, hd, qbuf);
          pack_rows(dout + (b * T + i0) * o_stride + h * hd, o_stride, nq, hd, dobuf);
          for (int r = 0; r < nq; ++r) {
            Drow[r] = dot(o + (b * T + i0 + r) * o_stride + h * hd, dobuf + r * hd, hd);
            lse2[r] = lse[(b * H + h) * T + i0 + r] * kLog2e;
          }
          std::fill(dqacc, dqacc + nq * hd, 0.f);
          const i64 j_first = lo_row[0] / kTile, j_last = (i0 + nq - 1) / kTile;
          // This tile's dQ rows, the next query tile of this item and the next key tile not yet copied.
          pf.flush();
          pf.clear();
          pf.add(dq + (b * T + i0) * q_stride + h * hd, q_stride, nq, hd, true);
          const i64 it1 = next_tile(it, seg, nseg, nt);
          const i64 h1 = it1 < nt ? h : h + 1, i1 = (it1 < nt ? it1 : next_tile(-1, seg, nseg, nt)) * kTile;
          if (h1 < (gh + 1) * hpg) {
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
          for (i64 j = j_first; j <= j_last; ++j) {
            const i64 k0 = j * kTile;
            const int nk = static_cast<int>(std::min<i64>(kTile, T - k0));
            float* ktp = kt_all + j * hd * kTile;
            float* vtp = vt_all + j * hd * kTile;
            float* kp = k_all + k0 * hd;
            if (!packed[j]) {  // each key tile is packed once per item, on first use
              const i64 src = (b * T + k0) * kv_stride + gh * hd;
              pack_t(k + src, kv_stride, nk, hd, 1.f, ktp);
              pack_t(v + src, kv_stride, nk, hd, 1.f, vtp);
              pack_rows(k + src, kv_stride, nk, hd, kp);
              packed[j] = 1;
            }
            tm.build(lo_row, i0, nq, k0, nk);
            for (int rb = 0; rb * kRB < nq; ++rb) {
              const int r0 = rb * kRB, mr = std::min(kRB, nq - r0);
              const int v0 = tm.v0[rb], v1 = tm.v1[rb];
              float* prow0 = pbuf + r0 * kTile;
              float* dsrow0 = dsbuf + r0 * kTile;
              if (v0 == v1) {
                std::fill(prow0, prow0 + mr * kTile, 0.f);
                std::fill(dsrow0, dsrow0 + mr * kTile, 0.f);
                continue;
              }
              // S = Q K^T and dP = dO V^T on the visible vectors of this row block.
              pf.step(8);
              mk_table[mr - 1][v1 - v0 - 1](hd, qbuf + r0 * hd, hd, 1, ktp + 16 * v0, kTile, prow0 + 16 * v0, kTile,
                                            0xFFFF, false);
              mk_table[mr - 1][v1 - v0 - 1](hd, dobuf + r0 * hd, hd, 1, vtp + 16 * v0, kTile, dsrow0 + 16 * v0, kTile,
                                            0xFFFF, false);
              // P = 2^(S c2 - lse2), dS = P (dP - D) scale; zero outside the visible range (the transposed
              // products below read whole columns).
              for (int r = r0; r < r0 + mr; ++r) {
                float* prow = pbuf + r * kTile;
                float* dsrow = dsbuf + r * kTile;
                const int cl = tm.cl[r], ch = tm.ch[r];
#if defined(__AVX512F__)
                const __m512 vc2 = _mm512_set1_ps(c2), vl = _mm512_set1_ps(lse2[r]);
                const __m512 vD = _mm512_set1_ps(Drow[r]), vs = _mm512_set1_ps(scale);
                for (int vv = 0; vv < kTile / 16; ++vv) {
                  if (vv < v0 || vv >= v1) {
                    _mm512_storeu_ps(prow + 16 * vv, _mm512_setzero_ps());
                    _mm512_storeu_ps(dsrow + 16 * vv, _mm512_setzero_ps());
                    continue;
                  }
                  const __mmask16 mv = static_cast<__mmask16>(range_mask(cl, ch, vv));
                  const __m512 p = exp2_masked(_mm512_fmsub_ps(_mm512_loadu_ps(prow + 16 * vv), vc2, vl), mv);
                  const __m512 dp = _mm512_sub_ps(_mm512_loadu_ps(dsrow + 16 * vv), vD);
                  _mm512_storeu_ps(prow + 16 * vv, p);
                  _mm512_storeu_ps(dsrow + 16 * vv, _mm512_mul_ps(_mm512_mul_ps(p, dp), vs));
                }
#else
                for (int c = 0; c < kTile; ++c) {
                  const bool in = c >= 16 * v0 && c < 16 * v1 && c >= cl && c <= ch;
                  const float p = in ? std::exp2(prow[c] * c2 - lse2[r]) : 0.f;
                  dsrow[c] = in ? p * (dsrow[c] - Drow[r]) * scale : 0.f;
                  prow[c] = p;
                }
#endif
              }
              // dQ[r0:r0+mr] += dS K over the keys these rows see (dS already carries the scale).
              const int kb = tm.kb[rb], ke = tm.ke[rb];
              block(mr, hd, ke - kb, dsrow0 + kb, kTile, 1, kp + kb * hd, hd, dqacc + r0 * hd, hd, true);
            }
            // dV += P^T dO and dK += dS^T Q, per block of 4 keys over the query rows that see them.
            for (int cb = 0; cb * kRB < nk; ++cb) {
              const int c0 = cb * kRB, mc = std::min(kRB, nk - c0);
              int ra = nq, rz = -1;
              for (int c = c0; c < c0 + mc; ++c)
                if (tm.ql[c] <= tm.qh[c]) ra = std::min(ra, tm.ql[c]), rz = std::max(rz, tm.qh[c]);
              if (rz < 0) continue;
              const i64 nr = rz - ra + 1;
              pf.step(8);
              block(mc, hd, nr, pbuf + ra * kTile + c0, 1, kTile, dobuf + ra * hd, hd, dvacc + (k0 + c0) * hd, hd,
                    true);
              block(mc, hd, nr, dsbuf + ra * kTile + c0, 1, kTile, qbuf + ra * hd, hd, dkacc + (k0 + c0) * hd, hd,
                    true);
            }
          }
          for (int r = 0; r < nq; ++r)
            std::memcpy(dq + (b * T + i0 + r) * q_stride + h * hd, dqacc + r * hd, hd * sizeof(float));
        }
      }
      if (nseg == 1)
        for (i64 t = 0; t < T; ++t) {
          if (t + 8 < T) {
            __builtin_prefetch(dk + (b * T + t + 8) * kv_stride + gh * hd, 1, 2);
            __builtin_prefetch(dv + (b * T + t + 8) * kv_stride + gh * hd, 1, 2);
          }
          std::memcpy(dk + (b * T + t) * kv_stride + gh * hd, dkacc + t * hd, hd * sizeof(float));
          std::memcpy(dv + (b * T + t) * kv_stride + gh * hd, dvacc + t * hd, hd * sizeof(float));
        }
    }
  }

  if (nseg > 1) {
#pragma omp parallel for schedule(static) if (g.par)
    for (i64 bt = 0; bt < B * T; ++bt) {
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
}

}  // namespace hlm::ops
