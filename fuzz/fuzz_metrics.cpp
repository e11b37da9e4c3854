// libFuzzer target: a run's metrics.jsonl as `scaling fit` and sweeps read it (with a fixed, valid config.json).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "eval/scaling.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The run folder must exist before config.json is written (an ofstream does not create it): without it every
  // input was refused for the missing config before metrics.jsonl was read.
  static const bool once = [] {
    std::filesystem::create_directories(hlm::fuzz::scratch_dir() / "run");
    std::ofstream f(hlm::fuzz::scratch_dir() / "run" / "config.json");
    f << R"({"d_model": 32, "n_layers": 2, "pattern": "SF"})";
    if (!f.flush()) std::abort();
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
