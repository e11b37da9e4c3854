// hybridlm: one binary, one file per subcommand (cli/*.cpp registers itself here).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/simd_target.h"

int main(int argc, char** argv) {
  try {
    hlm::init_simd();  // an HLM_SIMD the binary cannot honour is a one-line error, before anything runs
  } catch (const hlm::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  CLI::App app{"hybridlm: build, train, evaluate and dissect hybrid language models"};
  app.require_subcommand(1);
  // The SIMD line names the kernels' dispatched target (HLM_SIMD forces one; docs/performance.md).
  app.set_version_flag("--version", [] {
    std::string avail;
    for (const auto& t : hlm::simd_targets_available()) avail += (avail.empty() ? "" : ", ") + t;
    return "hybridlm 0.1.0\nSIMD kernels: " + hlm::simd_target() + " (this CPU and binary: " + avail + ")";
  });
  std::vector<hlm::cli::Command> cmds = hlm::cli::all_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& c : cmds)
      if (c.sub->parsed()) return c.run();
  } catch (const hlm::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
