#include "core/error.h"
#include "mixers/attention.h"
#include "mixers/gdn.h"
#include "mixers/lightning.h"
#include "mixers/mamba2.h"
#include "mixers/mixer.h"

namespace hlm {

std::unique_ptr<Mixer> make_mixer(const ModelConfig& cfg, i64 layer, ParamRegistry& reg) {
  const char c = cfg.letter(layer);
  switch (c) {
    case 'F':
    case 'S':
      return std::make_unique<AttentionMixer>(cfg, layer, reg);
    case 'L':
      return std::make_unique<LightningMixer>(cfg, layer, reg);
    case 'M':
      return std::make_unique<Mamba2Mixer>(cfg, layer, reg);
    case 'G':
      return std::make_unique<GatedDeltaNetMixer>(cfg, layer, reg);
    default:
      fail("config: layer {} has mixer letter '{}', which this build does not implement yet", layer, c);
  }
}

}  // namespace hlm
