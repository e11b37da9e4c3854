// libFuzzer target: a checkpoint's trainer_state.json (read by --resume and sweeps).
#include <cstdint>

#include "core/error.h"
#include "fuzz_input.h"
#include "train/checkpoint_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hlm::fuzz::write_input(data, size, "ckpt/trainer_state.json");
  try {
    nlohmann::json st = hlm::load_trainer_state((hlm::fuzz::scratch_dir() / "ckpt").string());
    (void)st.at("step").get<long>();
    (void)st.value("tokens", 0.0);
  } catch (const hlm::Error&) {
  }
  return 0;
}
