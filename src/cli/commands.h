#pragma once
// Each subcommand file defines a `register_*` function that adds its CLI11 subcommand and returns the
// action to run when it was chosen.
#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace hlm::cli {

struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
};

std::vector<Command> all_commands(CLI::App& app);

Command register_train(CLI::App& app);
Command register_eval(CLI::App& app);
Command register_bench(CLI::App& app);
Command register_generate(CLI::App& app);
Command register_probe(CLI::App& app);
Command register_tokenizer(CLI::App& app);
Command register_scaling(CLI::App& app);
Command register_sweep(CLI::App& app);
Command register_recall(CLI::App& app);
Command register_export(CLI::App& app);
Command register_import(CLI::App& app);
Command register_logits(CLI::App& app);

}  // namespace hlm::cli
