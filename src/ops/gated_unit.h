#pragma once
// The MLP's gated unit h = act(gate) * up, for two activations: SwiGLU (act = SiLU, the default MLP) and GeGLU with
// the tanh-approximated GELU (Gemma's MLP, `mlp_activation: "geglu_tanh"`, docs/model.md).
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops {

// gu[N, 2F] holds [gate | up] per row (one matmul with the gate_proj and up_proj weights stored
// back to back). h[N,F] = silu(gate) * up.
void swiglu_forward(const float* gu, float* h, i64 N, i64 F);
// dgu[N,2F] overwritten from dh[N,F]. When h is given, the same pass also writes the forward's product
// h[N,F] = silu(gate) * up (training keeps gu, not h: docs/memory.md). In place is allowed: dgu may alias gu
// and h may alias dh (each element is read before the ones at its index are written).
void swiglu_backward(const float* gu, const float* dh, float* dgu, i64 N, i64 F, float* h = nullptr);

// The bf16 step's variants (docs/precision.md): gate|up read in bf16 (the step stores that product rounded) and the
// outputs written rounded to bf16 for the projections that read them: bit for bit ops::to_bf16 of what the fp32
// kernels give on the widened gate|up, without storing fp32 outputs and rounding them in a second pass. dgu may take
// dh's memory (a bf16 row of dgu is exactly the bytes of an fp32 row of dh) or gu's; h must not alias.
using bf16 = std::uint16_t;
void swiglu_forward_bf16(const bf16* gu, bf16* h, i64 N, i64 F);
void swiglu_backward_bf16(const bf16* gu, const float* dh, bf16* dgu, i64 N, i64 F, bf16* h = nullptr);

// GeGLU: the same four with act = gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), transformers'
// gelu_pytorch_tanh, computed as g * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3)) (the same function: 1 + tanh(u) is
// 2 sigmoid(2u)). Same layouts, aliasing rules and bf16 rounding as the SwiGLU entries.
void geglu_forward(const float* gu, float* h, i64 N, i64 F);
void geglu_backward(const float* gu, const float* dh, float* dgu, i64 N, i64 F, float* h = nullptr);
void geglu_forward_bf16(const bf16* gu, bf16* h, i64 N, i64 F);
void geglu_backward_bf16(const bf16* gu, const float* dh, bf16* dgu, i64 N, i64 F, bf16* h = nullptr);

}  // namespace hlm::ops
