#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace hlm {

double lr_at(const ScheduleConfig& c, long step, long total) {
  const double r = c.final_lr_factor;
  if (c.warmup > 0 && step < c.warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup);
  if (c.kind == "constant") return c.lr;
  if (c.kind == "cosine") {
    const double span = std::max<long>(1, total - c.warmup);
    const double p = std::clamp(static_cast<double>(step - c.warmup) / span, 0.0, 1.0);
    return c.lr * (r + (1 - r) * 0.5 * (1 + std::cos(M_PI * p)));
  }
  if (c.kind == "wsd") {
    const long n_decay = static_cast<long>(std::floor(c.decay_fraction * static_cast<double>(total)));
    const long hold_end = total - n_decay;
    if (step < hold_end || n_decay <= 0) return c.lr;
    const double p = std::clamp(static_cast<double>(step - hold_end + 1) / n_decay, 0.0, 1.0);
    double f;
    if (c.decay_shape == "linear") f = 1 - p;
    else if (c.decay_shape == "cosine") f = 0.5 * (1 + std::cos(M_PI * p));
    else if (c.decay_shape == "sqrt") f = 1 - std::sqrt(p);
    else fail("schedule: unknown WSD decay shape '{}' (linear, cosine, sqrt)", c.decay_shape);
    return c.lr * (r + (1 - r) * f);
  }
  fail("schedule: unknown kind '{}' (wsd, cosine, constant)", c.kind);
}

}  // namespace hlm
