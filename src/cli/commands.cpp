#include "cli/commands.h"

namespace hlm::cli {

std::vector<Command> all_commands(CLI::App& app) {
  std::vector<Command> cmds;
  return cmds;
}

}  // namespace hlm::cli
