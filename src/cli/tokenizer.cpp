// hybridlm tokenizer: train a SentencePiece BPE model on a corpus; encode / decode text with a tokenizer.
#include <fmt/core.h>

#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "data/corpus.h"
#include "data/spm_trainer.h"
#include "data/tokenizer.h"

namespace hlm::cli {

namespace {

struct TokenizerArgs {
  std::string data, out, spec, text, ids;
  int vocab_size = 4096;
  double sample_mb = 12;
  double val_fraction = 0.02;
  std::uint64_t seed = 0;
  bool add_special = false;
};

int run_train(const TokenizerArgs& a) {
  if (a.out.empty()) fail("tokenizer train: --out FILE.model is required");
  if (a.sample_mb <= 0) fail("tokenizer train: --sample-mb {} must be positive", a.sample_mb);
  data::Corpus corpus = data::open_corpus(a.data);
  // Sample only the train split (as `train` does for bpe:N), so val text never shapes the vocabulary.
  std::vector<bool> is_val = data::split_by_document(corpus.docs, a.val_fraction);
  std::vector<bool> train(is_val.size());
  for (size_t i = 0; i < is_val.size(); ++i) train[i] = !is_val[i];
  data::SpmTrainOptions opt;
  opt.vocab_size = a.vocab_size;
  opt.sample_bytes = static_cast<std::int64_t>(a.sample_mb * 1e6);
  opt.seed = a.seed;
  data::train_sentencepiece_on_corpus(corpus, corpus.docs.size() > 1 ? &train : nullptr, a.out, opt);
  auto tok = data::load_tokenizer(a.out);
  fmt::print("{}\n", tok->spec());
  return 0;
}

int run_encode(const TokenizerArgs& a) {
  auto tok = data::load_tokenizer(a.spec);
  std::vector<std::int32_t> ids = tok->encode(a.text);
  if (a.add_special && tok->adds_bos()) ids.insert(ids.begin(), tok->bos_id());
  if (a.add_special && tok->adds_eos()) ids.push_back(tok->eos_id());
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  fmt::print("{}\n", line);
  return 0;
}

int run_decode(const TokenizerArgs& a) {
  auto tok = data::load_tokenizer(a.spec);
  std::vector<std::int32_t> ids;
  std::istringstream in(a.ids);
  std::string word;
  while (in >> word) {
    try {
      size_t used = 0;
      long v = std::stol(word, &used);
      if (used != word.size()) throw std::invalid_argument(word);
      ids.push_back(static_cast<std::int32_t>(v));
    } catch (const std::exception&) {
      fail("tokenizer decode: --ids: \"{}\" is not an integer", word);
    }
  }
  fmt::print("{}", tok->decode(ids));
  return 0;
}

}  // namespace

Command register_tokenizer(CLI::App& app) {
  auto args = std::make_shared<TokenizerArgs>();
  CLI::App* sub = app.add_subcommand("tokenizer", "Train a SentencePiece BPE tokenizer; encode or decode text");
  sub->require_subcommand(1);

  CLI::App* train = sub->add_subcommand("train", "Train a SentencePiece BPE model on a corpus");
  train->add_option("--data", args->data, "Text file, folder of .txt/.rst/.md(.gz) files, or \"default\"")->required();
  train->add_option("--vocab-size", args->vocab_size, "Number of pieces (>= 260: 256 bytes + specials)")
      ->capture_default_str()
      ->check(in_range(260, 1 << 24));
  train->add_option("--out", args->out, "Output .model file")->required();
  train->add_option("--sample-mb", args->sample_mb, "MB of text sampled for training")->capture_default_str()
      ->check(in_range(0.001, 1e6));
  train->add_option("--val-fraction", args->val_fraction, "Documents held out (never sampled), as in datasets")
      ->capture_default_str()
      ->check(in_range(0, 0.9));
  train->add_option("--seed", args->seed, "Picks which documents are sampled")->capture_default_str()
      ->check(seed_range());

  CLI::App* encode = sub->add_subcommand("encode", "Print the token ids of a text");
  const char* kinds = "\"byte\", a SentencePiece .model, a Hugging Face tokenizer.json or a GGUF vocabulary .gguf.json";
  encode->add_option("--tokenizer", args->spec, kinds)->required();
  encode->add_option("--text", args->text, "Text to encode")->required();
  encode->add_flag("--add-special", args->add_special,
                   "Add <bos> / <eos> where the tokenizer's model expects them (as llama-tokenize does)");

  CLI::App* decode = sub->add_subcommand("decode", "Print the text of space-separated token ids");
  decode->add_option("--tokenizer", args->spec, kinds)->required();
  decode->add_option("--ids", args->ids, "Token ids, e.g. \"72 105\"")->required();

  return {sub, [=]() -> int {
            if (train->parsed()) return run_train(*args);
            if (encode->parsed()) return run_encode(*args);
            if (decode->parsed()) return run_decode(*args);
            return 1;
          }};
}

}  // namespace hlm::cli
