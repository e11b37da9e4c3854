#pragma once
// From the model's config to each layer's mixer: the MixerSpec of one layer (all a mixer learns of the
// model), and the init std rules the model and its mixers share.
#include <memory>

#include "core/params.h"
#include "mixers/mixer.h"
#include "model/config.h"

namespace hlm {

// Std of the N(0, std) weights at init, before init_scale: embedding, input projections, LM head.
inline constexpr double kWeightInitStd = 0.02;

// Std of the weights that write into the residual stream (each mixer's output projection and the MLP's
// down_proj): 0.02 / sqrt(2 n_layers), GPT-2's rule. Each block adds two such outputs to the residual, so
// the residual's variance at init stays the same whatever the depth (docs/model.md "Initialisation").
double residual_out_init_std(const ModelConfig& cfg);

// Layer `layer`'s mixer spec: its letter and layer-type options, the shared settings its kernels use,
// its init std values and its parameter-name prefix "model.layers.{layer}.".
MixerSpec mixer_spec(const ModelConfig& cfg, i64 layer);

// Creates layer `layer`'s mixer (from mixer_spec) and registers its parameters under model.layers.{layer}.
std::unique_ptr<Mixer> make_mixer(const ModelConfig& cfg, i64 layer, ParamRegistry& reg);

}  // namespace hlm
