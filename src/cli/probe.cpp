// hybridlm probe: receptive-field restriction, retrieval heads (also across a run's checkpoints), attention maps.
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "eval/plot.h"
#include "eval/ppl.h"
#include "eval/probes.h"
#include "train/run_folder.h"

namespace hlm::cli {

namespace {

namespace fs = std::filesystem;

struct ProbeData {
  std::unique_ptr<data::Tokenizer> tok;
  std::shared_ptr<data::TokenShard> val;
  i64 train_len = 256;
};

ProbeData open_probe_data(const LoadedModel& lm, const std::string& data_flag, const std::string& tokenizer_flag,
                          bool quiet) {
  ProbeData r;
  data::PrepareOptions popt;
  popt.quiet = quiet;
  const RunDataSpec spec = run_data_spec(lm, data_flag, tokenizer_flag);
  auto ds = data::prepare_dataset(spec.data, spec.tokenizer, "", popt);
  r.tok = tokenizer_for(lm, ds.tokenizer_spec);
  r.val = std::make_shared<data::TokenShard>(ds.val_path);
  r.train_len = lm.run.contains("train") ? lm.run["train"].value("seq_len", i64{256}) : 256;
  return r;
}

std::vector<i64> lengths_or(const std::vector<i64>& given, i64 def) { return given.empty() ? std::vector<i64>{def} : given; }

struct RfOpts {
  std::string ckpt, data, tokenizer, plot, haystack = "noise";
  std::vector<std::string> restrict = {"full", "efficient"};
  i64 span = 0, seq_len = 0, max_tokens = 65536;
  std::vector<i64> lengths;
  std::vector<double> depths = {0.1, 0.5, 0.9};
  int samples = 4, buckets = 8, threads = 0, digits = 0;
  bool json = false;
};

int run_rf(const RfOpts& o) {
  apply_threads(o.threads);
  if (o.span < 1) fail("--span must be >= 1");
  LoadedModel lm = load_model(o.ckpt);
  Model& m = *lm.model;
  ProbeData pd = open_probe_data(lm, o.data, o.tokenizer, o.json);
  const i64 L = o.seq_len > 0 ? o.seq_len : pd.train_len;
  if (L > pd.val->n_tokens() - 1)
    fail("--seq-len {}: only {} validation tokens in {}, fewer than a row of that length needs", L,
         pd.val->n_tokens(), pd.val->path());
  std::unique_ptr<Haystack> hay = o.haystack == "noise" ? std::make_unique<Haystack>(*pd.tok)
                                                        : std::make_unique<Haystack>(pd.val, *pd.tok);
  NiahGridConfig nc;
  nc.lengths = lengths_or(o.lengths, L);
  nc.depths = o.depths;
  nc.samples = o.samples;
  nc.value_digits = niah_digits(o.digits, lm.run);
  nc.progress = false;
  check_niah_lengths(o.lengths.empty() ? "--lengths (default: the loss's length)" : "--lengths", nc.lengths,
                     m.config(), *pd.tok, nc.value_digits, *hay);
  std::vector<std::string> choices = {"none"};
  choices.insert(choices.end(), o.restrict.begin(), o.restrict.end());
  nlohmann::json rows = nlohmann::json::array();
  LinePlot plot{fmt::format("loss by position, span {} on the restricted layers", o.span), "position", "mean loss (nats)",
                false, false, {}};
  double base_loss = 0, base_niah = 0;
  for (const auto& ch : choices) {
    auto layers = restricted_layers(m.config(), ch);
    apply_max_span(m, layers, ch == "none" ? 0 : o.span);
    PositionLoss pl = loss_by_position(m, pd.val, L, o.buckets, 8192, o.max_tokens, false);
    nlohmann::json niah = run_niah_grid(m, *pd.tok, *hay, nc);
    if (ch == "none") base_loss = pl.loss, base_niah = niah["mean"].get<double>();
    Series se{ch == "none" ? "unrestricted" : "restrict " + ch, {}, pl.bucket_loss, false};
    for (size_t k = 0; k < pl.bucket_start.size(); ++k) se.x.push_back(0.5 * (pl.bucket_start[k] + pl.bucket_end[k]));
    plot.series.push_back(se);
    nlohmann::json buckets = nlohmann::json::array();
    for (size_t k = 0; k < pl.bucket_loss.size(); ++k)
      buckets.push_back({{"start", pl.bucket_start[k]}, {"end", pl.bucket_end[k]}, {"loss", pl.bucket_loss[k]}});
    rows.push_back({{"restrict", ch}, {"layers", layers}, {"loss", pl.loss}, {"delta_loss", pl.loss - base_loss},
                    {"niah_accuracy", niah["mean"]}, {"delta_niah", niah["mean"].get<double>() - base_niah},
                    {"niah_grid", niah["accuracy"]}, {"buckets", buckets}});
    if (!o.json)
      fmt::print(stderr, "receptive-field: restrict {:<10} loss {:.4f} (delta {:+.4f})  NIAH {:.2f}\n", ch, pl.loss,
                 pl.loss - base_loss, niah["mean"].get<double>());
  }
  apply_max_span(m, {}, 0);
  if (!o.plot.empty()) write_line_plot(plot, o.plot);
  nlohmann::json r = {{"span", o.span}, {"seq_len", L}, {"niah_lengths", nc.lengths}, {"niah_depths", nc.depths},
                      {"pattern", m.config().layer_pattern()}, {"rows", rows}, {"checkpoint", lm.ckpt_dir}};
  if (o.json) print_json(r);
  else {
    fmt::print("{:<14}{:>10}{:>12}{:>8}{:>12}\n", "restrict", "loss", "delta", "NIAH", "delta");
    for (auto& row : rows)
      fmt::print("{:<14}{:>10.4f}{:>+12.4f}{:>8.2f}{:>+12.2f}\n", row["restrict"].get<std::string>(),
                 row["loss"].get<double>(), row["delta_loss"].get<double>(), row["niah_accuracy"].get<double>(),
                 row["delta_niah"].get<double>());
  }
  return 0;
}

struct RhOpts {
  std::string ckpt, over, data, tokenizer, plot, haystack = "noise";
  std::vector<i64> lengths;
  std::vector<double> depths = {0.1, 0.3, 0.5, 0.7, 0.9};
  int samples = 2, threads = 0, digits = 0;
  double threshold = 0.1;
  int min_kept = 3;
  std::uint64_t seed = 7;
  bool json = false;
};

// Heads are named only when at least `min_kept` tests were kept: one lucky test would give any head with a
// single copy event a score of 1/|value| (> the 0.1 threshold for a 7-digit value).
nlohmann::json scores_json(const RetrievalScores& s, const ModelConfig& cfg, double threshold, int min_kept) {
  nlohmann::json heads = nlohmann::json::array(), layers = nlohmann::json::array();
  int n_above = 0, n_above_full = 0;
  for (size_t l = 0; l < s.score.size(); ++l) {
    nlohmann::json row = nlohmann::json::array();
    for (size_t h = 0; h < s.score[l].size(); ++h) {
      const double v = s.score[l][h];
      row.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json());
      if (std::isfinite(v) && v > threshold && s.kept >= min_kept) {
        heads.push_back({{"layer", l}, {"head", h}, {"score", v}, {"type", std::string(1, cfg.letter(l))}});
        ++n_above;
        n_above_full += cfg.letter(l) == 'F';
      }
    }
    layers.push_back(row);
  }
  return {{"scores", layers}, {"retrieval_heads", heads}, {"n_retrieval_heads", n_above},
          {"n_retrieval_heads_full", n_above_full}, {"threshold", threshold}, {"min_kept", min_kept}, {"cases", s.cases}, {"kept", s.kept},
          {"niah_accuracy", s.accuracy}};
}

int run_rh(const RhOpts& o) {
  apply_threads(o.threads);
  std::vector<std::string> ckpts;
  if (!o.over.empty()) {
    if (!fs::exists(run_folder::checkpoints(o.over))) fail("--over-checkpoints {}: no checkpoints folder", o.over);
    for (auto& [step, dir] : run_folder::list_checkpoints(o.over)) ckpts.push_back(dir.string());
    if (ckpts.empty()) fail("--over-checkpoints {}: no checkpoints", o.over);
  } else {
    if (o.ckpt.empty()) fail("probe retrieval-heads needs --ckpt or --over-checkpoints");
    ckpts.push_back(o.ckpt);
  }
  nlohmann::json results = nlohmann::json::array();
  LinePlot over{"retrieval heads over training", "step", "heads with score > threshold", false, false, {}};
  Series s_all{"all attention layers", {}, {}, false}, s_full{"full-attention layers", {}, {}, false};
  nlohmann::json last;
  Heatmap hm;
  for (const auto& ck : ckpts) {
    LoadedModel lm = load_model(ck);
    ProbeData pd = open_probe_data(lm, o.data, o.tokenizer, o.json);
    std::unique_ptr<Haystack> hay = o.haystack == "noise" ? std::make_unique<Haystack>(*pd.tok)
                                                          : std::make_unique<Haystack>(pd.val, *pd.tok);
    const std::vector<i64> lengths = lengths_or(o.lengths, pd.train_len);
    const int digits = niah_digits(o.digits, lm.run);
    check_niah_lengths(o.lengths.empty() ? "--lengths (default: the run's training length)" : "--lengths", lengths,
                       lm.model->config(), *pd.tok, digits, *hay);
    RetrievalScores s = retrieval_head_scores(*lm.model, *pd.tok, *hay, lengths, o.depths, o.samples, o.seed, !o.json,
                                              digits);
    nlohmann::json j = scores_json(s, lm.model->config(), o.threshold, o.min_kept);
    const std::string name = fs::path(lm.ckpt_dir).filename().string();
    long step = name.rfind("step_", 0) == 0 ? std::stol(name.substr(5)) : 0;
    j["checkpoint"] = lm.ckpt_dir;
    j["step"] = step;
    s_all.x.push_back(static_cast<double>(step));
    s_all.y.push_back(j["n_retrieval_heads"].get<double>());
    s_full.x.push_back(static_cast<double>(step));
    s_full.y.push_back(j["n_retrieval_heads_full"].get<double>());
    if (!o.json)
      fmt::print(stderr, "{}: {} retrieval heads ({} in full-attention layers), NIAH {:.2f}\n", name,
                 j["n_retrieval_heads"].get<int>(), j["n_retrieval_heads_full"].get<int>(), s.accuracy);
    results.push_back(j);
    hm = Heatmap{};
    hm.title = fmt::format("retrieval score per head ({}, step {})", lm.model->config().layer_pattern(), step);
    hm.xlabel = "head";
    hm.ylabel = "layer";
    for (size_t h = 0; h < s.score[0].size(); ++h) hm.col_labels.push_back(std::to_string(h));
    for (size_t l = 0; l < s.score.size(); ++l)
      hm.row_labels.push_back(fmt::format("{} ({})", l, lm.model->config().letter(static_cast<i64>(l))));
    hm.values = s.score;
    hm.vmax = 0.2;  // a common scale across runs, widened when a head scores higher
    for (const auto& row : s.score)
      for (double v : row)
        if (std::isfinite(v)) hm.vmax = std::max(hm.vmax, v);
    last = j;
  }
  if (!o.plot.empty()) {
    if (ckpts.size() > 1) {
      over.series = {s_all, s_full};
      write_line_plot(over, o.plot);
    } else {
      write_heatmap(hm, o.plot);
    }
  }
  nlohmann::json r = ckpts.size() > 1 ? nlohmann::json{{"checkpoints", results}} : last;
  if (o.json) print_json(r);
  else if (ckpts.size() == 1) {
    fmt::print("retrieval heads (score > {}):", o.threshold);
    for (auto& h : last["retrieval_heads"])
      fmt::print(" L{}H{}({}):{:.2f}", h["layer"].get<int>(), h["head"].get<int>(), h["type"].get<std::string>(),
                 h["score"].get<double>());
    fmt::print("\n");
  }
  return 0;
}

struct AmOpts {
  std::string ckpt, prompt, plot;
  i64 layer = 0, head = 0;
  int threads = 0;
  bool json = false;
};

int run_am(const AmOpts& o) {
  apply_threads(o.threads);
  LoadedModel lm = load_model(o.ckpt);
  const std::string spec = lm.run.value("tokenizer", std::string());
  if (spec.empty()) fail("{}: no tokenizer recorded in run.json", lm.ckpt_dir);
  auto tok = tokenizer_for(lm, spec);
  auto ids = tok->encode(o.prompt);
  if (ids.empty()) fail("--prompt is empty");
  MemoryUse mem;  // one forward over the prompt, and the T x T map (as floats, then as text in the SVG / JSON)
  const i64 T = static_cast<i64>(ids.size());
  mem.batch = 1;
  mem.seq_len = T;
  mem.extra_bytes = 24.0 * static_cast<double>(T) * static_cast<double>(T);
  check_memory(fmt::format("probe attention-map ({} prompt tokens)", T), lm.model->config(), mem, 0);
  auto m = attention_map(*lm.model, ids, o.layer, o.head);
  if (!o.plot.empty()) {
    Heatmap h;
    h.title = fmt::format("attention of layer {} ({}) head {}", o.layer, lm.model->config().letter(o.layer), o.head);
    h.xlabel = "key position";
    h.ylabel = "query position";
    for (size_t i = 0; i < ids.size(); ++i) {
      std::string t = tok->decode({ids[i]});
      for (auto& c : t)
        if (c == '\n') c = ' ';
      h.col_labels.push_back(ids.size() <= 48 ? t : std::to_string(i));
      h.row_labels.push_back(ids.size() <= 48 ? t : std::to_string(i));
    }
    h.values = m;
    h.annotate = false;
    write_heatmap(h, o.plot);
  }
  if (o.json) print_json({{"layer", o.layer}, {"head", o.head}, {"tokens", ids}, {"attention", m}});
  return 0;
}

}  // namespace

Command register_probe(CLI::App& app) {
  auto* sub = app.add_subcommand("probe", "mechanism probes: receptive-field, retrieval-heads, attention-map");
  sub->require_subcommand(1);

  auto rf = std::make_shared<RfOpts>();
  auto* a = sub->add_subcommand("receptive-field", "cap how far back chosen layers see; loss by position and NIAH");
  a->add_option("--ckpt", rf->ckpt, "run folder or checkpoint folder")->required();
  a->add_option("--restrict", rf->restrict, "full | efficient | layer:i,j (several: compared side by side)")
      ->delimiter(';')->capture_default_str();
  a->add_option("--span", rf->span, "how far back the restricted layers may see (tokens)")->required()
      ->check(in_range(1, 1 << 30));
  a->add_option("--seq-len", rf->seq_len, "length for loss by position (default: training length)")
      ->check(in_range(2, 1 << 30));
  a->add_option("--lengths", rf->lengths, "NIAH lengths (default: --seq-len)")->delimiter(',')
      ->check(in_range(2, 1 << 30));
  a->add_option("--depths", rf->depths, "NIAH depths")->delimiter(',')->capture_default_str()
      ->check(in_range(0, 1));
  a->add_option("--samples", rf->samples, "NIAH samples per cell")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  a->add_option("--haystack", rf->haystack, "noise | corpus")->capture_default_str()
      ->check(CLI::IsMember({"corpus", "noise"}));
  add_niah_digits_flag(a, &rf->digits);
  a->add_option("--max-tokens", rf->max_tokens, "validation tokens for the loss")->capture_default_str()
      ->check(at_least(1));
  add_run_data_flags(a, &rf->data, &rf->tokenizer);
  a->add_option("--plot", rf->plot, "loss by position per restriction (SVG)");
  a->add_flag("--json", rf->json, "print a JSON result on stdout");
  add_threads_flag(a, &rf->threads);

  auto rh = std::make_shared<RhOpts>();
  auto* b = sub->add_subcommand("retrieval-heads", "retrieval score per (layer, head) while copying NIAH needles");
  b->add_option("--ckpt", rh->ckpt, "run folder or checkpoint folder");
  b->add_option("--over-checkpoints", rh->over, "a run folder: score every checkpoint of the run");
  b->add_option("--lengths", rh->lengths, "NIAH lengths (default: training length)")->delimiter(',')
      ->check(in_range(2, 1 << 30));
  b->add_option("--depths", rh->depths, "NIAH depths")->delimiter(',')->capture_default_str()
      ->check(in_range(0, 1));
  b->add_option("--samples", rh->samples, "needles per (length, depth)")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  b->add_option("--threshold", rh->threshold, "score above which a head is a retrieval head")->capture_default_str()
      ->check(in_range(0, 1));
  b->add_option("--min-kept", rh->min_kept, "kept tests needed before heads are named")->capture_default_str()
      ->check(in_range(0, 1 << 30));
  b->add_option("--haystack", rh->haystack, "noise | corpus")->capture_default_str()
      ->check(CLI::IsMember({"corpus", "noise"}));
  add_niah_digits_flag(b, &rh->digits);
  b->add_option("--seed", rh->seed, "needle seed")->capture_default_str()
      ->check(seed_range());
  add_run_data_flags(b, &rh->data, &rh->tokenizer);
  b->add_option("--plot", rh->plot, "layer x head heatmap, or heads over steps with --over-checkpoints (SVG)");
  b->add_flag("--json", rh->json, "print a JSON result on stdout");
  add_threads_flag(b, &rh->threads);

  auto am = std::make_shared<AmOpts>();
  auto* c = sub->add_subcommand("attention-map", "attention of one head over a prompt, as an image");
  c->add_option("--ckpt", am->ckpt, "run folder or checkpoint folder")->required();
  c->add_option("--prompt", am->prompt, "text")->required();
  c->add_option("--layer", am->layer, "attention layer index")->required()
      ->check(in_range(0, 1 << 30));
  c->add_option("--head", am->head, "head index")->capture_default_str()
      ->check(in_range(0, 1 << 30));
  c->add_option("--plot", am->plot, "heatmap (SVG)");
  c->add_flag("--json", am->json, "print the matrix as JSON");
  add_threads_flag(c, &am->threads);

  return {sub, [a, rf, b, rh, c, am]() -> int {
            if (a->parsed()) return run_rf(*rf);
            if (b->parsed()) return run_rh(*rh);
            if (c->parsed()) return run_am(*am);
            return 1;
          }};
}

}  // namespace hlm::cli
