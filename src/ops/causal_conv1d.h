#pragma once
// Depthwise causal conv1d (Mamba-2's short convolution over the xBC channels), optional fused SiLU:
//   pre_t[c] = bias[c] + sum_{j=0}^{W-1} w[c, j] * u_{t-W+1+j}[c],   y = silu(pre) or pre
// w[c, W-1] multiplies the current token (PyTorch conv1d with padding W-1, last W-1 outputs dropped; w is
// stored like PyTorch's [C, 1, W]). Inputs before the row start come from the conv state (zeros by default);
// inputs before the token's document start (doc_start, as in ops/attention.h) are zero.
// Conv state [B, W-1, C]: the last W-1 inputs, oldest first. Prefill then decode: forward with final_state,
// then step() per token. Widths W up to 16.
#include <cstdint>
#include <type_traits>

#include "core/tensor.h"

namespace hlm::ops {

template <typename Real>
struct CausalConv1dArgsT {
  i64 B = 1, T = 1, C = 1, W = 4;
  i64 u_row = 0;                        // row stride of u (and of du) in elements; 0 = C
  bool silu = false;                    // fused SiLU on the output (backward recomputes the pre-activation)
  const Real* u = nullptr;              // [B, T, C] strided
  const Real* w = nullptr;              // [C, W]
  const Real* bias = nullptr;           // [C] or nullptr
  const Real* initial_state = nullptr;  // [B, W-1, C] inputs before t = 0 (first document only); nullptr = 0
  const int32_t* doc_start = nullptr;   // [B*T] or nullptr
};
using CausalConv1dArgs = CausalConv1dArgsT<float>;

// Buffer arguments do not take part in template deduction, so nullptr can be passed for optional ones.
template <typename Real>
using CcOut = std::type_identity_t<Real>*;
template <typename Real>
using CcIn = const std::type_identity_t<Real>*;

// y: [B, T, C] contiguous, overwritten. final_state: [B, W-1, C] the last W-1 inputs of each row's last
// document (zeros before its start), nullptr = not needed; it may alias a.initial_state.
template <typename Real>
void causal_conv1d_forward(const CausalConv1dArgsT<Real>& a, CcOut<Real> y, CcOut<Real> final_state);

// dy: [B, T, C]. du: strided like u, overwritten. dw [C, W] and dbias [C] accumulate (+=; nullptr skips).
// d_initial_state: [B, W-1, C] overwritten (nullptr = not needed).
template <typename Real>
void causal_conv1d_backward(const CausalConv1dArgsT<Real>& a, CcIn<Real> dy, CcOut<Real> du, CcOut<Real> dw,
                            CcOut<Real> dbias, CcOut<Real> d_initial_state);

// One decode token: a.T == 1, a.initial_state and a.doc_start nullptr. state [B, W-1, C] is read and
// shifted in place (the new input appended); y: [B, C] overwritten.
template <typename Real>
void causal_conv1d_step(const CausalConv1dArgsT<Real>& a, CcOut<Real> state, CcOut<Real> y);

}  // namespace hlm::ops
