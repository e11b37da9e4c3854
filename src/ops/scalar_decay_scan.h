#pragma once
// Scalar-decay linear attention: the one recurrence behind Lightning Attention and Mamba-2 (SSD).
// Per (batch b, head h), a state S in R^{K x V}:
//   S_t = exp(g_t) S_{t-1} + k_t v_t^T,     o_t = scale * S_t^T q_t     (output reads the UPDATED state)
//   Lightning: g_t = -slope_h (constant).  Mamba-2: q = C_t, k = B_t, v = dt_t * x_t, g_t = dt_t * A_h,
//   scale = 1 (the mixer adds D * x itself).
// GQA-like sharing: head h reads q/k head h / (H / Hk) (Mamba-2 with one B/C group: Hk = 1).
// Packed documents: doc_start[b*T + t] = index (within row b) of the first token of t's document. The state
// is reset to zero at every document start; the initial state only feeds the first document of each row.
// Derivation, chunked forward/backward and what is stored vs recomputed: docs/scalar_decay_scan.md.
//
// Kernels are templates over the float type with float and double instantiations: float is what the
// model runs, double lets tests check the chunked algorithm against the recurrence to ~1e-12.
#include <cstdint>

#include "core/tensor.h"
#include "ops/kernel_args.h"

namespace hlm::ops {

template <typename Real>
struct ScalarDecayArgs {
  // Sizes.
  i64 B = 1, T = 1, H = 1, Hk = 1, K = 64, V = 64;
  i64 chunk = 64;  // chunk length of the chunked kernels (any >= 1; the last chunk may be shorter)
  Real scale = 1;  // multiplies q (MiniMax / Mamba-2: 1; fla's Lightning: 1/sqrt(K))
  // Inputs, with element strides (ops/kernel_args.h; 0 = dense): q head j of token (b,t) starts at
  // q + (b*T+t)*q_stride + j*q_head_stride.
  const Real* q = nullptr;  // [B, T, Hk, K] strided
  i64 q_stride = 0, q_head_stride = 0;  // defaults Hk*K, K
  const Real* k = nullptr;  // [B, T, Hk, K] strided
  i64 k_stride = 0, k_head_stride = 0;  // defaults Hk*K, K
  const Real* v = nullptr;  // [B, T, H, V]  strided
  i64 v_stride = 0, v_head_stride = 0;  // defaults H*V, V
  const Real* g = nullptr;              // [B, T, H]     log decay per token and head (expected <= 0)
  const Real* initial_state = nullptr;  // [B, H, K, V]  nullptr = zeros
  const int32_t* doc_start = nullptr;   // [B*T]         nullptr = one document per row
};

// Gradients: dq, dk, dv have the layouts and strides of q, k, v (only the head slots are written); dg [B, T, H];
// d_initial_state [B, H, K, V] (nullptr = not needed). All are overwritten.
template <typename Real>
struct ScalarDecayGrads {
  Real* dq = nullptr;
  Real* dk = nullptr;
  Real* dv = nullptr;
  Real* dg = nullptr;
  Real* d_initial_state = nullptr;
};

// Number of chunks ceil(T / chunk) and the elements of the saved chunk states [B, H, NC, K, V].
template <typename Real>
i64 scalar_decay_num_chunks(const ScalarDecayArgs<Real>& a);
template <typename Real>
i64 scalar_decay_chunk_states_numel(const ScalarDecayArgs<Real>& a);
// Elements of the workspace scalar_decay_chunked_backward takes.
template <typename Real>
i64 scalar_decay_backward_workspace_numel(const ScalarDecayArgs<Real>& a);

// ---- Recurrent form: token by token (reference, short prompts). -------------------------------------
// o: [B, T, H, V] contiguous, overwritten. final_state: [B, H, K, V] (nullptr = not needed).
template <typename Real>
void scalar_decay_recurrent_forward(const ScalarDecayArgs<Real>& a, OutBuf<Real> o, OutBuf<Real> final_state);

// d_o: [B, T, H, V]; d_final_state: [B, H, K, V] gradient of the final state (nullptr = zero). dq, dk, dv, dg
// are required. Recomputes states inside 64-token segments from stored segment-boundary states.
template <typename Real>
void scalar_decay_recurrent_backward(const ScalarDecayArgs<Real>& a, InBuf<Real> d_o, InBuf<Real> d_final_state,
                                     const ScalarDecayGrads<Real>& gr);

// ---- One decode token. a.T must be 1; a.initial_state and a.doc_start must be nullptr. ----------------
// state: [B, H, K, V] read and updated in place; o: [B, H, V] overwritten.
template <typename Real>
void scalar_decay_step(const ScalarDecayArgs<Real>& a, OutBuf<Real> state, OutBuf<Real> o);

// ---- Chunked form (training, prefill): small matmuls per chunk plus a scan over chunk states. ---------
// o: [B, T, H, V] overwritten; final_state: [B, H, K, V] (nullptr = not needed).
// chunk_states: [B, H, NC, K, V], the state ENTERING each chunk, written for the backward; nullptr = use an
// internal buffer (inference). Per-token states are never stored.
template <typename Real>
void scalar_decay_chunked_forward(const ScalarDecayArgs<Real>& a, OutBuf<Real> o, OutBuf<Real> final_state,
                                  OutBuf<Real> chunk_states);

// Same gradients as the recurrent backward. chunk_states: as written by the forward (slot 0 already holds the
// initial state, so a.initial_state only matters when recomputing), or nullptr to recompute them.
// workspace: scalar_decay_backward_workspace_numel(a) elements, or nullptr for an internal one.
template <typename Real>
void scalar_decay_chunked_backward(const ScalarDecayArgs<Real>& a, InBuf<Real> chunk_states, InBuf<Real> d_o,
                                   InBuf<Real> d_final_state, const ScalarDecayGrads<Real>& gr,
                                   OutBuf<Real> workspace = nullptr);

}  // namespace hlm::ops
