// libFuzzer target: model config JSON (config.json / --config). An accepted config must round-trip through
// to_json, and its memory estimate must not crash.
#include <cstdint>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_input.h"
#include "model/config.h"
#include "model/memory_estimate.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(hlm::fuzz::as_string(data, size));
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  try {
    const hlm::ModelConfig c = hlm::ModelConfig::from_json(j, "fuzz");
    const hlm::ModelConfig back = hlm::ModelConfig::from_json(c.to_json(), "fuzz round trip");
    if (back.to_json() != c.to_json()) std::abort();
    if (c.n_layers <= 256) {  // the estimate builds one mixer per layer (shapes only)
      hlm::MemoryUse use;
      use.training = true;
      use.batch = 2;
      use.seq_len = 64;
      use.decode_rows = 1;
      use.decode_context = 128;
      (void)hlm::estimate_memory(c, use).total();
    }
  } catch (const hlm::Error&) {
  }
  return 0;
}
