// hybridlm import: a Hugging Face folder (config.json, safetensors weights, tokenizer) or a GGUF file (llama.cpp's
// format: metadata, quantized weights, tokenizer) as a hybridlm run folder, so eval, probe, generate, logits and
// further training run on it. docs/hf.md.
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/gguf.h"
#include "data/gguf_vocab.h"
#include "data/hf_tokenizer.h"
#include "model/gguf_import.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"
#include "train/checkpoint.h"
#include "train/run_folder.h"

namespace hlm::cli {

namespace {

// A .gguf file: every check (architecture, keys, tensor names and types, the tokenizer) passes before the run
// folder is made.
int import_gguf(const std::string& path, const std::string& out, bool json) {
  namespace fs = std::filesystem;
  const GgufFile file = GgufFile::read(path);
  const GgufImport imp = gguf_import_config(file);
  const data::TokenizerVocab vocab = data::read_gguf_vocab(file);
  const std::string tok_path = (fs::absolute(out) / "tokenizer.gguf.json").lexically_normal().string();
  auto tok = data::make_vocab_tokenizer(vocab, path, tok_path);
  if (tok->vocab_size() > imp.hf.config.vocab_size)
    fail("{}: the tokenizer has {} ids, more than the model's vocab_size {}", path, tok->vocab_size(),
         imp.hf.config.vocab_size);
  Model model(imp.hf.config);
  load_gguf_weights(file, imp, model);
  fs::create_directories(out);
  data::write_vocab_json(vocab, tok_path);
  const std::string from = fs::absolute(path).lexically_normal().string();
  nlohmann::json run = {{"imported_from", from}, {"architecture", imp.hf.architecture},
                        {"gguf_architecture", imp.gguf_architecture}, {"tokenizer", tok_path}};
  save_checkpoint(out, 0, model, nullptr, {{"step", 0}, {"imported_from", from}});
  write_file_atomic(run_folder::run_json(out).string(), run.dump(2) + "\n");
  if (json) {
    print_json({{"out", out}, {"architecture", imp.hf.architecture}, {"gguf_architecture", imp.gguf_architecture},
                {"pattern", imp.hf.config.layer_pattern()}, {"params", model.num_params()}, {"tokenizer", tok_path},
                {"notes", imp.hf.notes}});
  } else {
    fmt::print("wrote {} ({} from GGUF {}, layers {}, {} parameters, tokenizer {})\n", out,
               imp.gguf_architecture, imp.hf.architecture, imp.hf.config.layer_pattern(), model.num_params(),
               tok->name());
    for (const auto& n : imp.hf.notes) fmt::print("note: {}\n", n);
  }
  return 0;
}

}  // namespace

Command register_import(CLI::App& app) {
  auto* sub = app.add_subcommand("import", "read a Hugging Face transformers folder or a GGUF file into a run folder");
  struct Opts {
    std::string hf_dir, out;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("source", o->hf_dir, "folder with config.json and model.safetensors, or a .gguf file")->required();
  sub->add_option("--out", o->out, "run folder to create")->required();
  sub->add_flag("--json", o->json, "print a JSON result on stdout");
  return {sub, [o]() -> int {
            namespace fs = std::filesystem;
            std::error_code ec;
            if (fs::is_regular_file(o->hf_dir, ec)) {
              if (fs::path(o->hf_dir).extension() != ".gguf")
                fail("{}: a file, but not a .gguf file; import reads a GGUF file or a Hugging Face folder",
                     o->hf_dir);
              return import_gguf(o->hf_dir, o->out, o->json);
            }
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
