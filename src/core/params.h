#pragma once
// Parameter registry: every tensor of the model has a Hugging Face style name, a shape, and a slot in
// one flat fp32 buffer (parameters, gradients and optimizer moments share the layout). Tensors that a
// layer registers one after another are adjacent, which lets e.g. q_proj|k_proj|v_proj act as one fused
// weight for a single matmul.
#include <string>
#include <unordered_map>
#include <vector>

#include "core/aligned.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace hlm {

enum class Init { Normal, Ones, Zeros, Uniform, Custom };

struct ParamInfo {
  std::string name;
  Shape shape;
  i64 offset = 0;  // in floats, into the flat buffers
  bool decay = true;
  Init init = Init::Normal;
  double init_a = 0.02, init_b = 0;  // Normal: std=a; Uniform: [a, b]
};

class ParamRegistry {
 public:
  // Returns the index of the new tensor. Offsets are 16-float (64-byte) aligned, except with
  // `fuse_with_previous`, which places the tensor right after the previous one (a fused weight).
  int add(const std::string& name, Shape shape, Init init = Init::Normal, double a = 0.02, double b = 0,
          bool decay = true, bool fuse_with_previous = false);
  const std::vector<ParamInfo>& all() const { return params_; }
  const ParamInfo& info(int idx) const { return params_[idx]; }
  int find(const std::string& name) const;  // -1 when absent
  i64 total_floats() const { return total_; }
  i64 count() const;  // number of parameters (sum of numel)

 private:
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, int> index_;
  i64 total_ = 0;
};

// The flat buffers of a model: parameters and their gradients (aligned).
struct ParamStore {
  aligned_vector<float> data, grad;  // capacity fixed after allocate(); never reallocated
  void allocate(i64 n) {
    data.assign(static_cast<size_t>(n), 0.f);
    grad.assign(static_cast<size_t>(n), 0.f);
  }
};

}  // namespace hlm
