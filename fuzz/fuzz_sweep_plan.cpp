// libFuzzer target: plan files, both kinds: sweep plans (study::load_sweep_plan, `hybridlm sweep`) and study plans
// (study::load_study_plan, `hybridlm reproduce`); each input goes to both readers. The CLI checks a plan's train
// flags against the real `train` subcommand; here a fixed table of train's flags stands in for it, so the target
// does not link the CLI.
#include <cstdint>
#include <set>
#include <string>

#include "core/error.h"
#include "fuzz_input.h"
#include "study/plan.h"
#include "study/sweep_plan.h"

namespace {

int train_option(const std::string& flag) {
  static const std::set<std::string> with_value = {
      "--batch", "--seq-len", "--lr", "--steps", "--warmup", "--schedule", "--eval-every", "--eval-batches",
      "--eval", "--grad-accum", "--weight-decay", "--grad-clip", "--seed", "--threads", "--mix-niah",
      "--mix-haystack", "--niah-digits", "--decay-fraction", "--ckpt-every", "--keep-checkpoints", "--log-every"};
  static const std::set<std::string> switches = {"--quiet", "--check-numerics", "--recompute"};
  if (with_value.count(flag)) return 1;
  if (switches.count(flag)) return 0;
  return -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hlm::fuzz::write_input(data, size, "plan.json");
  try {
    (void)hlm::study::load_sweep_plan(path, train_option);
  } catch (const hlm::Error&) {
  }
  try {
    (void)hlm::study::load_study_plan(path, train_option);
  } catch (const hlm::Error&) {
  }
  return 0;
}
