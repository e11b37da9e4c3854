// bf16 pair products on AMX tiles (ops/bf16_pairs.h product()). A tile is 16 rows of 64 bytes: 16 rows x 16 pairs
// of A, 16 pair rows x 16 columns of B (the pair layout of bf16_pairs is the one AMX's B operand wants), 16 x 16
// fp32 of C; one TDPBF16PS adds A B for a whole C tile. The functions carry their own target attribute, like
// bf16_pairs.cpp, and run only where amx_available().
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ops/bf16_pairs.h"
#include "ops/thread_scratch.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ops/avx512_masks.h"
#include "ops/transpose16.h"

// GCC 12's AVX-512 unpack/shuffle intrinsics start from _mm512_undefined_ps(): a false -Wmaybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define HLM_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

namespace hlm::ops::bf16_pairs {
namespace {

std::atomic<bool> g_allowed{[] {
  const char* e = std::getenv("HLM_AMX");
  return !(e && std::strcmp(e, "0") == 0);
}()};

// The tile configuration (palette 1): every tile 16 rows x 64 bytes. C tiles 0-3 (a 32 x 32 block), A 4-5, B 6-7.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
static_assert(sizeof(TileConfig) == 64);

constexpr i64 round16(i64 n) { return (n + 15) / 16 * 16; }

// C (+)= A B on whole tiles: M, N, K2 multiples of 16; A [M, K2] pairs (row stride lda), B [K2, N] pairs (ldb),
// C [M, N] fp32 (ldc). Strides are in elements (4 bytes each).
HLM_AMX_TARGET void tiles(i64 M, i64 N, i64 K2, const Pair* A, i64 lda, const Pair* B, i64 ldb, float* C, i64 ldc,
                          bool acc) {
  const i64 sa = lda * 4, sb = ldb * 4, sc = ldc * 4;
  for (i64 i = 0; i < M; i += 32) {
    const bool m2 = i + 16 < M;
    for (i64 j = 0; j < N; j += 32) {
      const bool n2 = j + 16 < N;
      float* c = C + i * ldc + j;
      if (acc) {
        _tile_loadd(0, c, sc);
        if (n2) _tile_loadd(1, c + 16, sc);
        if (m2) _tile_loadd(2, c + 16 * ldc, sc);
        if (m2 && n2) _tile_loadd(3, c + 16 * ldc + 16, sc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (i64 p = 0; p < K2; p += 16) {
        _tile_loadd(4, A + i * lda + p, sa);
        _tile_loadd(6, B + p * ldb + j, sb);
        _tile_dpbf16ps(0, 4, 6);
        if (n2) {
          _tile_loadd(7, B + p * ldb + j + 16, sb);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (m2) {
          _tile_loadd(5, A + (i + 16) * lda + p, sa);
          _tile_dpbf16ps(2, 5, 6);
          if (n2) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, c, sc);
      if (n2) _tile_stored(1, c + 16, sc);
      if (m2) _tile_stored(2, c + 16 * ldc, sc);
      if (m2 && n2) _tile_stored(3, c + 16 * ldc + 16, sc);
    }
  }
}

// dst[r, p] = src[r * rs + p * ks] for r < M, p < K2, zero up to [Mp, K2p] (row stride K2p).
HLM_AMX_TARGET void pack_rows_padded(const Pair* src, i64 rs, i64 ks, i64 M, i64 K2, i64 Mp, i64 K2p, Pair* dst) {
  if (ks == 1) {
    for (i64 r = 0; r < Mp; ++r)
      for (i64 p = 0; p < K2p; p += 16)
        _mm512_storeu_si512(dst + r * K2p + p,
                            _mm512_maskz_loadu_epi32(first_lanes(r < M ? K2 - p : 0), src + r * rs + p));
    return;
  }
  if (rs == 1) {  // src is [K2, M] with row stride ks: transposed in 16 x 16 blocks
    for (i64 r0 = 0; r0 < Mp; r0 += 16)
      for (i64 p0 = 0; p0 < K2p; p0 += 16) {
        __m512 a[16];
        const __mmask16 m = first_lanes(M - r0);
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i)
          a[i] = p0 + i < K2 ? _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(src + (p0 + i) * ks + r0))
                             : _mm512_setzero_ps();
        transpose16(a);
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (r0 + i) * K2p + p0), a[i]);
      }
    return;
  }
  for (i64 r = 0; r < Mp; ++r)
    for (i64 p = 0; p < K2p; ++p) dst[r * K2p + p] = r < M && p < K2 ? src[r * rs + p * ks] : 0;
}

HLM_AMX_TARGET void amx_product(i64 M, i64 N, i64 K2, const Pair* A, i64 a_rs, i64 a_ks, const Pair* B, i64 ldb,
                                float* C, i64 ldc, bool acc) {
  static const TileConfig config;
  // Set per call: oneDNN's AMX kernels configure (and release) the same tiles between our calls.
  _tile_loadconfig(&config);
  const i64 Mp = round16(M), Np = round16(N), K2p = round16(K2);
  // Operands used in place when they are whole tiles; else copied into zero-padded scratch.
  const Pair* a = A;
  i64 lda = a_rs;
  if (a_ks != 1 || M != Mp || K2 != K2p) {
    Pair* ap = thread_scratch<Pair>(10, Mp * K2p);
    pack_rows_padded(A, a_rs, a_ks, M, K2, Mp, K2p, ap);
    a = ap, lda = K2p;
  }
  const Pair* b = B;
  i64 lb = ldb;
  if (N != Np || K2 != K2p) {
    Pair* bp = thread_scratch<Pair>(11, K2p * Np);
    pack_rows_padded(B, ldb, 1, K2, N, K2p, Np, bp);
    b = bp, lb = Np;
  }
  if (M == Mp && N == Np) {
    tiles(Mp, Np, K2p, a, lda, b, lb, C, ldc, acc);
  } else {
    float* cp = thread_scratch<float>(11, Mp * Np);
    if (acc)
      for (i64 r = 0; r < Mp; ++r)
        for (i64 n = 0; n < Np; n += 16)
          _mm512_storeu_ps(cp + r * Np + n, _mm512_maskz_loadu_ps(first_lanes(r < M ? N - n : 0), C + r * ldc + n));
    tiles(Mp, Np, K2p, a, lda, b, lb, cp, Np, acc);
    for (i64 r = 0; r < M; ++r)
      for (i64 n = 0; n < N; n += 16)
        _mm512_mask_storeu_ps(C + r * ldc + n, first_lanes(N - n), _mm512_loadu_ps(cp + r * Np + n));
  }
  _tile_release();
}

}  // namespace

bool amx_available() {
  static const bool has = [] {
    if (!available()) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    // Linux hands the tile data state to a process only on request (kernel 5.16+, ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA); a refusal (older kernel, or an OS that does not enable it) keeps vdpbf16ps.
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
    return tile && bf16 && syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtileData) == 0;
  }();
  return has;
}

bool amx_active() { return g_allowed.load(std::memory_order_relaxed) && amx_available(); }

bool set_amx_allowed(bool allowed) { return g_allowed.exchange(allowed, std::memory_order_relaxed); }

}  // namespace hlm::ops::bf16_pairs

#define HLM_HAVE_AMX 1

#else  // no AMX outside x86-64 Linux

namespace hlm::ops::bf16_pairs {
bool amx_available() { return false; }
bool amx_active() { return false; }
bool set_amx_allowed(bool) { return true; }
}  // namespace hlm::ops::bf16_pairs

#define HLM_HAVE_AMX 0

#endif

namespace hlm::ops::bf16_pairs {

void product(i64 M, i64 N, i64 K2, const Pair* A, i64 a_rs, i64 a_ks, const Pair* B, i64 ldb, float* C, i64 ldc,
             bool acc) {
  if (M <= 0 || N <= 0) return;
#if HLM_HAVE_AMX
  if (K2 > 0 && amx_active()) {
    amx_product(M, N, K2, A, a_rs, a_ks, B, ldb, C, ldc, acc);
    return;
  }
#endif
  for (i64 r0 = 0; r0 < M; r0 += 4)
    block(static_cast<int>(std::min<i64>(4, M - r0)), N, K2, A + r0 * a_rs, a_rs, a_ks, B, ldb, C + r0 * ldc, ldc,
          acc);
}

}  // namespace hlm::ops::bf16_pairs
