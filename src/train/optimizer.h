#pragma once
// AdamW with torch.optim.AdamW semantics (decoupled weight decay) and global-norm gradient clipping
// with torch.nn.utils.clip_grad_norm_ semantics. Moments live in flat buffers laid out like the params.
#include <vector>

#include "core/safetensors.h"
#include "core/params.h"

namespace hlm {

struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
};

class AdamW {
 public:
  AdamW(const ParamRegistry& reg, AdamWConfig cfg);
  // Clips grads in place (if grad_clip > 0) and returns the pre-clip global L2 norm.
  double clip(float* grads) const;
  // One update with learning rate lr (the schedule's value for this step).
  void step(float* params, const float* grads, double lr);
  i64 steps() const { return t_; }
  void set_steps(i64 t) { t_ = t; }
  aligned_vector<float>& m() { return m_; }
  aligned_vector<float>& v() { return v_; }
  const aligned_vector<float>& m() const { return m_; }
  const aligned_vector<float>& v() const { return v_; }
  const AdamWConfig& config() const { return cfg_; }
  // Restores exp_avg.<name> / exp_avg_sq.<name> for every parameter (hlm::Error when missing).
  void load_moments(const SafeTensorsFile& f);

 private:
  const ParamRegistry& reg_;
  AdamWConfig cfg_;
  aligned_vector<float> m_, v_;
  // Each tensor's floats [begin, end) and whether weight decay applies, rather than a mask byte per float (beside
  // the 16 bytes per parameter of weights, gradients and moments). The padding between tensors is not updated: its
  // gradients are zero, so an update would leave it zero anyway.
  struct DecaySpan {
    i64 begin, end;
    bool decay;
  };
  std::vector<DecaySpan> spans_;
  i64 t_ = 0;
};

}  // namespace hlm
