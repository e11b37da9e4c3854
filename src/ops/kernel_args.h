#pragma once
// The argument dialect of the sequence kernels (attention, scalar decay, gated delta, causal conv1d), written
// down in docs/conventions.md "Kernel arguments": an `...Args` struct (sizes, options, inputs with their strides,
// initial_state, doc_start), forward outputs as pointer arguments, backward gradients in a `...Grads` struct,
// buffer sizes from `..._numel` functions. This header holds the pieces of it every kernel shares.
#include <type_traits>

#include "core/error.h"
#include "core/tensor.h"

namespace hlm::ops {

// Buffer parameters of the kernels templated on the element type: non-deduced (Real comes from the Args struct
// alone), so nullptr can be passed for an optional buffer.
template <typename Real>
using OutBuf = std::type_identity_t<Real>*;
template <typename Real>
using InBuf = const std::type_identity_t<Real>*;

// A strided input X of rows of n_heads heads of dim elements: element i of head j of row r (r = b*T + t) sits at
// X + r * row_stride + j * head_stride + i. A stride of 0 in an Args struct means dense (n_heads * dim, dim).
inline i64 stride_or(i64 given, i64 dense) { return given != 0 ? given : dense; }

// Throws unless the resolved strides keep heads and rows apart; shape() (called only on failure) describes the
// call for the message.
template <typename ShapeFn>
void check_row_layout(const char* op, const char* name, i64 row_stride, i64 head_stride, i64 n_heads, i64 dim,
                      ShapeFn&& shape) {
  HLM_CHECK(head_stride >= dim && row_stride >= (n_heads - 1) * head_stride + dim,
            "{}: {}_stride = {} is too small for {} heads of {} elements {} apart ({})", op, name, row_stride, n_heads,
            dim, head_stride, shape());
}

}  // namespace hlm::ops
