#include "model/layer_spec.h"

#include <cmath>
#include <string>

namespace hlm {

double residual_out_init_std(const ModelConfig& cfg) {
  return kWeightInitStd / std::sqrt(2.0 * static_cast<double>(cfg.n_layers));
}

MixerSpec mixer_spec(const ModelConfig& cfg, i64 layer) {
  MixerSpec s;
  s.letter = cfg.letter(layer);
  s.d_model = cfg.d_model;
  s.type = cfg.layer_type(layer);
  s.layer = layer;
  s.n_layers = cfg.n_layers;
  s.chunk_size = cfg.chunk_size;
  s.max_seq_len = cfg.max_seq_len;
  s.rope_theta = s.type.rope_theta > 0 ? s.type.rope_theta : cfg.rope_theta;
  s.mamba_d_state = cfg.mamba_d_state;
  s.mamba_expand = cfg.mamba_expand;
  s.init_std = kWeightInitStd;
  s.out_proj_init_std = residual_out_init_std(cfg);
  s.name_prefix = "model.layers." + std::to_string(layer) + ".";
  return s;
}

std::unique_ptr<Mixer> make_mixer(const ModelConfig& cfg, i64 layer, ParamRegistry& reg) {
  return make_mixer(mixer_spec(cfg, layer), reg);
}

}  // namespace hlm
