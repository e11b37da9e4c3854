#pragma once
// What a command will allocate, from the config and its flags, before anything is allocated: commands refuse
// work that does not fit (cli/common.h check_memory) instead of dying in bad_alloc or the OOM killer.
#include <string>

#include "model/config.h"

namespace hlm {

struct MemoryUse {
  bool training = false;   // + AdamW moments
  bool recompute = false;  // activation recomputation per block (Model::set_recompute)
  bool bf16 = false;       // --precision bf16: the MLP backward's bf16 operand (training_arena_floats)
  i64 batch = 0, seq_len = 0;  // rows x tokens of the activation arena (0: none)
  i64 decode_rows = 0, decode_context = 0;  // per-layer decode caches (full KV grows with the context)
  double extra_bytes = 0;  // command-specific buffers (logits, attention maps, ...)
};

struct MemoryEstimate {
  double weights = 0, grads = 0, optimizer = 0, activations = 0, caches = 0, extra = 0;  // bytes
  double total() const { return weights + grads + optimizer + activations + caches + extra; }
  // "12.3 GiB (weights 1.1 GiB, gradients 1.1 GiB, ...)", zero parts left out.
  std::string describe() const;
};

MemoryEstimate estimate_memory(const ModelConfig& cfg, const MemoryUse& use);

// Physical memory of this machine (or its cgroup limit, when lower), in bytes.
double machine_memory_bytes();

std::string format_bytes(double bytes);

}  // namespace hlm
