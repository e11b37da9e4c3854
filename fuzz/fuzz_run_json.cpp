// libFuzzer target: a run folder's run.json (what eval, generate and --resume read back).
#include <cstdint>

#include "core/error.h"
#include "fuzz_input.h"
#include "train/run_json.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hlm::fuzz::write_input(data, size, "run/run.json");
  try {
    nlohmann::json run = hlm::parse_run_json(path);
    (void)hlm::run_niah_digits(run);  // what an unset --niah-digits reads
    (void)run.value("data", std::string("default"));
    (void)run.value("tokenizer", std::string());
  } catch (const hlm::Error&) {
  }
  return 0;
}
