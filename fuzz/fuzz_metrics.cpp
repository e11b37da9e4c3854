// libFuzzer target: a run's metrics.jsonl as `scaling fit` and sweeps read it (with a fixed, valid config.json).
#include <cstdint>
#include <fstream>

#include "core/error.h"
#include "eval/scaling.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool once = [] {
    std::ofstream(hlm::fuzz::scratch_dir() / "run" / "config.json") << R"({"d_model": 32, "n_layers": 2, "pattern": "SF"})";
    return true;
  }();
  (void)once;
  hlm::fuzz::write_input(data, size, "run/metrics.jsonl");
  try {
    for (const char* metric : {"val_loss", "log_longppl"}) {
      hlm::scaling::RunData r = hlm::scaling::read_run((hlm::fuzz::scratch_dir() / "run").string(), metric);
      (void)r.points.size();
    }
  } catch (const hlm::Error&) {
  }
  return 0;
}
