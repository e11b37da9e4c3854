// libFuzzer target: the memory estimate (model/memory_estimate.h) of any config the reader accepts must not crash.
// Seeds: fuzz/corpus/model_config. Needs the engine (the estimate builds one mixer per pattern position), so only
// the full asan preset builds it, not the reader-only one (docs/reliability.md).
#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_input.h"
#include "model/config.h"
#include "model/memory_estimate.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const hlm::ModelConfig c =
        hlm::ModelConfig::from_json(nlohmann::json::parse(hlm::fuzz::as_string(data, size)), "fuzz");
    if (c.n_layers > 256) return 0;  // one mixer per layer of the pattern is built (shapes only)
    hlm::MemoryUse use;
    use.training = true;
    use.batch = 2;
    use.seq_len = 64;
    use.decode_rows = 1;
    use.decode_context = 128;
    (void)hlm::estimate_memory(c, use).total();
  } catch (const nlohmann::json::exception&) {
  } catch (const hlm::Error&) {
  }
  return 0;
}
