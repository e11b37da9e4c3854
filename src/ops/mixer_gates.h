#pragma once
// The linear mixers' elementwise gates: Mamba-2's dt (softplus), D skip and silu(z) output gate, Gated
// DeltaNet's normalised output gate, and Lightning's activations and sigmoid output gate. Written once with Google
// Highway and dispatched per SIMD target at run time (docs/performance.md), so a portable build runs them with the
// CPU's vectors too. Rows are processed in whole vectors plus one masked tail; the per-head sums are in lane order,
// the same for any thread count.
#include "core/tensor.h"

namespace hlm::ops {

// ---- Mamba-2 (mixers/mamba2.cpp). Heads h < H of P channels; x rows [N, x_stride] hold the heads' inputs at
// column h*P. ------------------------------------------------------------------------------------------------

// dt[n, h] = softplus(raw[n*raw_stride + h] + dt_bias[h]) (torch's threshold: z > 20 gives z), g[n, h] = A[h] dt,
// and the scan's value rows v[n, h*P + p] = dt[n, h] x[n*x_stride + h*P + p]. dt, g: [N, H]; v: [N, H*P].
void mamba2_dt_forward(const float* raw, i64 raw_stride, const float* dt_bias, const float* A, const float* x,
                       i64 x_stride, float* dt, float* g, float* v, i64 N, i64 H, i64 P);

// The value rows alone, v[n, h*P + p] = dt[n, h] x[n*x_stride + h*P + p]: the same products as
// mamba2_dt_forward's v, so the same bits (backward recomputes v with it instead of keeping it).
void mamba2_dt_scale_x(const float* dt, const float* x, i64 x_stride, float* v, i64 N, i64 H, i64 P);

// y[n, h*P + p] += D[h] x[n*x_stride + h*P + p] (y [N, H*P], updated in place: the skip is part of the saved
// scan output), then out = y * silu(z) with z rows at z_stride. out may alias y.
void mamba2_skip_gate_forward(float* y, const float* x, i64 x_stride, const float* D, const float* z, i64 z_stride,
                              float* out, i64 N, i64 H, i64 P);

// The backward's recompute of the gate and of the RMSNorm that follows it: yg = y * silu(z) and
// yn = yg * rstd[n] * w (w [F]). y, yg, yn: [N, F].
void silu_gate_norm_recompute(const float* y, const float* z, i64 z_stride, const float* rstd, const float* w,
                              float* yg, float* yn, i64 N, i64 F);

// Backward of out = y * silu(z): dy = dout silu(z) and dz = dout y silu'(z), both overwritten. y, dout, dy: [N, F];
// z, dz rows at their strides.
void silu_gate_backward(const float* y, const float* z, i64 z_stride, const float* dout, float* dy, float* dz,
                        i64 dz_stride, i64 N, i64 F);

// Backward of mamba2_dt_forward and of the D skip, per token n and head h, given dv = d v and dys = d(y + D x):
//   dx[n*dx_stride + h*P + p] = D[h] dys + dt dv   (overwritten),
//   ddt = sum_p dv x + dg[n, h] A[h],   draw = ddt softplus'(.) = ddt (1 - e^-dt)   (the gradient of the raw dt
//   column, written at draw[n*draw_stride + h]),
//   part [3, N, H]: sum_p dys x (for dD), dg dt (for dA), draw (for d dt_bias): the per-token terms of the
//   per-head parameter gradients, summed by the caller in a fixed order.
void mamba2_dt_backward(const float* x, i64 x_stride, const float* dv, const float* dys, const float* dt,
                        const float* D, const float* A, const float* dg, float* dx, i64 dx_stride, float* draw,
                        i64 draw_stride, float* part, i64 N, i64 H, i64 P);

// ---- Gated DeltaNet (mixers/gdn.cpp): per (token, head) rows of K channels ----------------------------------

// z = RMSNorm_K(o) * w * silu(gp): o, z [N, H*K]; gp rows at gp_stride (head h at column h*K); w [K].
// rstd [N, H] = 1/sqrt(mean(o^2) + eps) is written when write_rstd, else read (the backward's recompute).
void norm_silu_gate_forward(const float* o, const float* gp, i64 gp_stride, const float* w, float* rstd,
                            bool write_rstd, float* z, i64 N, i64 H, i64 K, float eps);

// Backward of norm_silu_gate_forward: d_o [N, H*K] and d_gp (rows at gp_stride) overwritten, dw [K] accumulated
// (per-chunk partials summed in chunk order: deterministic for a thread count).
void norm_silu_gate_backward(const float* o, const float* gp, i64 gp_stride, const float* w, const float* rstd,
                             const float* dz, float* d_o, float* d_gp, float* dw, i64 N, i64 H, i64 K);

// ---- Lightning Attention (mixers/lightning.cpp): rows of the fused projection q | k | v | gate, 4 F wide --------

// silu(pre) of each row's first 3 F columns (q, k, v) into qkv (rows at qkv_stride) and sigmoid(pre) of its last F
// (the output gate) into gate (rows at gate_stride). pre: [N, 4 F]. gate may be pre + 3 F itself (in place: each
// element is read before it is overwritten); qkv must not overlap pre.
void lightning_activate(const float* pre, float* qkv, i64 qkv_stride, float* gate, i64 gate_stride, i64 N, i64 F);

// u[n, i] *= g[n*g_stride + i]: the output gate on u [N, F].
void gate_multiply(float* u, const float* g, i64 g_stride, i64 N, i64 F);

// The backward's recompute of the normalised output and of the gated one: nrm = o rstd[n] w, u = nrm g (g rows at
// g_stride). o, nrm, u: [N, F]; w [F].
void norm_gate_recompute(const float* o, const float* rstd, const float* w, const float* g, i64 g_stride, float* nrm,
                         float* u, i64 N, i64 F);

// Backward of u = nrm * g with g = sigmoid(gate_pre): dgate_pre = du nrm g (1 - g) (rows at dg_stride, overwritten),
// then du *= g (in place: the gradient of nrm). nrm, du: [N, F]. dgate_pre may be g itself (in place).
void sigmoid_gate_backward(const float* nrm, const float* g, i64 g_stride, float* du, float* dgate_pre,
                           i64 dg_stride, i64 N, i64 F);

// Backward of silu: out[n*out_stride + i] = d[n*d_stride + i] silu'(pre[n*pre_stride + i]) for i < F,
// silu'(x) = s (1 + x (1 - s)). out may be pre or d itself (in place: each element is read before it is overwritten).
void silu_backward(const float* pre, i64 pre_stride, const float* d, i64 d_stride, float* out, i64 out_stride, i64 N,
                   i64 F);

}  // namespace hlm::ops
