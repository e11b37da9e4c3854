#include "model/memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "mixers/mixer.h"
#include "model/model.h"
#include "core/params.h"

namespace hlm {

std::string format_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024 * 1024) return fmt::format("{:.1f} TiB", b / (1024.0 * 1024 * 1024 * 1024));
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024));
  return fmt::format("{:.0f} MiB", b / (1024.0 * 1024));
}

std::string MemoryEstimate::describe() const {
  std::string parts;
  auto add = [&](const char* name, double v) {
    if (v > 0) parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", name, format_bytes(v));
  };
  add("weights", weights);
  add("gradients", grads);
  add("optimizer", optimizer);
  add("activations", activations);
  add("caches", caches);
  add("tables and buffers", extra);
  return fmt::format("{} ({})", format_bytes(total()), parts);
}

MemoryEstimate estimate_memory(const ModelConfig& cfg, const MemoryUse& use) {
  MemoryEstimate e;
  const double D = static_cast<double>(cfg.d_model), F = static_cast<double>(cfg.d_ff),
               V = static_cast<double>(cfg.vocab_size), L = static_cast<double>(cfg.n_layers);
  // A first bound in doubles: past 1 PiB the exact (integer) sums below could overflow, and the answer is no.
  double mixer_guess = 0;
  for (i64 l = 0; l < std::min<i64>(cfg.n_layers, 64); ++l) {
    const auto& t = cfg.layer_type(l);
    mixer_guess = std::max(mixer_guess, 4.0 * std::max<double>(t.n_heads, t.n_kv_heads) * t.head_dim * D +
                                            2.0 * cfg.mamba_expand * D * D);
  }
  const double rough_params = 2 * V * D + L * (3 * D * F + mixer_guess);
  const double rough_tokens = static_cast<double>(use.batch) * static_cast<double>(use.seq_len);
  const double rough_acts = rough_tokens * L * (12 * D + 4 * F) * 4;
  if (rough_params * 4 > 1e15 || rough_acts > 1e15) {
    e.weights = rough_params * 4;
    e.grads = e.weights;
    e.optimizer = use.training ? 2 * e.weights : 0;
    e.activations = rough_acts;
    e.extra = use.extra_bytes;
    return e;
  }
  // The mixers register their own parameters. Layers repeat with the pattern, so one mixer per pattern position
  // stands for all its layers; built with max_seq_len 1 (the shapes do not depend on it; RoPE tables are
  // counted below), so the estimate itself allocates next to nothing.
  ModelConfig shape_cfg = cfg;
  shape_cfg.max_seq_len = 1;
  const i64 period = static_cast<i64>(cfg.pattern.size());
  const i64 P = std::min(cfg.n_layers, period);
  ParamRegistry reg;
  std::vector<std::unique_ptr<Mixer>> mixers;
  std::vector<i64> repeats;
  // Embedding and LM head (one matrix when tied), the block norms (four with sandwich norms) and MLP, the final norm.
  double params = (cfg.tie_embeddings ? 1 : 2) * V * D + L * ((cfg.sandwich_norm ? 4 : 2) * D + 3 * D * F) + D;
  for (i64 l = 0; l < P; ++l) {
    const i64 before = reg.total_floats();
    mixers.push_back(make_mixer(shape_cfg, l, reg));
    repeats.push_back((cfg.n_layers - l + period - 1) / period);
    params += static_cast<double>(repeats.back()) * static_cast<double>(reg.total_floats() - before);
    const char c = cfg.letter(l);
    const auto& t = cfg.layer_type(l);
    if ((c == 'F' || c == 'S') && t.rope)  // cos and sin tables of max_seq_len x head_dim / 2, per layer
      e.extra += static_cast<double>(repeats.back()) * 4.0 * static_cast<double>(cfg.max_seq_len) * t.head_dim;
  }
  e.weights = params * 4;
  e.grads = params * 4;  // the model always holds a gradient buffer
  if (use.training) e.optimizer = 2 * params * 4;
  if (use.batch > 0 && use.seq_len > 0)
    e.activations = 4.0 * static_cast<double>(training_arena_floats(shape_cfg, mixers, use.batch, use.seq_len,
                                                                    &repeats, use.recompute, use.bf16));
  if (use.decode_rows > 0) {
    const double rows = static_cast<double>(use.decode_rows), ctx = static_cast<double>(use.decode_context);
    for (i64 l = 0; l < P; ++l) {
      const char c = cfg.letter(l);
      const auto& t = cfg.layer_type(l);
      const double kv = 2.0 * t.n_kv_heads * t.head_dim * 4 * rows;
      double layer = 0;
      if (c == 'F') layer = kv * ctx;
      else if (c == 'S') layer = kv * std::min<double>(ctx, static_cast<double>(t.window));
      else layer = 4.0 * rows * t.n_heads * t.head_dim * std::max<double>(t.head_dim, cfg.mamba_d_state);
      e.caches += static_cast<double>(repeats[static_cast<size_t>(l)]) * layer;
    }
  }
  e.extra += use.extra_bytes;
  return e;
}

double machine_memory_bytes() {
  double phys = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  std::string v;
  if (cg >> v && v != "max") {
    try {
      phys = std::min(phys, std::stod(v));
    } catch (const std::exception&) {
    }
  }
  return phys;
}

}  // namespace hlm
