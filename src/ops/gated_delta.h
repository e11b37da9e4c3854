#pragma once
// Gated delta rule (Gated DeltaNet kernel), per batch row b and head h, state S in R^{K x V} (fla layout):
//   S~ = a_t S_{t-1},  a_t = exp(g_t) (g_t <= 0);   u_t = beta_t (v_t - S~^T k_t);
//   S_t = S~ + k_t u_t^T;                          o_t = S_t^T q_t.
// q is expected L2-normalised and pre-scaled by K^-1/2 by the caller, k L2-normalised (ops/l2norm.h).
// Derivation, the chunked WY/UT algorithm and its backward: docs/gated_delta.md.
//
// Two implementations with the same arguments and results:
//  - recurrent: token by token (the oracle, and the decode path via gated_delta_step);
//  - chunked: UT transform per chunk of `chunk` tokens + a sequential scan over chunks (training/prefill).
// Packed documents (doc_start != nullptr): doc_start[b*T + t] is the index within row b of the first token of
// t's document; the state is reset to zero at every document start t > 0. initial_state feeds the first
// document of each row; final_state is the state after the last token of the row.
// Parallel over (b, h) with static partitioning; results are deterministic for a given thread count.
// Instantiated for float (engine) and double (test oracles). States stay in Real; the in-chunk cumulative
// log-decay is summed in double (see docs).
#include <cstdint>

#include "core/tensor.h"
#include "ops/kernel_args.h"

namespace hlm::ops {

// Shapes and inputs, shared by every entry point.
template <typename Real>
struct GatedDeltaArgs {
  i64 B = 1, T = 1, H = 1, K = 64, V = 64;
  i64 chunk = 64;                       // chunk length C of the chunked form (also the recompute block of the
                                        // recurrent backward)
  const Real* q = nullptr;              // [B, T, H, K]: token (b,t) head h at q + (b*T+t)*q_stride + h*K
  i64 q_stride = 0;                     // row stride, >= H*K (0 means H*K)
  const Real* k = nullptr;              // [B, T, H, K] with k_stride
  i64 k_stride = 0;
  const Real* v = nullptr;              // [B, T, H, V] with v_stride
  i64 v_stride = 0;
  const Real* g = nullptr;              // [B, T, H] log-decay, finite and <= 0 (-inf gives NaN)
  const Real* beta = nullptr;           // [B, T, H]
  const Real* initial_state = nullptr;  // [B, H, K, V]; nullptr = zeros
  const int32_t* doc_start = nullptr;   // [B*T] or nullptr (one document per row)
};

// Gradients. dq, dk, dv use the strides of q, k, v (padding between rows is left untouched); dg, dbeta are
// [B, T, H]; d_initial_state [B, H, K, V] (nullptr = not needed). All are overwritten.
template <typename Real>
struct GatedDeltaGrads {
  Real* dq = nullptr;
  Real* dk = nullptr;
  Real* dv = nullptr;
  Real* dg = nullptr;
  Real* dbeta = nullptr;
  Real* d_initial_state = nullptr;
};

// o: [B, T, H, V] contiguous (overwritten); final_state [B, H, K, V] (nullptr = not needed).
template <typename Real>
void gated_delta_recurrent_forward(const GatedDeltaArgs<Real>& a, OutBuf<Real> o, OutBuf<Real> final_state);

// d_o: [B, T, H, V]; d_final_state [B, H, K, V] or nullptr (= zeros). Recomputes the states per block of
// a.chunk tokens from block-boundary checkpoints.
template <typename Real>
void gated_delta_recurrent_backward(const GatedDeltaArgs<Real>& a, InBuf<Real> d_o, InBuf<Real> d_final_state,
                                    const GatedDeltaGrads<Real>& gr);

// One decoding step: a.T must be 1 (q, k, v, g, beta describe the one token of each row); state [B, H, K, V]
// is read and updated in place (a.initial_state and a.doc_start are ignored; the caller resets the state
// at a document start). o: [B, H, V].
template <typename Real>
void gated_delta_step(const GatedDeltaArgs<Real>& a, OutBuf<Real> state, OutBuf<Real> o);

// Number of elements of the chunk-boundary state buffer: [B, H, max_segments, K, V]. A segment is a chunk of a
// document: documents are cut into chunks of a.chunk tokens from their own start (the last one shorter), so
// no chunk straddles a document boundary.
template <typename Real>
i64 gated_delta_chunk_states_numel(const GatedDeltaArgs<Real>& a);

// chunk_states (optional, size gated_delta_chunk_states_numel): receives the state entering each segment,
// so the backward need not recompute them. Unused trailing slots of a row are not written.
template <typename Real>
void gated_delta_chunked_forward(const GatedDeltaArgs<Real>& a, OutBuf<Real> o, OutBuf<Real> final_state,
                                 OutBuf<Real> chunk_states = nullptr);

// chunk_states: as written by the forward, or nullptr (then recomputed by one more scan over chunks).
template <typename Real>
void gated_delta_chunked_backward(const GatedDeltaArgs<Real>& a, InBuf<Real> chunk_states, InBuf<Real> d_o,
                                  InBuf<Real> d_final_state, const GatedDeltaGrads<Real>& gr);

#define HLM_GATED_DELTA_DECLARE(Real)                                                                             \
  extern template void gated_delta_recurrent_forward<Real>(const GatedDeltaArgs<Real>&, OutBuf<Real>, OutBuf<Real>); \
  extern template void gated_delta_recurrent_backward<Real>(const GatedDeltaArgs<Real>&, InBuf<Real>, InBuf<Real>,  \
                                                            const GatedDeltaGrads<Real>&);                        \
  extern template void gated_delta_step<Real>(const GatedDeltaArgs<Real>&, OutBuf<Real>, OutBuf<Real>);           \
  extern template i64 gated_delta_chunk_states_numel<Real>(const GatedDeltaArgs<Real>&);                          \
  extern template void gated_delta_chunked_forward<Real>(const GatedDeltaArgs<Real>&, OutBuf<Real>, OutBuf<Real>, \
                                                         OutBuf<Real>);                                           \
  extern template void gated_delta_chunked_backward<Real>(const GatedDeltaArgs<Real>&, InBuf<Real>, InBuf<Real>,  \
                                                          InBuf<Real>, const GatedDeltaGrads<Real>&);
HLM_GATED_DELTA_DECLARE(float)
HLM_GATED_DELTA_DECLARE(double)
#undef HLM_GATED_DELTA_DECLARE

}  // namespace hlm::ops
