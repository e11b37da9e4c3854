// hybridlm export --format hf: a checkpoint as a Hugging Face folder that transformers loads with no custom
// code (config.json, model.safetensors, tokenizer files). docs/hf.md.
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"
#include "train/checkpoint.h"

namespace hlm::cli {

Command register_export(CLI::App& app) {
  auto* sub = app.add_subcommand("export", "write a checkpoint in another framework's format (--format hf)");
  struct Opts {
    std::string ckpt, format, out, tokenizer;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--ckpt", o->ckpt, "run folder or checkpoint folder")->required();
  sub->add_option("--format", o->format, "hf: a Hugging Face transformers folder")->required();
  sub->add_option("--out", o->out, "output folder")->required();
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer spec (default: the run's)");
  sub->add_flag("--json", o->json, "print a JSON result on stdout");
  return {sub, [o]() -> int {
            namespace fs = std::filesystem;
            if (o->format != "hf") fail("export: --format '{}' is not supported (known: hf)", o->format);
            LoadedModel lm = load_model(o->ckpt);
            const std::string spec = o->tokenizer.empty() ? lm.run.value("tokenizer", std::string()) : o->tokenizer;
            if (spec.empty()) fail("{}: no tokenizer recorded in run.json; pass --tokenizer", lm.ckpt_dir);
            auto tok = data::load_tokenizer(spec);
            const ModelConfig& cfg = lm.model->config();
            if (tok->vocab_size() > cfg.vocab_size)
              fail("export: tokenizer {} has {} tokens, more than the model's vocab_size {}", spec, tok->vocab_size(),
                   cfg.vocab_size);
            // Decide everything before writing anything: a refused export leaves no folder behind.
            const HfExport hf = hf_export_config(cfg, {tok->bos_id(), tok->eos_id()});
            fs::create_directories(o->out);
            write_file_atomic((fs::path(o->out) / "config.json").string(), hf.config.dump(2) + "\n");
            write_hf_weights(*lm.model, hf.architecture, (fs::path(o->out) / "model.safetensors").string());
            data::write_hf_tokenizer(*tok, o->out, cfg.max_seq_len);
            if (o->json)
              print_json({{"out", o->out}, {"architecture", hf.architecture}, {"checkpoint", lm.ckpt_dir},
                          {"tokenizer", spec}, {"params", lm.model->num_params()}});
            else
              fmt::print("wrote {} ({}, {} parameters, tokenizer {})\n", o->out, hf.architecture,
                         lm.model->num_params(), tok->name());
            return 0;
          }};
}

}  // namespace hlm::cli
