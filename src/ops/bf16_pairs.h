#pragma once
// bf16 products of the hand-written kernels under `--precision bf16`: the attention kernels' (ops/attention.cpp)
// and the scans' small chunk products (ops/kernel_blas.h). Both operands are rounded to bfloat16 (round to nearest
// even) and packed in pairs along the summed dimension, so one AVX512_BF16 instruction (vdpbf16ps) multiplies two
// bf16 pairs per fp32 lane and accumulates in fp32: twice the products of an fp32 FMA. x86-64 CPUs with
// AVX512_BF16 only (Zen 4, Cooper Lake, Sapphire Rapids and later); elsewhere available() is false and the kernels
// keep their fp32 products. The functions carry their own target attribute, so the file compiles in any build and
// nothing here runs unless available(). docs/precision.md has the error analysis.
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops::bf16_pairs {

// Two bf16 in one 32-bit word: the element of the lower index in the low 16 bits.
using Pair = uint32_t;

// Whether this CPU runs the functions below (x86-64 with AVX512_BF16).
bool available();

// Whether the kernels use them now: precision() is bf16 and available().
bool active();

// Whether this CPU multiplies bf16 tiles (AMX-BF16: Intel Sapphire Rapids and later Xeons) and the OS grants the tile
// state to this process. There vdpbf16ps runs at half the rate of an fp32 FMA (so block() is slower than the fp32
// kernels) while tile products are several times faster (the bf16 attention backward 3.3x at the bench config):
// the kernels hand whole tiles to product() instead of 4-row blocks.
bool amx_available();

// Whether product() uses the tiles: amx_available() and not turned off (HLM_AMX=0 in the environment, or
// set_amx_allowed(false): comparisons, and tests of both paths on one machine).
bool amx_active();
// Returns the previous setting.
bool set_amx_allowed(bool allowed);

// C[M x N] (+)= A B, the layouts of block() but any M: on AMX tiles when amx_active() (operands that are not whole
// 16 x 16-pair tiles are copied into zero-padded per-thread scratch first), else block() on 4 rows at a time.
void product(i64 M, i64 N, i64 K2, const Pair* A, i64 a_rs, i64 a_ks, const Pair* B, i64 ldb, float* C, i64 ldc,
             bool acc);

// C[mr x N] (+)= A B with fp32 accumulation over K2 pairs: A's pair (row r, pair p) is A[r*a_rs + p*a_ks], B's pair
// (pair p, column n) is B[p*ldb + n]. mr in 1..4; acc: add to C instead of overwriting it.
void block(int mr, i64 N, i64 K2, const Pair* A, i64 a_rs, i64 a_ks, const Pair* B, i64 ldb, float* C, i64 ldc,
           bool acc);

// Rows rounded to bf16, which pairs them along the row: dst[r*ldd + p] = (src[r][2p], src[r][2p+1]) * mul for rows
// r < n and pairs p < (cols + 1) / 2 (an odd cols' last pair has a zero high half).
void round_rows(const float* src, i64 stride, int n, i64 cols, float mul, Pair* dst, i64 ldd);

// The transpose of round_rows: dst[p*ldd + r] = (src[r][2p], src[r][2p+1]) * mul for pairs p < (cols + 1) / 2 and
// rows r < n_out, zero for rows n <= r < n_out.
void round_rows_t(const float* src, i64 stride, int n, i64 cols, float mul, Pair* dst, i64 ldd, int n_out);

// Pairs of rows: dst[p*ldd + c] = (src[2p][c], src[2p+1][c]) * mul for pairs p in [p0, p1) and columns c < cols;
// rows outside [r_lo, r_hi] read as zero (the padding of an odd row count, or rows a caller never wrote).
void pair_rows(const float* src, i64 stride, int r_lo, int r_hi, int p0, int p1, i64 cols, Pair* dst, i64 ldd,
               float mul = 1.f);

// Row-major C[M,N] = alpha op(A) op(B) + beta C (the layouts of ops::matmul) with both operands rounded to bf16
// and paired here (per-thread scratch), fp32 accumulation. For small products inside a kernel's parallel region.
void gemm(bool ta, bool tb, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda, const float* B, i64 ldb,
          float beta, float* C, i64 ldc);

}  // namespace hlm::ops::bf16_pairs
