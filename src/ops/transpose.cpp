// The transposing passes of ops/transpose.h: 16 x 16 tiles, transposed in AVX-512 registers where the CPU has it and
// the dispatched SIMD target is an AVX3 one (so HLM_SIMD=AVX2 or fallback runs the portable tiles below, with the
// same results), scalar tiles elsewhere.
#include "ops/transpose.h"

#include <algorithm>

#include "core/parallel.h"
#include "core/simd_target.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "ops/avx512_masks.h"
#include "ops/transpose16.h"

// GCC 12's AVX-512 unpack/shuffle intrinsics start from _mm512_undefined_ps(): a false -Wmaybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define HLM_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#endif

namespace hlm::ops {
namespace {

constexpr i64 kTile = 16;
// Row blocks handed to one thread: a multiple of 32 rows, so threads write whole 64-byte spans of a bf16 dst row.
constexpr i64 kRowsPerBlock = 64;

bool avx512_tiles() {
#if defined(__x86_64__)
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  if (!cpu) return false;
  init_simd();
  return simd_target().rfind("AVX3", 0) == 0;
#else
  return false;
#endif
}

// fn(r0, r1) over row blocks, in parallel outside a parallel region when there is enough work.
template <typename Fn>
void over_row_blocks(i64 rows, i64 cols, Fn&& fn) {
  const i64 blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  auto run = [&](i64 b0, i64 b1) { fn(b0 * kRowsPerBlock, std::min(rows, b1 * kRowsPerBlock)); };
  if (rows * cols < (1 << 16)) run(0, blocks);
  else parallel_for(blocks, run);
}

void round_transposed_tiles(const float* src, i64 r0, i64 r1, i64 rows, i64 cols, i64 ld, bf16* dst) {
  for (i64 rb = r0; rb < r1; rb += kTile)
    for (i64 cb = 0; cb < cols; cb += kTile) {
      const i64 re = std::min(r1, rb + kTile), ce = std::min(cols, cb + kTile);
      for (i64 c = cb; c < ce; ++c)
        for (i64 r = rb; r < re; ++r) dst[c * rows + r] = to_bf16(src[r * ld + c]);
    }
}

void add_transposed_tiles(const float* src, i64 r0, i64 r1, i64 rows, i64 cols, float* dst) {
  for (i64 rb = r0; rb < r1; rb += kTile)
    for (i64 cb = 0; cb < cols; cb += kTile) {
      const i64 re = std::min(r1, rb + kTile), ce = std::min(cols, cb + kTile);
      for (i64 c = cb; c < ce; ++c)
        for (i64 r = rb; r < re; ++r) dst[c * rows + r] += src[r * cols + c];
    }
}

#if defined(__x86_64__)
// Rows [rb, rb + nr) x columns [cb, cb + nc) of src as 16 registers, transposed: a[i] = column cb + i.
HLM_AVX512_TARGET inline void load_tile_t(const float* src, i64 ld, i64 rb, i64 nr, i64 cb, i64 nc, __m512 a[16]) {
  const __mmask16 cm = first_lanes(nc);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i)
    a[i] = i < nr ? _mm512_maskz_loadu_ps(cm, src + (rb + i) * ld + cb) : _mm512_setzero_ps();
  transpose16(a);
}

// to_bf16 on 16 lanes before the final shift: the bf16 is the upper half of each lane.
HLM_AVX512_TARGET inline __m512i to_bf16_upper(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x00400000));
}

// Strips of 32 rows: rows 2i and 2i + 1 of a 16-column tile round into one register of 32-bit pair words (row 2i in
// the lower half), so one 16 x 16 transpose of pair words moves 32 rows, and each column's 32 bf16 leave in one store.
HLM_AVX512_TARGET void round_transposed_avx512(const float* src, i64 r0, i64 r1, i64 rows, i64 cols, i64 ld,
                                               bf16* dst) {
  for (i64 rb = r0; rb < r1; rb += 2 * kTile) {
    const i64 nr = std::min(2 * kTile, r1 - rb);
    const __mmask32 rm = nr >= 32 ? 0xFFFFFFFFu : (1u << nr) - 1u;
    for (i64 cb = 0; cb < cols; cb += kTile) {
      const i64 nc = std::min(kTile, cols - cb);
      const __mmask16 cm = first_lanes(nc);
      __m512 a[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const i64 r = rb + 2 * i;
        const __m512 lo = r < r1 ? _mm512_maskz_loadu_ps(cm, src + r * ld + cb) : _mm512_setzero_ps();
        const __m512 hi = r + 1 < r1 ? _mm512_maskz_loadu_ps(cm, src + (r + 1) * ld + cb) : _mm512_setzero_ps();
        const __m512i w_lo = _mm512_srli_epi32(to_bf16_upper(lo), 16);
        a[i] = _mm512_castsi512_ps(_mm512_mask_blend_epi16(0xAAAAAAAAu, w_lo, to_bf16_upper(hi)));
      }
      transpose16(a);
      for (i64 i = 0; i < nc; ++i) _mm512_mask_storeu_epi16(dst + (cb + i) * rows + rb, rm, _mm512_castps_si512(a[i]));
    }
  }
}

HLM_AVX512_TARGET void add_transposed_avx512(const float* src, i64 r0, i64 r1, i64 rows, i64 cols, float* dst) {
  for (i64 rb = r0; rb < r1; rb += kTile) {
    const i64 nr = std::min(kTile, r1 - rb);
    const __mmask16 rm = first_lanes(nr);
    for (i64 cb = 0; cb < cols; cb += kTile) {
      const i64 nc = std::min(kTile, cols - cb);
      __m512 a[16];
      load_tile_t(src, cols, rb, nr, cb, nc, a);
      for (i64 i = 0; i < nc; ++i) {
        float* d = dst + (cb + i) * rows + rb;
        _mm512_mask_storeu_ps(d, rm, _mm512_add_ps(_mm512_maskz_loadu_ps(rm, d), a[i]));
      }
    }
  }
}
#endif

}  // namespace

void round_to_bf16_transposed(const float* src, i64 rows, i64 cols, i64 ld_src, bf16* dst) {
  if (rows <= 0 || cols <= 0) return;
  [[maybe_unused]] const bool simd = avx512_tiles();
  over_row_blocks(rows, cols, [&](i64 r0, i64 r1) {
#if defined(__x86_64__)
    if (simd) return round_transposed_avx512(src, r0, r1, rows, cols, ld_src, dst);
#endif
    round_transposed_tiles(src, r0, r1, rows, cols, ld_src, dst);
  });
}

void add_transposed(const float* src, i64 rows, i64 cols, float* dst) {
  if (rows <= 0 || cols <= 0) return;
  [[maybe_unused]] const bool simd = avx512_tiles();
  over_row_blocks(rows, cols, [&](i64 r0, i64 r1) {
#if defined(__x86_64__)
    if (simd) return add_transposed_avx512(src, r0, r1, rows, cols, dst);
#endif
    add_transposed_tiles(src, r0, r1, rows, cols, dst);
  });
}

}  // namespace hlm::ops
