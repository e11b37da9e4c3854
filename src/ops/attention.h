#pragma once
// Causal softmax attention, tiled with an online softmax (flash style): never builds a T x T matrix.
// GQA: query head h reads KV head h / (H / Hkv). Sliding window W > 0: token t sees keys t-W+1 .. t
// (W keys including itself; W >= T is full causal); tiles outside the band are skipped, so cost ~ T*W.
// Packed documents: when doc_start != nullptr, doc_start[b*T + t] is the index (within row b) of the
// first token of t's document, and t never attends before it.
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops {

struct AttentionShape {
  i64 B = 1, T = 1, H = 1, Hkv = 1, hd = 64;
  i64 window = 0;     // 0 = full causal
  float scale = 0;    // 0 = 1/sqrt(hd)
  // Keys per row; 0 = T. With Tk > T (forward only) the T queries are the LAST T of the Tk key positions:
  // query t sits at key index t + Tk - T (prefill of a chunk after Tk - T cached keys). The window counts
  // in key indices: query t sees keys max(0, t + Tk - T - W + 1) .. t + Tk - T.
  i64 Tk = 0;
};

// q: token (b,t) head h at q + (b*T+t)*q_stride + h*hd      (q_stride >= H*hd)
// k, v: key (b,j) head g at k + (b*Tk+j)*kv_stride + g*hd   (kv_stride >= Hkv*hd; Tk = T unless set)
// o: [B, T, H, hd] contiguous (overwritten); lse: [B, H, T] log-sum-exp of scaled scores (saved).
// doc_start needs Tk == T.
void attention_forward(const AttentionShape& s, const float* q, i64 q_stride, const float* k,
                       const float* v, i64 kv_stride, float* o, float* lse,
                       const int32_t* doc_start = nullptr);

// dq, dk, dv use the same layouts/strides as q, k, v and are overwritten. Needs Tk == T.
void attention_backward(const AttentionShape& s, const float* q, i64 q_stride, const float* k,
                        const float* v, i64 kv_stride, const float* o, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv,
                        const int32_t* doc_start = nullptr);

}  // namespace hlm::ops
