#pragma once
// Target-independent parts of the attention kernels (ops/attention.cpp): tile constants, per-thread scratch,
// the work split over query tiles, shape checks, per-tile visibility masks and the software prefetcher.
// Only ops/attention.cpp includes this; the SIMD code lives there, compiled once per target.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/doc_start.h"
#include "ops/kernel_args.h"
#include "ops/thread_scratch.h"

namespace hlm::ops::attn {

constexpr int kTile = 64;      // query and key tile size
constexpr int kRB = 4;         // rows per register block
constexpr i64 kMinItems = 32;  // work items wanted per call (see nseg)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- scratch -------------------------------------------------------------------------------------
// Per-thread buffers (ops/thread_scratch.h). Slots 0..9: per-worker buffers; 13..15: whole-call buffers owned by
// the calling thread (which is also worker 0 of the parallel regions, hence separate slots).
inline float* scratch(int slot, size_t n) { return thread_scratch<float>(slot, static_cast<i64>(n)); }

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
struct Geo {
  // W: effective window (Tk for full causal); nt: query tiles per row. Keys: Tk per row in ntk tiles, and
  // query t sits at key index t + off (off = Tk - T, 0 in training).
  i64 B, T, H, Hkv, hd, hpg, W, nt, Tk, off, ntk;
  i64 q_stride, kv_stride;  // resolved (0 in the arguments = dense)
  float scale;
  bool par;  // worth a parallel region (tiny calls lose more to thread wake-ups than they gain)
};

inline Geo resolve(const AttentionArgs& s, const char* op) {
  HLM_CHECK(s.B >= 1 && s.T >= 1 && s.H >= 1 && s.Hkv >= 1 && s.hd >= 1, "{}: bad shape B={} T={} H={} Hkv={} hd={}",
            op, s.B, s.T, s.H, s.Hkv, s.hd);
  HLM_CHECK(s.H % s.Hkv == 0, "{}: H={} is not a multiple of Hkv={} (B={} T={} hd={})", op, s.H, s.Hkv, s.B, s.T, s.hd);
  HLM_CHECK(s.window >= 0, "{}: negative window {} (B={} T={} H={} hd={})", op, s.window, s.B, s.T, s.H, s.hd);
  HLM_CHECK(std::isfinite(s.scale) && s.scale >= 0, "{}: bad scale {} (hd={})", op, s.scale, s.hd);
  HLM_CHECK(s.Tk == 0 || s.Tk >= s.T, "{}: Tk={} keys for T={} queries (need Tk >= T or Tk = 0; B={} H={} hd={})", op,
            s.Tk, s.T, s.B, s.H, s.hd);
  Geo g;
  g.q_stride = stride_or(s.q_stride, s.H * s.hd);
  g.kv_stride = stride_or(s.kv_stride, s.Hkv * s.hd);
  auto shape = [&] { return fmt::format("B={} T={} H={} Hkv={} hd={}", s.B, s.T, s.H, s.Hkv, s.hd); };
  check_row_layout(op, "q", g.q_stride, s.hd, s.H, s.hd, shape);
  check_row_layout(op, "kv", g.kv_stride, s.hd, s.Hkv, s.hd, shape);
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
inline const int32_t* first_keys(const char* op, const Geo& g, const int32_t* doc_start) {
  HLM_CHECK(g.Tk < (i64{1} << 30), "{}: T={} Tk={} too long", op, g.T, g.Tk);
  HLM_CHECK(!doc_start || g.off == 0, "{}: doc_start needs Tk == T (got T={} Tk={})", op, g.T, g.Tk);
  check_doc_start(op, doc_start, g.B, g.T);
  auto* lo = reinterpret_cast<int32_t*>(scratch(15, static_cast<size_t>(g.B * g.T)));
  for (i64 b = 0; b < g.B; ++b)
    for (i64 t = 0; t < g.T; ++t) {
      i64 l = std::max<i64>(0, t + g.off - g.W + 1);
      if (doc_start) l = std::max<i64>(l, doc_start[b * g.T + t]);
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
  bool all_see_all;  // whole tiles, every query sees every key (below the diagonal, inside the window): no masks
  // i0: key index of the tile's first query (its diagonal), k0: the key tile's first key index.
  void build(const int32_t* lo_row, i64 i0, int nq, i64 k0, int nk) {
    all_see_all = nq == kTile && nk == kTile;
    for (int r = 0; r < nq; ++r) {
      cl[r] = static_cast<int>(std::max<i64>(lo_row[r] - k0, 0));
      ch[r] = static_cast<int>(std::min<i64>(i0 + r - k0, nk - 1));
      all_see_all = all_see_all && cl[r] == 0 && ch[r] == nk - 1;
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

// Rows of one head copied to a contiguous [n, hd] block.
inline void pack_rows(const float* src, i64 stride, int n, i64 hd, float* dst) {
  for (int r = 0; r < n; ++r) std::memcpy(dst + r * hd, src + r * stride, hd * sizeof(float));
}

}  // namespace hlm::ops::attn
