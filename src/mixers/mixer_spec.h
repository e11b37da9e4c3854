#pragma once
// What a mixer knows of the model it sits in: its own dimensions and layer-type options, the few shared
// settings its kernels read, the std of its weights at init and the prefix of its parameter names. The model
// fills one per layer from its config (model/layer_spec.h); a mixer never sees the config itself.
#include <array>
#include <string>

#include "core/tensor.h"

namespace hlm {

// The options of one layer type, `layer_types.<letter>` in the config (docs/model.md).
struct LayerTypeOptions {
  bool rope = true;
  i64 window = 0;  // S only; 0 means full causal
  i64 n_heads = 0, n_kv_heads = 0, head_dim = 0;
  bool qk_norm = false;
  // F and S: the RoPE base of this type (the model's rope_theta unless set: Gemma 3 rotates its sliding layers
  // with 10,000 and its full ones with 1,000,000), and the attention scale query_pre_attn_scalar^-1/2 (0: the
  // usual head_dim^-1/2).
  double rope_theta = 0;
  double query_pre_attn_scalar = 0;
  // M and G only: the ranges the per-head decay rate A (A_log = ln A, A ~ U[lo, hi]) and the step size dt
  // (dt_bias = softplus^-1(dt), dt log-uniform in [lo, hi]) are drawn from at init. The defaults are
  // mamba_ssm's (A in [1, 16]) and fla's GDN's (A in [0, 16]); both draw dt from [1e-3, 0.1], which forgets
  // over a few to a few tens of tokens at init (see docs/mixers.md "Recall" for when to widen it).
  std::array<double, 2> a_init_range{0, 0}, dt_init_range{0, 0};
};

struct MixerSpec {
  char letter = 'F';  // F S L M G
  i64 d_model = 0;
  LayerTypeOptions type;        // heads, head_dim, window, RoPE, QK-norm, decay init ranges
  i64 layer = 0, n_layers = 1;  // the layer's place in the stack (Lightning's decay slopes; error messages)
  i64 chunk_size = 64;          // L, M, G: the chunk of the chunked scans
  i64 max_seq_len = 1;          // F, S: rows of the RoPE table built up front (longer contexts grow it)
  double rope_theta = 10000.0;  // F, S: type.rope_theta where set, else the model's
  i64 mamba_d_state = 0, mamba_expand = 0;  // M
  // Std of the N(0, std) weights (before the model's init_scale): the projections that read the normalised
  // input, and the output projection that writes into the residual stream (smaller with depth).
  double init_std = 0.02, out_proj_init_std = 0.02;
  std::string name_prefix;  // "model.layers.{layer}."; each mixer adds its module ("self_attn.", "mixer.", ...)
};

}  // namespace hlm
