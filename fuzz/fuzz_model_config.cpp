// libFuzzer target: model config JSON (config.json / --config). An accepted config must round-trip through
// to_json. (The memory estimate of an accepted config is fuzz_memory_estimate: it builds mixers, so it needs the
// engine and is left out of the reader-only sanitized build.)
#include <cstdint>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_input.h"
#include "model/config.h"

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
  } catch (const hlm::Error&) {
  }
  return 0;
}
