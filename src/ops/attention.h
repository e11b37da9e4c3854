#pragma once
// Causal softmax attention, tiled with an online softmax (flash style): never builds a T x T matrix.
// GQA: query head h reads KV head h / (H / Hkv). Sliding window W > 0: token t sees keys t-W+1 .. t
// (W keys including itself; W >= T is full causal); tiles outside the band are skipped, so cost ~ T*W.
// Packed documents: when doc_start != nullptr, doc_start[b*T + t] is the index (within row b) of the
// first token of t's document, and t never attends before it.
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops {

// Float only: the engine runs it in float and its test oracle is a plain double loop (tests/test_attention.cpp).
// Under --precision bf16 its products run in bf16 with fp32 accumulation where the CPU has AVX512_BF16
// (ops/bf16_pairs.h); the softmax and its statistics stay fp32.
struct AttentionArgs {
  i64 B = 1, T = 1, H = 1, Hkv = 1, hd = 64;
  i64 window = 0;     // 0 = full causal
  float scale = 0;    // 0 = 1/sqrt(hd)
  // Keys per row; 0 = T. With Tk > T (forward only) the T queries are the LAST T of the Tk key positions:
  // query t sits at key index t + Tk - T (prefill of a chunk after Tk - T cached keys). The window counts
  // in key indices: query t sees keys max(0, t + Tk - T - W + 1) .. t + Tk - T.
  i64 Tk = 0;
  // Inputs with row strides in elements (ops/kernel_args.h; 0 = dense):
  const float* q = nullptr;  // token (b,t) head h at q + (b*T+t)*q_stride + h*hd
  i64 q_stride = 0;          // >= H*hd; 0 = H*hd
  const float* k = nullptr;  // key (b,j) head g at k + (b*Tk+j)*kv_stride + g*hd
  const float* v = nullptr;  // likewise; k and v share one layout (they are packed tile by tile together)
  i64 kv_stride = 0;         // >= Hkv*hd; 0 = Hkv*hd
  const int32_t* doc_start = nullptr;  // [B*T] or nullptr; needs Tk == T
};

// Gradients, overwritten, with the layouts and strides of q, k, v.
struct AttentionGrads {
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
};

// o: [B, T, H, hd] contiguous (overwritten); lse: [B, H, T] log-sum-exp of scaled scores (saved).
void attention_forward(const AttentionArgs& a, float* o, float* lse);

// o, lse: as written by the forward; d_o: [B, T, H, hd]. Needs Tk == T.
void attention_backward(const AttentionArgs& a, const float* o, const float* lse, const float* d_o,
                        const AttentionGrads& gr);

}  // namespace hlm::ops
