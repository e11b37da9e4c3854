#pragma once
// The bf16 products of the attention kernels (ops/attention.cpp) under `--precision bf16`: both operands rounded to
// bfloat16 (round to nearest even) and packed in pairs along the summed dimension, so one AVX512_BF16 instruction
// (vdpbf16ps) multiplies two bf16 pairs per fp32 lane and accumulates in fp32: twice the products of an fp32 FMA.
// x86-64 CPUs with AVX512_BF16 only (Zen 4, Cooper Lake, Sapphire Rapids and later); elsewhere available() is false
// and attention keeps its fp32 products. The functions carry their own target attribute, so the file compiles
// in any build and nothing here runs unless available(). docs/precision.md has the error analysis.
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops::attn_bf16 {

// Two bf16 in one 32-bit word: the element of the lower index in the low 16 bits.
using Pair = uint32_t;

// Whether this CPU runs the functions below (x86-64 with AVX512_BF16).
bool available();

// C[mr x N] (+)= A B with fp32 accumulation over K2 pairs: A's pair (row r, pair p) is A[r*a_rs + p*a_ks], B's pair
// (pair p, column n) is B[p*ldb + n]. mr in 1..4; acc: add to C instead of overwriting it.
void block(int mr, i64 N, i64 K2, const Pair* A, i64 a_rs, i64 a_ks, const Pair* B, i64 ldb, float* C, i64 ldc,
           bool acc);

// Rows rounded to bf16, which pairs them along the row: dst[r*ldd + p] = (src[r][2p], src[r][2p+1]) * mul for rows
// r < n and pairs p < cols / 2 (cols even).
void round_rows(const float* src, i64 stride, int n, i64 cols, float mul, Pair* dst, i64 ldd);

// The transpose of round_rows for a whole tile of 64 rows: dst[p*64 + r] = (src[r][2p], src[r][2p+1]) * mul for
// p < hd / 2 (hd even) and r < 64, zero for rows r >= n.
void round_rows_t(const float* src, i64 stride, int n, i64 hd, float mul, Pair* dst);

// Pairs of rows: dst[p*ldd + c] = (src[2p][c], src[2p+1][c]) for pairs p in [p0, p1) and columns c < cols; rows
// outside [r_lo, r_hi] read as zero (the padding of an odd row count, or rows a caller never wrote).
void pair_rows(const float* src, i64 stride, int r_lo, int r_hi, int p0, int p1, i64 cols, Pair* dst, i64 ldd);

}  // namespace hlm::ops::attn_bf16
