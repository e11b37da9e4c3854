// hybridlm import: a Hugging Face folder (config.json, safetensors weights, tokenizer) as a hybridlm run
// folder, so eval, probe and generate run on it. docs/hf.md.
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/file_io.h"
#include "data/hf_tokenizer.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"
#include "train/checkpoint.h"
#include "train/run_folder.h"

namespace hlm::cli {

Command register_import(CLI::App& app) {
  auto* sub = app.add_subcommand("import", "read a Hugging Face transformers folder into a run folder");
  struct Opts {
    std::string hf_dir, out;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("hf_dir", o->hf_dir, "folder with config.json and model.safetensors")->required();
  sub->add_option("--out", o->out, "run folder to create")->required();
  sub->add_flag("--json", o->json, "print a JSON result on stdout");
  return {sub, [o]() -> int {
            namespace fs = std::filesystem;
            const std::string cfg_path = (fs::path(o->hf_dir) / "config.json").string();
            const std::string text = read_text_file(cfg_path, "Hugging Face config");
            nlohmann::json hf;
            try {
              hf = nlohmann::json::parse(text);
            } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number too large
              fail("{}: malformed JSON: {}", cfg_path, e.what());
            }
            const HfImport imp = hf_import_config(hf, cfg_path);
            Model model(imp.config);
            load_hf_weights(o->hf_dir, imp.architecture, model, imp.tied_embeddings);
            fs::create_directories(o->out);
            data::HfTokenizerImport tok = data::import_hf_tokenizer(o->hf_dir, o->out);
            if (!tok.spec.empty() && tok.vocab_size > imp.config.vocab_size)
              tok = {"", fmt::format("its tokenizer has {} ids, more than the model's vocab_size {} (pass --tokenizer "
                                     "to commands)", tok.vocab_size, imp.config.vocab_size), 0};
            nlohmann::json run = {{"imported_from", fs::absolute(o->hf_dir).string()},
                                  {"architecture", imp.architecture}};
            if (!tok.spec.empty()) run["tokenizer"] = tok.spec;
            save_checkpoint(o->out, 0, model, nullptr, {{"step", 0}, {"imported_from", run["imported_from"]}});
            write_file_atomic(run_folder::run_json(o->out).string(), run.dump(2) + "\n");
            if (o->json) {
              print_json({{"out", o->out}, {"architecture", imp.architecture}, {"pattern", imp.config.pattern},
                          {"params", model.num_params()}, {"tokenizer", tok.spec}, {"tokenizer_note", tok.reason},
                          {"notes", imp.notes}});
            } else {
              fmt::print("wrote {} ({}, pattern {}, {} parameters, tokenizer {})\n", o->out, imp.architecture,
                         imp.config.pattern, model.num_params(), tok.spec.empty() ? "none" : tok.spec);
              for (const auto& n : imp.notes) fmt::print("note: {}\n", n);
              if (!tok.reason.empty()) fmt::print("note: no tokenizer: {}\n", tok.reason);
            }
            return 0;
          }};
}

}  // namespace hlm::cli
