#include "study/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "eval/plot.h"
#include "study/task_graph.h"
#include "study/verdict.h"
#include "train/checkpoint.h"

namespace hlm::study {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double num(const json& j) { return j.is_number() ? j.get<double>() : NAN; }

// "0.52 (0.40..0.61)" over seeds, "0.52" for one, "-" for none.
std::string fmt_values(const std::vector<double>& v, int prec = 3) {
  const Spread s = spread_of(v);
  if (s.n == 0) return "-";
  if (s.n == 1) return fmt::format("{:.{}f}", s.mean, prec);
  return fmt::format("{:.{}f} ({:.{}f}..{:.{}f})", s.mean, prec, s.min, prec, s.max, prec);
}

const json& need(const json& j, const std::string& k, const std::string& where) {
  if (!j.is_object() || !j.contains(k)) fail("findings.json: field '{}{}' is missing", where.empty() ? "" : where + ".", k);
  return j.at(k);
}

std::string label_of(const json& all, const std::string& h) {
  const json& hy = all.value("hybrids", json::object());
  if (!hy.contains(h)) return h;
  const long w = hy[h].value("window", 0L);
  return w > 0 ? fmt::format("{} (window {})", h, w) : h;
}

// ---- a. scaling ----
std::string report_scaling(const json& all, const json& f, const std::string& dir, std::vector<std::string>* figs) {
  const json& data = need(f, "data", "findings[a]");
  const json& curves = need(data, "curves", "findings[a].data");
  const json& fits = need(data, "fits", "findings[a].data");
  std::string md = "| hybrid | final val loss | log LongPPL, first checkpoint | log LongPPL, last | fit loss: alpha | fit log LongPPL: alpha |\n|---|---|---|---|---|---|\n";
  LinePlot pl{"validation loss vs training compute", "training FLOPs", "val loss", true, true, {}};
  LinePlot pp{"log LongPPL (shared evaluator) vs training compute", "training FLOPs", "log LongPPL", true, true, {}};
  int color = 0;
  for (auto& item : curves.items()) {
    // Not a structured binding: the lambdas below capture `h`, which clang before 16 refuses for a binding.
    const std::string& h = item.key();
    const json& seeds = item.value();
    std::vector<double> fl, el, ll;
    Series sl{label_of(all, h), {}, {}, true, color}, sp{label_of(all, h), {}, {}, true, color};
    for (auto& pts : seeds) {
      if (pts.empty()) continue;
      el.push_back(num(pts.front()["log_longppl"]));
      ll.push_back(num(pts.back()["log_longppl"]));
      fl.push_back(num(pts.back()["val_loss"]));
      for (auto& p : pts) {
        const double c = num(p["flops"]);
        if (std::isfinite(c) && std::isfinite(num(p["val_loss"]))) sl.x.push_back(c), sl.y.push_back(num(p["val_loss"]));
        if (std::isfinite(c) && std::isfinite(num(p["log_longppl"]))) sp.x.push_back(c), sp.y.push_back(num(p["log_longppl"]));
      }
    }
    auto alpha = [&](const char* k) {
      const json& x = fits.contains(h) ? fits[h].value(k, json()) : json();
      if (!x.is_object()) return std::string("-");
      if (x.contains("skipped")) return "skipped: " + x["skipped"].get<std::string>();
      return fmt::format("{:.3f} (E {:.3g})", x["alpha"].get<double>(), x["E"].get<double>());
    };
    md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", label_of(all, h), fmt_values(fl), fmt_values(el),
                      fmt_values(ll), alpha("val_loss"), alpha("log_longppl"));
    auto fit_line = [&](const char* k, const Series& pts, LinePlot& plot) {
      const json& x = fits.contains(h) ? fits[h].value(k, json()) : json();
      if (!x.is_object() || x.contains("skipped") || pts.x.empty()) return;
      const double lo = *std::min_element(pts.x.begin(), pts.x.end()), hi = *std::max_element(pts.x.begin(), pts.x.end());
      Series line{fmt::format("{} fit", h), {}, {}, false, color};
      for (int i = 0; i <= 40; ++i) {
        const double c = lo * std::pow(hi / lo, i / 40.0);
        line.x.push_back(c);
        line.y.push_back(x["E"].get<double>() + x["A"].get<double>() * std::pow(c, -x["alpha"].get<double>()));
      }
      plot.series.push_back(line);
    };
    if (!sl.x.empty()) pl.series.push_back(sl);
    if (!sp.x.empty()) pp.series.push_back(sp);
    fit_line("val_loss", sl, pl);
    fit_line("log_longppl", sp, pp);
    ++color;
  }
  const json& d = f.value("details", json::object());
  md += fmt::format("\nSpread across hybrids per seed (mean over seeds): val loss (max-min)/mean {}; log LongPPL "
                    "max-min at the first checkpoint {}, at the last {}. Largest window lagging most at the first "
                    "checkpoint: {}.\n",
                    d.contains("loss_spread") && d["loss_spread"].is_object() ? fmt::format("{:.4f}", d["loss_spread"]["mean"].get<double>()) : "-",
                    d.contains("log_longppl_spread_early") && d["log_longppl_spread_early"].is_object() ? fmt::format("{:.4f}", d["log_longppl_spread_early"]["mean"].get<double>()) : "-",
                    d.contains("log_longppl_spread_final") && d["log_longppl_spread_final"].is_object() ? fmt::format("{:.4f}", d["log_longppl_spread_final"]["mean"].get<double>()) : "-",
                    d.value("largest_window_lags_most", std::string("-")));
  // How much each LongPPL number rests on: the evaluator's key tokens, over all evaluations.
  if (const long n = d.value("longppl_evaluations", 0L); n > 0)
    md += fmt::format("LongPPL read on up to {} validation documents per evaluation: {} key tokens over {} "
                      "evaluations ({:.1f} each).\n",
                      all.value("budget", json::object()).value("longppl_docs", 0), d.value("longppl_key_tokens", 0L),
                      n, static_cast<double>(d.value("longppl_key_tokens", 0L)) / static_cast<double>(n));
  if (!pl.series.empty()) {
    write_line_plot(pl, (fs::path(dir) / "loss-vs-compute.svg").string());
    figs->push_back("loss-vs-compute.svg");
    md += "\n![loss vs compute](loss-vs-compute.svg)\n";
  }
  if (!pp.series.empty()) {
    write_line_plot(pp, (fs::path(dir) / "longppl-vs-compute.svg").string());
    figs->push_back("longppl-vs-compute.svg");
    md += "\n![log LongPPL vs compute](longppl-vs-compute.svg)\n";
  }
  return md;
}

// ---- b. receptive field ----
std::string report_receptive(const json& all, const json& f, const std::string& dir, std::vector<std::string>* figs) {
  const json& data = need(f, "data", "findings[b]");
  const json& per = need(data, "per_seed", "findings[b].data");
  std::string md = fmt::format("Span {} tokens on the capped layers. NIAH exact match (mean (min..max) over seeds); loss change "
                               "on validation text in nats.\n\n| hybrid | NIAH | NIAH, full capped | NIAH, efficient capped | "
                               "loss change, full capped | loss change, efficient capped |\n|---|---|---|---|---|---|\n",
                               data.value("span", 0L));
  BarChart bars;
  bars.title = fmt::format("NIAH with the full / efficient layers capped at {} tokens (mean, min..max over seeds)",
                           data.value("span", 0L));
  bars.ylabel = "NIAH exact match";
  bars.series = {"unrestricted", "full layers capped", "efficient layers capped"};
  bars.values = bars.lo = bars.hi = std::vector<std::vector<double>>(3);
  for (auto& [h, seeds] : per.items()) {
    std::map<std::string, std::vector<double>> v;
    for (auto& s : seeds)
      for (const char* k : {"none", "full", "efficient"})
        if (s.contains(k)) {
          v[k].push_back(num(s[k]["niah"]));
          v[std::string(k) + "_dl"].push_back(num(s[k]["delta_loss"]));
        }
    md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", label_of(all, h), fmt_values(v["none"], 2), fmt_values(v["full"], 2),
                      fmt_values(v["efficient"], 2), fmt_values(v["full_dl"]), fmt_values(v["efficient_dl"]));
    bars.groups.push_back(h);
    int k = 0;
    for (const char* key : {"none", "full", "efficient"}) {
      const Spread sp = spread_of(v[key]);
      bars.values[k].push_back(sp.n ? sp.mean : NAN);
      bars.lo[k].push_back(sp.n ? sp.min : NAN);
      bars.hi[k].push_back(sp.n ? sp.max : NAN);
      ++k;
    }
  }
  if (!bars.groups.empty()) {
    write_bar_chart(bars, (fs::path(dir) / "receptive-field.svg").string());
    figs->push_back("receptive-field.svg");
    md += "\n![receptive field](receptive-field.svg)\n";
  }
  return md;
}

// ---- c. laziness ----
std::string report_laziness(const json& all, const json& f, const std::string& dir, std::vector<std::string>* figs) {
  const json& data = need(f, "data", "findings[c]");
  const json& curves = need(data, "curves", "findings[c].data");
  const json& per = f.value("details", json::object()).value("per_hybrid", json::object());
  std::string md = "| hybrid | onset of full-layer retrieval heads (step, per seed) | NIAH at the end | full-layer heads at the end |\n|---|---|---|---|\n";
  LinePlot pn{"NIAH over training (mean over seeds)", "step", "NIAH exact match", false, false, {}};
  LinePlot ph{"retrieval heads in the full-attention layers over training (mean over seeds)", "step", "heads", false, false, {}};
  int color = 0;
  for (auto& h : need(data, "order", "findings[c].data")) {
    const std::string name = h.get<std::string>();
    const json& seeds = curves.value(name, json::array());
    std::map<long, std::vector<double>> niah, heads;
    std::vector<double> end_niah, end_heads;
    for (auto& pts : seeds) {
      for (auto& p : pts) {
        niah[p["step"].get<long>()].push_back(num(p["niah"]));
        heads[p["step"].get<long>()].push_back(num(p["heads_full"]));
      }
      if (!pts.empty()) end_niah.push_back(num(pts.back()["niah"])), end_heads.push_back(num(pts.back()["heads_full"]));
    }
    std::string onset = "-";
    if (per.contains(name)) {
      onset.clear();
      for (auto& x : per[name]["onset_steps"]) onset += (onset.empty() ? "" : ", ") + (x.is_string() ? x.get<std::string>() : fmt::format("{}", x.get<double>()));
    }
    md += fmt::format("| {} | {} | {} | {} |\n", label_of(all, name), onset, fmt_values(end_niah, 2), fmt_values(end_heads, 1));
    Series sn{label_of(all, name), {}, {}, false, color}, sh{label_of(all, name), {}, {}, false, color};
    for (auto& [step, v] : niah) sn.x.push_back(static_cast<double>(step)), sn.y.push_back(spread_of(v).mean);
    for (auto& [step, v] : heads) sh.x.push_back(static_cast<double>(step)), sh.y.push_back(spread_of(v).mean);
    if (!sn.x.empty()) pn.series.push_back(sn), ph.series.push_back(sh);
    ++color;
  }
  if (!pn.series.empty()) {
    write_line_plot(pn, (fs::path(dir) / "niah-over-training.svg").string());
    write_line_plot(ph, (fs::path(dir) / "heads-over-training.svg").string());
    figs->push_back("niah-over-training.svg");
    figs->push_back("heads-over-training.svg");
    md += "\n![NIAH over training](niah-over-training.svg) ![retrieval heads over training](heads-over-training.svg)\n";
  }
  return md;
}

// ---- d. NoPE ----
// When each run learned retrieval (studies made before the probe ran for d have no such data: nothing is shown).
std::string report_nope_over_training(const json& all, const json& f, const std::string& dir,
                                      std::vector<std::string>* figs) {
  const json& data = f.at("data");
  const json& per = data.at("per_seed");
  const double learned_min = f.value("rule", json::object()).value("learned_min", 0.0);
  std::string md;
  LinePlot p{"NIAH at the training length over training, per seed", "step", "NIAH exact match", false, false, {}};
  int color = 0;
  for (const char* k : {"rope", "nope"}) {
    const std::string h = data.value(k, std::string());
    std::string at;
    int seed = all.value("first_seed", 1) - 1;
    for (auto& s : per.value(h, json::array())) {
      ++seed;
      if (!s.contains("learned_at")) continue;
      const json& x = s["learned_at"];
      at += (at.empty() ? "" : ", ") + (x.is_string() ? x.get<std::string>() : fmt::format("{}", x.get<long>()));
      Series se{fmt::format("{} s{}", h, seed), {}, {}, false, color};
      for (auto& q : s["over_training"])
        se.x.push_back(static_cast<double>(q["step"].get<long>())), se.y.push_back(num(q["niah"]));
      p.series.push_back(se);
    }
    ++color;
    if (!at.empty()) md += fmt::format("| {} | {} |\n", label_of(all, h), at);
  }
  if (md.empty()) return md;
  md = fmt::format("\nWhen each run learned retrieval (beside the verdict, not part of its rule): the first "
                   "checkpoint at which NIAH at the training length reaches `learned_min` = {:g} (`probe "
                   "retrieval-heads --over-checkpoints`).\n\n| hybrid | learned retrieval at step (per seed) |\n"
                   "|---|---|\n{}",
                   learned_min, md);
  write_line_plot(p, (fs::path(dir) / "nope-rope-over-training.svg").string());
  figs->push_back("nope-rope-over-training.svg");
  md += "\n![NIAH over training, RoPE vs NoPE](nope-rope-over-training.svg)\n";
  return md;
}

std::string report_nope(const json& all, const json& f, const std::string& dir, std::vector<std::string>* figs) {
  const json& data = need(f, "data", "findings[d]");
  const json& per = need(data, "per_seed", "findings[d].data");
  std::string md = "| hybrid | NIAH by length (tokens: mean over seeds) | RULER average | long-context score | val loss |\n|---|---|---|---|---|\n";
  LinePlot p{"NIAH by context length: RoPE vs NoPE on the full layers", "context length (tokens)", "NIAH exact match", false, false, {}};
  int color = 0;
  for (const char* k : {"rope", "nope"}) {
    const std::string h = data.value(k, std::string());
    const json& seeds = per.value(h, json::array());
    std::map<long, std::vector<double>> by_len;
    std::vector<double> score, loss, ruler;
    for (auto& s : seeds) {
      for (auto& l : s["lengths"]) by_len[l["length"].get<long>()].push_back(num(l["niah"]));
      score.push_back(num(s["score"]));
      loss.push_back(num(s["val_loss"]));
      if (s["ruler"].is_array()) {
        double r = 0;
        int n = 0;  // lengths where some task fits (a null average: none did)
        for (auto& x : s["ruler"])
          if (!x.is_null()) r += x.get<double>(), ++n;
        if (n > 0) ruler.push_back(r / n);
      }
    }
    std::string lens;
    Series se{label_of(all, h), {}, {}, false, color++};
    for (auto& [L, v] : by_len) {
      lens += fmt::format("{}{}: {:.2f}", lens.empty() ? "" : ", ", L, spread_of(v).mean);
      se.x.push_back(static_cast<double>(L));
      se.y.push_back(spread_of(v).mean);
    }
    md += fmt::format("| {} | {} | {} | {} | {} |\n", label_of(all, h), lens.empty() ? "-" : lens, fmt_values(ruler, 1),
                      fmt_values(score, 3), fmt_values(loss, 4));
    if (!se.x.empty()) p.series.push_back(se);
  }
  for (auto& why : data.value("ruler_skipped", json::array()))
    md += fmt::format("{}- RULER cell left out (too short for its task with this tokenizer): {}\n",
                      md.ends_with("|\n") ? "\n" : "", why.get<std::string>());
  if (!p.series.empty()) {
    write_line_plot(p, (fs::path(dir) / "nope-vs-rope.svg").string());
    figs->push_back("nope-vs-rope.svg");
    md += "\n![NoPE vs RoPE by length](nope-vs-rope.svg)\n";
  }
  md += report_nope_over_training(all, f, dir, figs);
  return md;
}

std::string rule_params(const json& rule) {
  std::string s;
  for (auto& [k, v] : rule.items()) s += fmt::format("{}{} = {}", s.empty() ? "" : ", ", k, v.dump());
  return s;
}

// Where the study ran and for how long. A study runs in sittings (each resumes the last) and may move between machines:
// sittings on one machine with one job layout read as one line; several machines or layouts are listed each with its
// time. A sitting stopped by a kill never recorded its time; a folder from before sittings were recorded has only the
// total and the last sitting's machine, which is what older findings.json files hold too.
std::string wall_time_line(const json& run) {
  auto plural = [](long n, const char* what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); };
  auto where = [&](const json& r) {
    const std::string machine =
        !r.contains("cores") ? std::string("a machine not recorded")
        : r.contains("cpu")  ? fmt::format("a machine with {} cores ({}, SIMD kernels {})", r.value("cores", 0),
                                           r.value("cpu", std::string()), r.value("simd", std::string()))
                             : fmt::format("a machine with {} cores", r.value("cores", 0));
    if (!r.contains("jobs")) return machine;
    return fmt::format("{} ({} at a time x {}{})", machine, plural(r.value("jobs", 0), "job"),
                       plural(r.value("threads_per_job", 0), "thread"),
                       r.value("ranks", 1) > 1 ? fmt::format(", {} MPI ranks", r.value("ranks", 1)) : std::string());
  };
  struct Group {
    std::string where;
    double seconds = 0;
    int sittings = 0, untimed = 0;
  };
  std::vector<Group> groups;
  json sittings = run.value("sittings", json::array());
  if (sittings.empty()) {  // findings.json from before sittings were recorded: the total, on the last one's machine
    json one = {{"seconds", run.value("wall_seconds", 0.0)}};
    for (const char* k : {"cores", "cpu", "simd", "jobs", "threads_per_job"})
      if (run.contains(k)) one[k] = run[k];
    sittings.push_back(one);
  }
  double total = 0;
  for (const json& sit : sittings) {
    const std::string w = where(sit);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.where == w; });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{w});
    ++g->sittings;
    if (sit.value("seconds", json()).is_number()) {
      g->seconds += sit["seconds"].get<double>();
      total += sit["seconds"].get<double>();
    } else {
      ++g->untimed;
    }
  }
  const std::string tasks = fmt::format("{} tasks, {} failed, {} skipped.\n", run.value("tasks", 0),
                                        run.value("tasks_failed", 0), run.value("tasks_skipped", 0));
  if (groups.size() == 1 && groups[0].untimed == 0)
    return fmt::format("- Wall time: {} over all sittings, on {}; {}", format_duration(total), groups[0].where, tasks);
  std::vector<std::string> parts;
  for (const Group& g : groups)
    parts.push_back(fmt::format("{} in {} on {}{}", format_duration(g.seconds), plural(g.sittings, "sitting"), g.where,
                                g.untimed ? fmt::format(" (the time of {} not recorded: stopped by a kill)",
                                                        plural(g.untimed, "sitting"))
                                          : std::string()));
  return fmt::format("- Wall time: {} over {}: {}; {}", format_duration(total), plural(sittings.size(), "sitting"),
                     fmt::join(parts, "; "), tasks);
}

}  // namespace

std::string write_report(const json& all, const std::string& dir) {
  fs::create_directories(dir);
  const json& plan = need(all, "plan", "");
  const json& budget = need(all, "budget", "");
  const json& run = need(all, "run", "");
  const json& proxy = need(all, "proxy", "");
  const json& findings = need(all, "findings", "");
  std::vector<std::string> figs;
  std::string md = fmt::format("# {} study, budget `{}`\n\n{}\n\n", plan.value("name", std::string("?")),
                               budget.value("name", std::string("?")), plan.value("description", std::string()));
  md += "| finding | claim | verdict | why |\n|---|---|---|---|\n";
  for (auto& f : findings) {
    std::string why = f.value("reason", std::string());
    for (auto& c : why)
      if (c == '|') c = '/';
    md += fmt::format("| {}. {} | {} | **{}** | {} |\n", f.value("id", std::string()), f.value("title", std::string()),
                      f.value("claim", std::string()), f.value("verdict", std::string()), why);
  }
  const double tokens = budget.value("tokens_per_run", 0.0);
  const int seeds = all.value("seeds", 0), first_seed = all.value("first_seed", 1);  // studies before --first-seed: 1
  md += fmt::format(
      "\n## How this was made\n\n"
      "- Budget `{}`: {} steps of {} x {} tokens ({:.3g} tokens per run), checkpoint and evaluation every {} steps, "
      "{} seed{}{} per hybrid; data `{}`, tokenizer `{}`; model size `{}`; train flags `{}`.\n"
      "- SWA windows: {}\n",
      budget.value("name", std::string()), budget.value("steps", 0L), budget.value("batch", 0L), budget.value("seq_len", 0L),
      tokens, budget.value("eval_every", 0L), seeds, seeds == 1 ? "" : "s",
      first_seed == 1 ? std::string()
                      : fmt::format(" (seeds {}..{}: a sample of fresh seeds, `--first-seed {}`)", first_seed,
                                    first_seed + seeds - 1, first_seed),
      budget.value("data", std::string()), budget.value("tokenizer", std::string()),
      budget.value("set", json::array()).dump(), budget.value("train", json::array()).dump(),
      plan.value("window_mapping", std::string()));
  if (const json ev = all.value("evaluator", json()); ev.is_object())  // only studies with finding a have one
    md += fmt::format("- LongPPL key tokens are picked by one shared evaluator model for every run: preset `{}`, {} "
                      "steps on the same data.\n", ev.value("preset", std::string("-")), ev.value("steps", 0L));
  if (proxy.value("mix_niah", 0.0) > 0)
    md += fmt::format("- **Miniature proxy.** {:.0f}% of the training rows are NIAH rows (prompt + answer, {} haystack, "
                      "{}-digit values) mixed into the text: {}\n",
                      100 * proxy.value("mix_niah", 0.0), proxy.value("mix_haystack", std::string()),
                      proxy.value("niah_digits", 0), proxy.value("note", std::string()));
  md += wall_time_line(run);
  for (auto& e : run.value("errors", json::array())) md += fmt::format("  - failed: {}\n", e.get<std::string>());
  if (const std::string p = run.value("precision", std::string()); p == "bf16") {  // absent before the option
    // Which bf16 product path ran (absent in studies before it was recorded): AMX and vdpbf16ps round differently.
    std::string product_path;
    bool amx_in_some = false, amx_in_all = true;  // over the sittings that recorded it
    for (const json& sit : run.value("sittings", json::array()))
      if (sit.contains("bf16_amx")) {
        amx_in_some |= sit["bf16_amx"].get<bool>();
        amx_in_all &= sit["bf16_amx"].get<bool>();
      }
    if (amx_in_some && !amx_in_all)
      product_path = " The attention and scan products ran on AMX tiles in some sittings and with `vdpbf16ps` in "
                     "others (the machines above), whose sums round differently: the runs mix the two roundings.";
    else if (run.value("bf16_amx", false))
      product_path = " The attention and scan products ran on AMX tiles (this CPU has AMX-BF16), whose sums round "
                     "differently from `vdpbf16ps`: bf16 runs agree across machines only as closely as their rounding "
                     "does.";
    else if (run.contains("bf16_amx"))
      product_path = " The attention and scan products ran with `vdpbf16ps` (AVX512_BF16), not on AMX tiles.";
    md += fmt::format("- Precision: every training ran with `--precision bf16` (bf16 matmul operands, fp32 "
                      "accumulation, weights and optimizer state; docs/precision.md measures its loss within 1% of "
                      "fp32), so the validation loss it logs is a bf16 forward; LongPPL, NIAH, RULER and the probes "
                      "ran in fp32.{}\n",
                      product_path);
  } else if (!p.empty()) {
    md += fmt::format("- Precision: {} throughout.\n", p);
  }
  const json amendments = plan.value("amendments", json::array());
  if (amendments.empty())
    md += "- The verdict rules and their parameters were written in the plan before the runs (findings.json keeps "
          "them); ";
  else
    md += "- The verdict rules and their parameters are the plan's (findings.json keeps them); the plan was amended "
          "after results had been seen, as it says here:\n";
  for (auto& a : amendments) md += fmt::format("  - **Amended:** {}\n", a.get<std::string>());
  md += std::string(amendments.empty() ? "each" : "- Each") +
        " verdict follows its rule mechanically: **holds**, **does not hold**, or **inconclusive** (the effect is "
        "within the seed spread, too few seeds, or the runs did not learn the skill).\n";
  // Seeds added to a folder that already held a report (reproduce.cpp seed_growth): a reader should know which
  // verdicts had been there to see, since adding seeds until a finding looks decided is a choice the rules do not model.
  const json growths = run.value("seeds_added", json::array());  // named copies: items() of a temporary would dangle
  for (auto& grow : growths) {
    std::vector<std::string> seen;
    const json verdicts = grow.value("report_verdicts", json::object());
    for (auto& [id, v] : verdicts.items())
      seen.push_back(fmt::format("{} {}", id, v.get<std::string>()));
    const std::string finished = grow.value("report_finished", std::string());
    md += fmt::format("- **Seeds added after a report.** The study grew from {} to {} seeds after its {}-seed report{} "
                      "had been written (verdicts: {}). If a verdict seen there is why seeds were added, the verdicts "
                      "here carry that choice (adding seeds until a finding looks decided makes a decision likelier "
                      "than the rules' 95% bounds say): read them beside the earlier ones.\n",
                      grow.value("from", 0), grow.value("to", 0), grow.value("from", 0),
                      finished.empty() ? "" : fmt::format(" (finished {})", finished), fmt::join(seen, "; "));
  }
  md += fmt::format("- Regenerate this page from findings.json alone: `hybridlm reproduce --report-only --out {}`.\n", dir);
  md += "- Hybrids: ";
  bool first = true;
  const json hybrids = all.value("hybrids", json::object());  // a named copy: items() of a temporary would dangle
  for (auto& [h, v] : hybrids.items()) {
    md += fmt::format("{}`{}` = preset `{}`{}", first ? "" : "; ", h, v.value("preset", std::string()),
                      v.value("window", 0L) > 0 ? fmt::format(", window {}", v.value("window", 0L)) : "");
    first = false;
  }
  md += "\n";
  for (auto& f : findings) {
    const std::string id = f.value("id", std::string());
    md += fmt::format("\n## {}. {}\n\n**Claim.** {}\n\n**Metric.** {}\n\n**Rule.** {} ({})\n\n", id,
                      f.value("title", std::string()), f.value("claim", std::string()), f.value("metric", std::string()),
                      f.value("rule_text", std::string()), rule_params(f.value("rule", json::object())));
    if (const long steps = f.value("steps", 0L); steps > 0 && steps != budget.value("steps", 0L))
      md += fmt::format("**Training.** This finding's runs train {} steps ({:.3g} tokens per run), {:g}x the budget's "
                        "{} (the plan's `steps_factor`), in run folders of their own.\n\n",
                        steps, static_cast<double>(steps) * budget.value("batch", 0L) * budget.value("seq_len", 0L),
                        static_cast<double>(steps) / budget.value("steps", 1L), budget.value("steps", 0L));
    if (id == "a") md += report_scaling(all, f, dir, &figs);
    else if (id == "b") md += report_receptive(all, f, dir, &figs);
    else if (id == "c") md += report_laziness(all, f, dir, &figs);
    else if (id == "d") md += report_nope(all, f, dir, &figs);
    md += fmt::format("\n**Verdict: {}.** {}\n", f.value("verdict", std::string()), f.value("reason", std::string()));
  }
  const std::string path = (fs::path(dir) / "report.md").string();
  write_file_atomic(path, md);
  return path;
}

}  // namespace hlm::study
