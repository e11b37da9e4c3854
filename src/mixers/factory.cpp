#include "core/error.h"
#include "mixers/attention.h"
#include "mixers/gdn.h"
#include "mixers/lightning.h"
#include "mixers/mamba2.h"
#include "mixers/mixer.h"

namespace hlm {

std::unique_ptr<Mixer> make_mixer(const MixerSpec& spec, ParamRegistry& reg) {
  switch (spec.letter) {
    case 'F':
    case 'S':
      return std::make_unique<AttentionMixer>(spec, reg);
    case 'L':
      return std::make_unique<LightningMixer>(spec, reg);
    case 'M':
      return std::make_unique<Mamba2Mixer>(spec, reg);
    case 'G':
      return std::make_unique<GatedDeltaNetMixer>(spec, reg);
    default:
      fail("config: layer {} has mixer letter '{}', which this build does not implement yet", spec.layer,
           spec.letter);
  }
}

}  // namespace hlm
