// hybridlm: one binary, one file per subcommand (cli/*.cpp registers itself here).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"hybridlm: build, train, evaluate and dissect hybrid language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hybridlm 0.1.0");
  std::vector<hlm::cli::Command> cmds = hlm::cli::all_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Flag errors read like every other error (one "error: " line naming the flag): a sweep quotes it as the reason.
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
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
