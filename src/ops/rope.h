#pragma once
// Rotary position embedding, half-split ("rotate_half") pairing: (x_m, x_{m+d/2}).
// inv_freq_m = theta^(-2m/d), angle = p * inv_freq_m computed in fp32-safe double then stored as float.
#include <vector>

#include "core/tensor.h"

namespace hlm::ops {

struct RopeTable {
  i64 max_pos = 0, head_dim = 0;
  std::vector<float> cos, sin;  // [max_pos, head_dim/2]; max_pos = number of rows
  RopeTable() = default;
  RopeTable(i64 max_pos, i64 head_dim, double theta);
  // Rows for positions first_pos .. first_pos+n-1 (row r is position first_pos + r); reuses the storage.
  void fill(i64 first_pos, i64 n, i64 head_dim, double theta);
};

// In place on x laid out [B, T, H, hd] where token (b,t) starts at x + (b*T + t) * row_stride and head h
// at + h*hd. Position of token t is t (pos == nullptr) or pos[b*T + t].
void rope_forward(const RopeTable& tab, float* x, i64 B, i64 T, i64 H, i64 row_stride,
                  const int32_t* pos = nullptr);
// Gradient of rope_forward: the inverse rotation, in place on dx (same layout).
void rope_backward(const RopeTable& tab, float* dx, i64 B, i64 T, i64 H, i64 row_stride,
                   const int32_t* pos = nullptr);

}  // namespace hlm::ops
