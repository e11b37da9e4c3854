#include "cli/commands.h"

namespace hlm::cli {

std::vector<Command> all_commands(CLI::App& app) {
  std::vector<Command> cmds;
  cmds.push_back(register_train(app));
  cmds.push_back(register_eval(app));
  cmds.push_back(register_bench(app));
  cmds.push_back(register_generate(app));
  cmds.push_back(register_probe(app));
  cmds.push_back(register_tokenizer(app));
  cmds.push_back(register_scaling(app));
  cmds.push_back(register_sweep(app));
  cmds.push_back(register_recall(app));
  cmds.push_back(register_export(app));
  cmds.push_back(register_import(app));
  cmds.push_back(register_logits(app));
  cmds.push_back(register_reproduce(app));
  return cmds;
}

}  // namespace hlm::cli
