// hybridlm eval <task>: evaluations of a trained checkpoint. `ppl`: validation loss and perplexity.
#include <cmath>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"

namespace hlm::cli {

namespace {

struct PplOpts {
  std::string ckpt, data;
  i64 seq_len = 0, batch = 4, max_batches = 0;
  bool json = false;
  int threads = 0;
};

int run_ppl(const PplOpts& o) {
  apply_threads(o.threads);
  LoadedModel lm = load_model(o.ckpt);
  Model& model = *lm.model;
  std::string data_spec = o.data.empty() ? lm.run.value("data", std::string("default")) : o.data;
  std::string tok = lm.run.value("tokenizer", std::string());
  data::PrepareOptions popt;
  popt.quiet = o.json;
  data::Dataset ds = data::prepare_dataset(data_spec, tok, "", popt);
  if (ds.vocab_size > model.config().vocab_size)
    fail("{}: tokenizer vocab {} is larger than the model's vocab_size {}", ds.dir, ds.vocab_size,
         model.config().vocab_size);
  i64 T = o.seq_len > 0 ? o.seq_len : lm.run.contains("train") ? lm.run["train"].value("seq_len", i64{256}) : 256;
  if (T > model.config().max_seq_len)
    fail("--seq-len {} is over the model's limit max_seq_len = {}", T, model.config().max_seq_len);
  auto shard = std::make_shared<data::TokenShard>(ds.val_path);
  data::LoaderOptions lo;
  lo.batch = static_cast<int>(o.batch);
  lo.seq_len = static_cast<int>(T);
  lo.mode = data::SampleMode::kSequential;
  data::BatchLoader loader(shard, lo);
  data::Batch b;
  double sum = 0;
  i64 count = 0, batches = 0;
  Timer timer;
  while (loader.next(b)) {
    if (b.rows == 0) break;
    i64 n = 0;
    sum += model.forward(b.inputs.data(), b.targets.data(), b.doc_start.data(), b.B, b.T, &n);
    count += n;
    ++batches;
    if (!o.json) fmt::print(stderr, "\reval ppl: batch {} | {} tokens | loss {:.4f}", batches, count, sum / std::max<i64>(1, count));
    if (o.max_batches > 0 && batches >= o.max_batches) break;
  }
  if (!o.json) fmt::print(stderr, "\n");
  if (count == 0) fail("{}: no validation tokens for seq-len {}", ds.val_path, T);
  const double loss = sum / static_cast<double>(count);
  nlohmann::json r = {{"loss", loss}, {"ppl", std::exp(loss)}, {"tokens", count}, {"seq_len", T},
                      {"checkpoint", lm.ckpt_dir}, {"data", ds.val_path}, {"seconds", timer.seconds()}};
  if (o.json) print_json(r);
  else fmt::print("loss {:.4f}  ppl {:.3f}  tokens {}\n", loss, std::exp(loss), count);
  return 0;
}

}  // namespace

Command register_eval(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "evaluate a checkpoint");
  sub->require_subcommand(1);
  auto ppl = std::make_shared<PplOpts>();
  auto* p = sub->add_subcommand("ppl", "validation loss and perplexity");
  p->add_option("--ckpt", ppl->ckpt, "run folder or checkpoint folder")->required();
  p->add_option("--data", ppl->data, "dataset (default: the run's)");
  p->add_option("--seq-len", ppl->seq_len, "tokens per row (default: the run's training length)");
  p->add_option("--batch", ppl->batch, "rows per batch")->capture_default_str();
  p->add_option("--max-batches", ppl->max_batches, "stop after N batches (0 = whole validation split)");
  p->add_flag("--json", ppl->json, "print a JSON result on stdout");
  add_threads_flag(p, &ppl->threads);
  return {sub, [p, ppl]() -> int {
            if (p->parsed()) return run_ppl(*ppl);
            return 1;
          }};
}

}  // namespace hlm::cli
