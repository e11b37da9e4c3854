#pragma once
#include "core/tensor.h"

namespace hlm::ops {

// gu[N, 2F] holds [gate | up] per row (one matmul with the gate_proj and up_proj weights stored
// back to back). h[N,F] = silu(gate) * up.
void swiglu_forward(const float* gu, float* h, i64 N, i64 F);
// dgu[N,2F] overwritten from dh[N,F]. When h is given, the same pass also writes the forward's product
// h[N,F] = silu(gate) * up (training keeps gu, not h: docs/memory.md). In place is allowed: dgu may alias gu
// and h may alias dh (each element is read before the ones at its index are written).
void swiglu_backward(const float* gu, const float* dh, float* dgu, i64 N, i64 F, float* h = nullptr);

}  // namespace hlm::ops
