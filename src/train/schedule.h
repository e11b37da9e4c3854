#pragma once
// Learning-rate schedules: WSD (warmup-stable-decay) and cosine, both with linear warmup.
#include <string>

namespace hlm {

struct ScheduleConfig {
  std::string kind = "wsd";  // "wsd" | "cosine" | "constant"
  double lr = 1e-3;
  long warmup = 100;  // the CLI's default (-1) means min(100, steps/10)
  double decay_fraction = 0.2;  // WSD: last fraction of steps decays
  std::string decay_shape = "linear";  // WSD decay: "linear" | "cosine" | "sqrt"
  double final_lr_factor = 0.1;        // lr at the end = final_lr_factor * lr
};

// lr at 0-based step `step` of `total` steps.
double lr_at(const ScheduleConfig& c, long step, long total);

}  // namespace hlm
