#pragma once
// Each subcommand file defines a `register_*` function that adds its CLI11 subcommand and returns the
// action to run when it was chosen.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
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
Command register_reproduce(CLI::App& app);

// How `hybridlm train` takes a long flag: -1 no such option, 0 a switch, 1 a value (checks plans' train flags).
std::function<int(const std::string& long_flag)> train_option_kind();

}  // namespace hlm::cli
