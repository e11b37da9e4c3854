// libFuzzer target: sweep plan files. The plan reader is internal to the sweep command, so this target compiles
// that file into itself (its functions are in an unnamed namespace).
#include <cstdint>

#include "../src/cli/sweep.cpp"  // NOLINT: see above
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hlm::fuzz::write_input(data, size, "plan.json");
  try {
    hlm::cli::Plan p = hlm::cli::load_plan(path);
    (void)p;
  } catch (const hlm::Error&) {
  }
  return 0;
}
