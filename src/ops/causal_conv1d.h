#pragma once
// Depthwise causal conv1d (Mamba-2's short convolution over the xBC channels), optional fused SiLU:
//   pre_t[c] = bias[c] + sum_{j=0}^{W-1} w[c, j] * u_{t-W+1+j}[c],   y = silu(pre) or pre
// w[c, W-1] multiplies the current token (PyTorch conv1d with padding W-1, last W-1 outputs dropped; w is
// stored like PyTorch's [C, 1, W]). Inputs before the row start come from the conv state (zeros by default);
// inputs before the token's document start (doc_start, as in ops/attention.h) are zero.
// Conv state [B, W-1, C]: the last W-1 inputs, oldest first. Prefill then decode: forward with final_state,
// then step() per token. Widths W up to 16.
#include <cstdint>

#include "core/tensor.h"
#include "ops/kernel_args.h"

namespace hlm::ops {

template <typename Real>
struct CausalConv1dArgs {
  i64 B = 1, T = 1, C = 1, W = 4;
  bool silu = false;                    // fused SiLU on the output (backward recomputes the pre-activation)
  const Real* u = nullptr;              // [B, T, C] strided
  i64 u_stride = 0;                     // row stride of u (and of du) in elements; 0 = C (ops/kernel_args.h)
  const Real* w = nullptr;              // [C, W]
  const Real* bias = nullptr;           // [C] or nullptr
  const Real* initial_state = nullptr;  // [B, W-1, C] inputs before t = 0 (first document only); nullptr = 0
  const int32_t* doc_start = nullptr;   // [B*T] or nullptr
};

// Gradients. du: strided like u, overwritten (required). dw [C, W] and dbias [C] are parameter gradients: they
// accumulate (+=; nullptr skips). d_initial_state: [B, W-1, C] overwritten (nullptr = not needed).
template <typename Real>
struct CausalConv1dGrads {
  Real* du = nullptr;
  Real* dw = nullptr;
  Real* dbias = nullptr;
  Real* d_initial_state = nullptr;
};

// y: [B, T, C] contiguous, overwritten. final_state: [B, W-1, C] the last W-1 inputs of each row's last
// document (zeros before its start), nullptr = not needed; it may alias a.initial_state.
template <typename Real>
void causal_conv1d_forward(const CausalConv1dArgs<Real>& a, OutBuf<Real> y, OutBuf<Real> final_state);

// dy: [B, T, C].
template <typename Real>
void causal_conv1d_backward(const CausalConv1dArgs<Real>& a, InBuf<Real> dy, const CausalConv1dGrads<Real>& gr);

// One decode token: a.T == 1, a.initial_state and a.doc_start nullptr. state [B, W-1, C] is read and
// shifted in place (the new input appended); y: [B, C] overwritten.
template <typename Real>
void causal_conv1d_step(const CausalConv1dArgs<Real>& a, OutBuf<Real> state, OutBuf<Real> y);

}  // namespace hlm::ops
