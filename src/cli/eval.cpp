// hybridlm eval <task>: evaluations of a trained checkpoint. `ppl`: validation loss and perplexity.
#include <cmath>
#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "eval/longppl.h"
#include "eval/niah.h"
#include "eval/ruler.h"
#include "eval/plot.h"
#include "eval/ppl.h"
#include "data/tokenizer.h"

namespace hlm::cli {

namespace {

struct PplOpts {
  std::string ckpt, data, tokenizer, plot;
  std::vector<std::string> lengths;
  i64 seq_len = 0, tokens_per_batch = 8192, max_tokens = 262144;
  int buckets = 8;
  bool json = false;
  int threads = 0;
  double max_memory = 0;
};

// "512" -> 512; "2x" -> 2 * train_len.
i64 parse_length(const std::string& s, i64 train_len) {
  const bool times = !s.empty() && (s.back() == 'x' || s.back() == 'X');
  const std::string num = times ? s.substr(0, s.size() - 1) : s;
  char* end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  const double len = times ? v * static_cast<double>(train_len) : v;
  if (num.empty() || *end != '\0' || !std::isfinite(len) || len < 2 || len > double(1 << 30) ||
      (!times && len != std::floor(len)))
    fail("--lengths: cannot read '{}' (use token counts >= 2 like 512, or multiples of the training length like 2x)", s);
  return static_cast<i64>(len);
}

int run_ppl(const PplOpts& o) {
  apply_threads(o.threads);
  LoadedModel lm = load_model(o.ckpt, o.max_memory);
  Model& model = *lm.model;
  const RunDataSpec spec = run_data_spec(lm, o.data, o.tokenizer);
  data::PrepareOptions popt;
  popt.quiet = o.json;
  data::Dataset ds = data::prepare_dataset(spec.data, spec.tokenizer, "", popt);
  if (ds.vocab_size > model.config().vocab_size)
    fail("{}: tokenizer vocab {} is larger than the model's vocab_size {}", ds.dir, ds.vocab_size,
         model.config().vocab_size);
  const i64 train_len = lm.run.contains("train") ? lm.run["train"].value("seq_len", i64{256}) : 256;
  std::vector<i64> lens;
  if (o.lengths.empty()) lens.push_back(o.seq_len > 0 ? o.seq_len : train_len);
  for (auto& s : o.lengths) lens.push_back(parse_length(s, train_len));
  for (i64 L : lens) {  // every length's batch must fit before the first is scored
    MemoryUse mem;
    mem.batch = std::max<i64>(1, std::min(o.tokens_per_batch / L, (o.max_tokens + L - 1) / L));
    mem.seq_len = L;
    mem.extra_bytes = 4.0 * static_cast<double>(mem.batch * L);  // per-token losses
    check_memory(fmt::format("eval ppl at length {} ({} rows per batch)", L, mem.batch), model.config(), mem,
                 o.max_memory);
  }
  auto shard = std::make_shared<data::TokenShard>(ds.val_path);
  for (i64 L : lens)  // every length is checked before the first is scored
    if (L > shard->n_tokens() - 1)
      fail("{} {}: only {} validation tokens in {}, fewer than a row of that length needs", o.lengths.empty() ? "--seq-len" : "--lengths",
           L, shard->n_tokens(), ds.val_path);
  nlohmann::json by_len = nlohmann::json::array();
  LinePlot plot{"loss by position", "position in the sequence", "mean loss (nats)", false, false, {}};
  Timer timer;
  double first_loss = 0, first_tokens = 0;
  for (i64 L : lens) {
    PositionLoss pl = loss_by_position(model, shard, L, o.buckets, o.tokens_per_batch, o.max_tokens, !o.json);
    const int nb = static_cast<int>(pl.bucket_loss.size());
    const double sum = pl.loss * static_cast<double>(pl.tokens);
    const i64 count = pl.tokens;
    nlohmann::json buckets = nlohmann::json::array();
    Series se{fmt::format("length {}", L), {}, {}, false};
    for (int k = 0; k < nb; ++k) {
      const i64 b0 = pl.bucket_start[k], b1 = pl.bucket_end[k];
      const double bl = pl.bucket_loss[k];
      buckets.push_back({{"start", b0}, {"end", b1}, {"loss", pl.bucket_tokens[k] ? nlohmann::json(bl) : nlohmann::json()},
                         {"tokens", pl.bucket_tokens[k]}});
      se.x.push_back(0.5 * static_cast<double>(b0 + b1));
      se.y.push_back(bl);
    }
    plot.series.push_back(se);
    const double loss = sum / static_cast<double>(count);
    if (by_len.empty()) first_loss = loss, first_tokens = static_cast<double>(count);
    by_len.push_back({{"seq_len", L}, {"x_train", static_cast<double>(L) / train_len}, {"loss", loss},
                      {"ppl", std::exp(loss)}, {"tokens", count}, {"buckets", buckets}});
  }
  if (!o.plot.empty()) write_line_plot(plot, o.plot);
  nlohmann::json r = {{"loss", first_loss}, {"ppl", std::exp(first_loss)}, {"tokens", first_tokens},
                      {"seq_len", lens[0]}, {"train_seq_len", train_len}, {"by_length", by_len},
                      {"checkpoint", lm.ckpt_dir}, {"data", ds.val_path}, {"seconds", timer.seconds()}};
  if (o.json) print_json(r);
  else
    for (auto& e : by_len)
      fmt::print("length {:>6}: loss {:.4f}  ppl {:.3f}  tokens {}\n", e["seq_len"].get<i64>(), e["loss"].get<double>(),
                 e["ppl"].get<double>(), e["tokens"].get<i64>());
  return 0;
}

struct NiahOpts {
  std::string ckpt, data, tokenizer, plot, haystack = "corpus";
  std::vector<std::string> lengths;
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int samples = 4, threads = 0, digits = 0;
  std::uint64_t seed = 42;
  bool json = false;
  double max_memory = 0;
};

// The tokenizer and validation shard of a run (or of --data).
struct RunData {
  std::unique_ptr<data::Tokenizer> tok;
  data::Dataset ds;
  std::shared_ptr<data::TokenShard> val;
  i64 train_len = 256;
};

RunData open_run_data(const LoadedModel& lm, const std::string& data_flag, const std::string& tokenizer_flag,
                      bool quiet) {
  RunData r;
  const RunDataSpec spec = run_data_spec(lm, data_flag, tokenizer_flag);
  data::PrepareOptions popt;
  popt.quiet = quiet;
  r.ds = data::prepare_dataset(spec.data, spec.tokenizer, "", popt);
  r.tok = tokenizer_for(lm, r.ds.tokenizer_spec);
  r.val = std::make_shared<data::TokenShard>(r.ds.val_path);
  r.train_len = lm.run.contains("train") ? lm.run["train"].value("seq_len", i64{256}) : 256;
  return r;
}

int run_niah(const NiahOpts& o) {
  apply_threads(o.threads);
  LoadedModel lm = load_model(o.ckpt);
  RunData rd = open_run_data(lm, o.data, o.tokenizer, o.json);
  std::unique_ptr<Haystack> hay;
  if (o.haystack == "noise") hay = std::make_unique<Haystack>(*rd.tok);
  else if (o.haystack == "corpus") hay = std::make_unique<Haystack>(rd.val, *rd.tok);
  else fail("--haystack must be 'corpus' or 'noise', got '{}'", o.haystack);
  NiahGridConfig c;
  for (auto& s : o.lengths) c.lengths.push_back(parse_length(s, rd.train_len));
  if (c.lengths.empty()) c.lengths.push_back(rd.train_len);
  c.depths = o.depths;
  for (double d : c.depths)
    if (d < 0 || d > 1) fail("--depths: {} is outside [0, 1]", d);
  c.samples = o.samples;
  c.value_digits = niah_digits(o.digits, lm.run);
  check_niah_lengths(o.lengths.empty() ? "--lengths (default: the run's training length)" : "--lengths", c.lengths,
                     lm.model->config(), *rd.tok, c.value_digits, *hay, o.max_memory);
  c.seed = o.seed;
  c.progress = !o.json;
  nlohmann::json r = run_niah_grid(*lm.model, *rd.tok, *hay, c);
  r["checkpoint"] = lm.ckpt_dir;
  r["haystack"] = o.haystack;
  if (!o.plot.empty()) {
    Heatmap h;
    h.title = fmt::format("NIAH accuracy ({} samples per cell, mean {:.2f})", c.samples, r["mean"].get<double>());
    h.xlabel = "context length (tokens)";
    h.ylabel = "needle depth";
    for (i64 L : c.lengths) h.col_labels.push_back(std::to_string(L));
    for (double d : c.depths) h.row_labels.push_back(fmt::format("{:.2f}", d));
    h.values = r["accuracy"].get<std::vector<std::vector<double>>>();
    write_heatmap(h, o.plot);
  }
  if (o.json) {
    print_json(r);
  } else {
    fmt::print("NIAH accuracy (rows: depth, columns: length)\n{:>8}", "");
    for (i64 L : c.lengths) fmt::print("{:>8}", L);
    fmt::print("\n");
    for (size_t d = 0; d < c.depths.size(); ++d) {
      fmt::print("{:>8.2f}", c.depths[d]);
      for (size_t l = 0; l < c.lengths.size(); ++l) fmt::print("{:>8.2f}", r["accuracy"][d][l].get<double>());
      fmt::print("\n");
    }
    fmt::print("mean {:.3f}\n", r["mean"].get<double>());
  }
  return 0;
}

struct RulerOpts {
  std::string ckpt, data, tokenizer, plot, qa_file;
  std::vector<std::string> lengths, tasks;
  int samples = 8, threads = 0;
  std::uint64_t seed = 42;
  bool json = false, skip_too_short = false;
  double max_memory = 0;
};

// A series of the non-null points of `v` (a RULER cell too short for its task is null).
Series ruler_series(const std::string& label, const std::vector<i64>& lengths, const nlohmann::json& v) {
  Series s{label, {}, {}, false};
  for (size_t i = 0; i < lengths.size(); ++i)
    if (!v[i].is_null()) s.x.push_back(static_cast<double>(lengths[i])), s.y.push_back(v[i].get<double>());
  return s;
}

int run_ruler_cmd(const RulerOpts& o) {
  apply_threads(o.threads);
  LoadedModel lm = load_model(o.ckpt);
  RunData rd = open_run_data(lm, o.data, o.tokenizer, o.json);
  Haystack noise(*rd.tok), corpus(rd.val, *rd.tok);
  std::vector<QaItem> qa;
  if (!o.qa_file.empty()) qa = load_qa_file(o.qa_file);
  RulerConfig c;
  c.tasks = o.tasks.empty() ? ruler_task_names() : o.tasks;
  if (o.tasks.empty() && !qa.empty()) c.tasks.push_back("qa");
  for (auto& s : o.lengths) c.lengths.push_back(parse_length(s, rd.train_len));
  if (c.lengths.empty()) c.lengths.push_back(rd.train_len);
  check_generation_lengths(o.lengths.empty() ? "--lengths (default: the run's training length)" : "--lengths",
                           c.lengths, lm.model->config(), o.max_memory);
  c.samples = o.samples;
  c.seed = o.seed;
  c.progress = !o.json;
  c.skip_too_short = o.skip_too_short;
  nlohmann::json r = run_ruler(*lm.model, *rd.tok, noise, &corpus, qa.empty() ? nullptr : &qa, c);
  r["checkpoint"] = lm.ckpt_dir;
  if (!o.plot.empty()) {
    LinePlot p{"RULER score by length", "context length (tokens)", "score (0-100)", true, false, {}};
    for (auto& [task, v] : r["tasks"].items()) p.series.push_back(ruler_series(task, c.lengths, v));
    p.series.push_back(ruler_series("average", c.lengths, r["average"]));
    write_line_plot(p, o.plot);
  }
  if (o.json) {
    print_json(r);
  } else {
    fmt::print("{:<18}", "task");
    for (i64 L : c.lengths) fmt::print("{:>9}", L);
    fmt::print("\n");
    for (auto& [task, v] : r["tasks"].items()) {
      fmt::print("{:<18}", task);
      for (auto& x : v) x.is_null() ? fmt::print("{:>9}", "-") : fmt::print("{:>9.1f}", x.get<double>());
      fmt::print("\n");
    }
    fmt::print("{:<18}", "average");
    for (auto& x : r["average"]) x.is_null() ? fmt::print("{:>9}", "-") : fmt::print("{:>9.1f}", x.get<double>());
    fmt::print("\n");
    for (auto& s : r.value("skipped", nlohmann::json::array()))
      fmt::print("skipped (-): {}\n", s["reason"].get<std::string>());
  }
  return 0;
}

struct LongPplOpts {
  std::string ckpt, evaluator, data, tokenizer, plot;
  i64 doc_len = 1024;
  int docs = 8, threads = 0;
  LongPplConfig c;
  bool json = false;
};

int run_longppl_cmd(const LongPplOpts& o) {
  apply_threads(o.threads);
  LoadedModel lm = load_model(o.ckpt);
  RunData rd = open_run_data(lm, o.data, o.tokenizer, o.json);
  LoadedModel ev;
  if (!o.evaluator.empty()) {
    ev = load_model(o.evaluator);
    const std::string a = lm.run.value("tokenizer", std::string()), b = ev.run.value("tokenizer", std::string());
    if (a != b)
      fail("--evaluator {}: its tokenizer ({}) differs from the evaluated model's ({}); LongPPL here needs a shared "
           "tokenizer", ev.ckpt_dir, b.empty() ? "unknown" : b, a.empty() ? "unknown" : a);
  }
  auto docs = long_documents(*rd.val, o.doc_len, o.docs);
  SequenceScorer evaluated = model_scorer(*lm.model);
  SequenceScorer evaluator = o.evaluator.empty() ? evaluated : model_scorer(*ev.model);
  if (!o.json) fmt::print(stderr, "longppl: {} documents of {} tokens, trunc_len {}, block {}\n", docs.size(), o.doc_len,
                          o.c.trunc_len, o.c.block);
  nlohmann::json r = o.evaluator.empty() ? run_longppl(evaluated, evaluated, docs, o.c)
                                         : run_longppl(evaluated, evaluator, docs, o.c);
  r["checkpoint"] = lm.ckpt_dir;
  r["evaluator"] = o.evaluator.empty() ? lm.ckpt_dir : ev.ckpt_dir;
  if (!o.plot.empty()) {
    KeyTokens k = find_key_tokens(evaluator, docs[0], o.c);
    LinePlot p{"LongPPL: evaluator loss with full vs truncated context (document 1)", "position", "loss (nats)", false,
               false, {}};
    Series full{"full context", {}, {}, false}, shrt{"truncated context", {}, {}, false}, key{"key tokens", {}, {}, true};
    for (size_t i = 1; i < docs[0].size(); ++i) {
      full.x.push_back(static_cast<double>(i));
      full.y.push_back(k.loss_full[i]);
      shrt.x.push_back(static_cast<double>(i));
      shrt.y.push_back(k.loss_short[i]);
      if (k.is_key[i]) key.x.push_back(static_cast<double>(i)), key.y.push_back(k.loss_full[i]);
    }
    p.series = {full, shrt, key};
    write_line_plot(p, o.plot);
  }
  if (o.json) print_json(r);
  else
    fmt::print("LongPPL {}  PPL {:.3f}  key tokens {} of {}\n",
               r["longppl"].is_null() ? std::string("n/a (no key tokens)") : fmt::format("{:.3f}", r["longppl"].get<double>()),
               r["ppl"].get<double>(), r["key_tokens"].get<i64>(), r["tokens"].get<i64>());
  return 0;
}

}  // namespace

Command register_eval(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "evaluate a checkpoint");
  sub->require_subcommand(1);
  auto ppl = std::make_shared<PplOpts>();
  auto* p = sub->add_subcommand("ppl", "validation loss and perplexity");
  p->add_option("--ckpt", ppl->ckpt, "run folder or checkpoint folder")->required();
  add_run_data_flags(p, &ppl->data, &ppl->tokenizer);
  p->add_option("--seq-len", ppl->seq_len, "tokens per row (default: the run's training length)")
      ->check(in_range(2, 1 << 30));
  p->add_option("--lengths", ppl->lengths, "evaluate at these lengths: token counts or multiples of the training "
                "length, e.g. 1x,2x,4x,8x")->delimiter(',');
  p->add_option("--buckets", ppl->buckets, "position buckets for loss by position")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  p->add_option("--tokens-per-batch", ppl->tokens_per_batch, "rows per batch = this / length")->capture_default_str()
      ->check(at_least(1));
  p->add_option("--max-tokens", ppl->max_tokens, "validation tokens per length (at most)")->capture_default_str()
      ->check(at_least(1));
  p->add_option("--plot", ppl->plot, "write loss by position as an SVG line chart");
  p->add_flag("--json", ppl->json, "print a JSON result on stdout");
  add_threads_flag(p, &ppl->threads);
  add_max_memory_flag(p, &ppl->max_memory);
  auto niah = std::make_shared<NiahOpts>();
  auto* n = sub->add_subcommand("niah", "needle-in-a-haystack accuracy over lengths x depths");
  n->add_option("--ckpt", niah->ckpt, "run folder or checkpoint folder")->required();
  add_run_data_flags(n, &niah->data, &niah->tokenizer);
  n->add_option("--lengths", niah->lengths, "prompt lengths: tokens or multiples of the training length (2x)")
      ->delimiter(',');
  n->add_option("--depths", niah->depths, "needle depths in [0, 1]")->delimiter(',')->capture_default_str()
      ->check(in_range(0, 1));
  n->add_option("--samples", niah->samples, "needles per (length, depth) cell")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  n->add_option("--haystack", niah->haystack, "corpus | noise")->capture_default_str()
      ->check(CLI::IsMember({"corpus", "noise"}));
  add_niah_digits_flag(n, &niah->digits);
  n->add_option("--seed", niah->seed, "seed for keys, values and haystack positions")->capture_default_str()
      ->check(seed_range());
  n->add_option("--plot", niah->plot, "write the depth x length heatmap (SVG)");
  n->add_flag("--json", niah->json, "print a JSON result on stdout");
  add_threads_flag(n, &niah->threads);
  add_max_memory_flag(n, &niah->max_memory);
  auto ruler = std::make_shared<RulerOpts>();
  auto* ru = sub->add_subcommand("ruler", "RULER synthetic tasks: per-task and average scores by length");
  ru->add_option("--ckpt", ruler->ckpt, "run folder or checkpoint folder")->required();
  add_run_data_flags(ru, &ruler->data, &ruler->tokenizer);
  ru->add_option("--lengths", ruler->lengths, "prompt lengths: tokens or multiples of the training length")->delimiter(',');
  ru->add_option("--tasks", ruler->tasks, "subset of tasks (default: all synthetic ones, + qa with --qa-file)")
      ->delimiter(',');
  ru->add_option("--samples", ruler->samples, "samples per task and length")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  ru->add_flag("--skip-too-short", ruler->skip_too_short,
               "score a task null at a length its fixed text does not fit (listed under skipped) instead of failing");
  ru->add_option("--qa-file", ruler->qa_file, "JSONL of {question, answers, documents} for the qa task");
  ru->add_option("--seed", ruler->seed, "generator seed")->capture_default_str()
      ->check(seed_range());
  ru->add_option("--plot", ruler->plot, "write score by length per task (SVG)");
  ru->add_flag("--json", ruler->json, "print a JSON result on stdout");
  add_threads_flag(ru, &ruler->threads);
  add_max_memory_flag(ru, &ruler->max_memory);
  auto lp = std::make_shared<LongPplOpts>();
  auto* l = sub->add_subcommand("longppl", "LongPPL: perplexity on key tokens that need long context");
  l->add_option("--ckpt", lp->ckpt, "run folder or checkpoint folder (the evaluated model)")->required();
  l->add_option("--evaluator", lp->evaluator, "checkpoint that picks key tokens (default: the model itself)");
  add_run_data_flags(l, &lp->data, &lp->tokenizer);
  l->add_option("--doc-len", lp->doc_len, "tokens per document")->capture_default_str()
      ->check(in_range(2, 1 << 30));
  l->add_option("--docs", lp->docs, "number of documents")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  l->add_option("--trunc-len", lp->c.trunc_len, "short context K")->capture_default_str()
      ->check(in_range(1, 1 << 30));
  l->add_option("--block", lp->c.block, "scored block size")->capture_default_str()
      ->check(in_range(1, 1 << 30));
  l->add_option("--alpha", lp->c.alpha, "LSD threshold (nats)")->capture_default_str()
      ->check(in_range(-1e30, 1e30));
  l->add_option("--beta", lp->c.beta, "LCL threshold (log-prob)")->capture_default_str()
      ->check(in_range(-1e30, 1e30));
  l->add_option("--plot", lp->plot, "write full vs truncated-context loss of the first document (SVG)");
  l->add_flag("--json", lp->json, "print a JSON result on stdout");
  add_threads_flag(l, &lp->threads);
  return {sub, [p, ppl, n, niah, ru, ruler, l, lp]() -> int {
            if (l->parsed()) return run_longppl_cmd(*lp);
            if (p->parsed()) return run_ppl(*ppl);
            if (n->parsed()) return run_niah(*niah);
            if (ru->parsed()) return run_ruler_cmd(*ruler);
            return 1;
          }};
}

}  // namespace hlm::cli
