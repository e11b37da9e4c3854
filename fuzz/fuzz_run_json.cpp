// libFuzzer target: a run folder's run.json (what eval, generate and --resume read back).
#include <cstdint>

#include "cli/common.h"
#include "core/error.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hlm::fuzz::write_input(data, size, "run/run.json");
  try {
    nlohmann::json run = hlm::cli::parse_run_json(path);
    (void)hlm::cli::niah_digits(std::numeric_limits<int>::min(), run);  // the unset flag reads the run's value
    (void)run.value("data", std::string("default"));
    (void)run.value("tokenizer", std::string());
  } catch (const hlm::Error&) {
  }
  return 0;
}
