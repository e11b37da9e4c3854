#include "study/reproduce.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/machine.h"
#include "core/simd_target.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "eval/longppl.h"
#include "eval/scaling.h"
#include "model/config.h"
#include "model/model.h"
#include "ops/bf16_pairs.h"
#include "ops/precision.h"
#include "study/child_process.h"
#include "study/json_file.h"
#include "study/plan.h"
#include "study/report.h"
#include "study/sample_size.h"
#include "study/sweep.h"
#include "study/task_graph.h"
#include "study/verdict.h"
#include "train/checkpoint.h"
#include "train/run_folder.h"

namespace hlm::study {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct StudyRun {
  std::string hybrid;
  int seed = 1;
  PlannedRun planned;
  size_t task = 0;  // its training task
};

// The checkpoint folder of a run at `step` (names as train writes them: checkpoints/step_<digits>).
std::string checkpoint_at(const std::string& run_dir, long step) {
  for (auto& [s, dir] : run_folder::list_checkpoints(run_dir))
    if (s == step) return dir.string();
  fail("{}: no checkpoint at step {}", run_folder::checkpoints(run_dir).string(), step);
}

int cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// What the budget's data holds for the study, read before anything runs (the dataset is prepared here, as the first
// training would): a data or tokenizer problem is refused up front, and LongPPL's cost is known (its ETA weight
// counts the documents it will read, not the budget's upper bound).
struct StudyData {
  std::string dir;
  long vocab = 0, train_tokens = 0;
  int longppl_docs = 0;  // validation documents of at least seq_len tokens that LongPPL reads (at most the budget's)
};

// Everything a study needs, planned: the runs and the tasks that train, evaluate and probe them.
struct Study {
  StudyPlan plan;
  BudgetSpec budget;
  std::vector<std::string> findings;  // selected ids, in order
  int seeds = 1, jobs = 1, threads = 1;
  int first_seed = 1;  // seeds are first_seed .. first_seed + seeds - 1 (--first-seed: a sample of fresh seeds)
  std::string out, precision = "fp32";
  SweepPlan sweep;                     // data, tokenizer and run folders (study/sweep.h runs them)
  StudyData data;
  std::vector<StudyRun> runs;
  std::vector<Task> tasks;
  std::map<std::string, size_t> eval_task;  // output file -> task
  const StudyRun* evaluator = nullptr;

  std::vector<int> seed_list() const {
    std::vector<int> v(static_cast<size_t>(seeds));
    std::iota(v.begin(), v.end(), first_seed);
    return v;
  }
  bool wants(const std::string& id) const { return std::count(findings.begin(), findings.end(), id) > 0; }
  // The steps a finding's runs train (its steps_factor x the budget's).
  long steps_of(const FindingSpec& f) const { return scaled_steps(budget, f.steps_factor); }
  const StudyRun* find(const std::string& hybrid, int seed, long steps) const {
    for (auto& r : runs)
      if (r.hybrid == hybrid && r.seed == seed && r.planned.steps == steps) return &r;
    return nullptr;
  }
  // The run of `hybrid` and `seed` that finding `f` reads (its runs' length).
  const StudyRun& run(const FindingSpec& f, const std::string& hybrid, int seed) const {
    if (const StudyRun* r = find(hybrid, seed, steps_of(f))) return *r;
    fail("internal: no run {} seed {} of {} steps", hybrid, seed, steps_of(f));
  }
  // LongPPL of a run at a checkpoint; the file names the document count, so a plan that changes it re-evaluates.
  std::string longppl_file(const StudyRun& r, long step) const {
    return fmt::format("{}/longppl-docs{}-step{}.json", evals_dir(r), budget.longppl_docs, step);
  }
  std::string evals_dir(const StudyRun& r) const { return run_folder::evals(r.planned.dir).string(); }
};

// A run of hybrid `h` trained for `steps_factor` x the budget's steps; runs longer than the budget's steps (other
// than the evaluator) live in folders named <hybrid>-x<factor>-s<seed>.
void add_run(Study& s, const HybridSpec& h, int seed, bool evaluator, double steps_factor) {
  const BudgetSpec& b = s.budget;
  const long steps = scaled_steps(b, steps_factor);
  if (s.find(h.name, seed, steps)) return;
  StudyRun sr;
  sr.hybrid = h.name;
  sr.seed = seed;
  PlannedRun& r = sr.planned;
  r.name = evaluator              ? "evaluator"
           : steps == b.steps ? fmt::format("{}-s{}", h.name, seed)
                              : fmt::format("{}-x{:g}-s{}", h.name, steps_factor, seed);
  r.arch = h.name;
  r.size = b.name;
  r.steps = steps;
  r.budget = r.steps;
  r.tokens = static_cast<double>(r.steps) * b.tokens_per_step();
  std::vector<std::string> sets = b.sets;
  sets.insert(sets.end(), h.sets.begin(), h.sets.end());
  const long win = s.plan.window_tokens(h, b);
  if (win > 0) sets.push_back(fmt::format("window={}", win));
  r.model_args = {"--preset", h.preset};
  for (auto& x : sets) r.model_args.insert(r.model_args.end(), {"--set", x});
  r.model_config = resolve_config(h.preset, "", sets).to_json();
  r.train_args = {"--seq-len", std::to_string(b.seq_len), "--batch", std::to_string(b.batch), "--seed",
                  std::to_string(seed), "--eval-every", std::to_string(b.eval_every), "--ckpt-every",
                  std::to_string(b.eval_every), "--keep-checkpoints", "0", "--threads", std::to_string(s.threads),
                  "--niah-digits", std::to_string(s.plan.niah_digits)};
  if (!evaluator && s.plan.mix_niah > 0)
    r.train_args.insert(r.train_args.end(), {"--mix-niah", fmt::format("{}", s.plan.mix_niah), "--mix-haystack",
                                             s.plan.mix_haystack});
  r.train_args.insert(r.train_args.end(), b.train_args.begin(), b.train_args.end());
  if (s.precision != "fp32") r.train_args.insert(r.train_args.end(), {"--precision", s.precision});
  r.dir = (fs::path(s.sweep.out) / r.name).string();
  s.runs.push_back(sr);
}

void add_train_tasks(Study& s) {
  for (auto& sr : s.runs) {
    Task t;
    const PlannedRun* r = &sr.planned;
    const SweepPlan* sp = &s.sweep;
    t.label = "train " + r->name;
    t.group = r->name;
    t.is_run = true;
    t.weight = 3.0 * r->tokens;  // forward + backward ~ 3 forwards
    t.log = run_folder::train_log(r->dir).string();
    t.done = [r] {
      const RunOnDisk d = inspect_run(*r);
      return d.finished(r->steps);
    };
    t.before = [r] { prepare_run_folder(*r); };
    t.args = [r, sp] { return train_command(*r, *sp, inspect_run(*r).has_ckpt); };
    t.check = [r]() -> std::string {
      const RunOnDisk d = inspect_run(*r);
      if (d.finished(r->steps)) return "";
      return fmt::format("train exited 0 but the newest checkpoint is at step {}, not {}", d.step, r->steps);
    };
    sr.task = s.tasks.size();
    s.tasks.push_back(std::move(t));
  }
}

// An evaluation task: `hybridlm <args>` whose stdout (--json) is the result file; made once per file.
void add_eval(Study& s, const StudyRun& run, const std::string& label, const std::string& output,
              std::vector<size_t> deps, double weight, std::function<std::vector<std::string>()> args) {
  if (s.eval_task.count(output)) return;
  Task t;
  t.label = label;
  t.group = run.planned.name;
  t.output = output;
  t.log = output.substr(0, output.size() - 5) + ".log";
  t.deps = std::move(deps);
  t.weight = weight;
  t.done = [output] { return fs::exists(output); };
  t.args = std::move(args);
  s.eval_task[output] = s.tasks.size();
  s.tasks.push_back(std::move(t));
}

std::vector<std::string> with_threads(std::vector<std::string> a, int threads) {
  a.insert(a.end(), {"--json", "--threads", std::to_string(threads)});
  return a;
}

long span_tokens(const Study& s) {
  const double f = s.plan.finding("b")->options.at("span_fraction").get<double>();
  return std::max(1L, std::lround(f * static_cast<double>(s.budget.seq_len)));
}

// "1x,2x,4x" from [1, 2, 4]; "a,b" from ["a", "b"].
std::string comma_list(const json& items, const char* suffix = "") {
  std::string a;
  for (auto& x : items) {
    if (!a.empty()) a += ',';
    a += x.is_string() ? x.get<std::string>() : std::to_string(x.get<long>());
    a += suffix;
  }
  return a;
}

void add_eval_tasks(Study& s) {
  const BudgetSpec& b = s.budget;
  const int T = s.threads;
  const double L = static_cast<double>(b.seq_len);
  for (const std::string& id : s.findings) {
    const FindingSpec& f = *s.plan.finding(id);
    for (size_t hi = 0; hi < f.hybrids.size(); ++hi)
      for (int seed : s.seed_list()) {
        const StudyRun& r = s.run(f, f.hybrids[hi], seed);
        const long steps = r.planned.steps;
        const std::string dir = r.planned.dir, ev = s.evals_dir(r);
        if (id == "a") {
          const std::string evaluator = s.evaluator->planned.dir;
          const std::string alpha = fmt::format("{}", f.options.value("longppl_alpha", 2.0));
          const std::string beta = fmt::format("{}", f.options.value("longppl_beta", -2.0));
          for (long step = b.eval_every; step <= steps; step += b.eval_every) {
            const std::string out = s.longppl_file(r, step);
            add_eval(s, r, fmt::format("eval longppl {} step {}", r.planned.name, step), out,
                     {r.task, s.evaluator->task}, 3.0 * s.data.longppl_docs * L * 4, [=, &b] {
                       return with_threads({"eval", "longppl", "--ckpt", checkpoint_at(dir, step), "--evaluator",
                                            evaluator, "--doc-len", std::to_string(b.seq_len), "--docs",
                                            std::to_string(b.longppl_docs), "--trunc-len",
                                            std::to_string(std::max(1L, b.seq_len / 4)), "--block",
                                            std::to_string(std::max(1L, b.seq_len / 8)), "--alpha", alpha, "--beta",
                                            beta},
                                           T);
                     });
          }
        } else if (id == "b") {
          const long span = span_tokens(s);
          add_eval(s, r, "probe receptive-field " + r.planned.name, ev + "/receptive-field.json", {r.task},
                   3.0 * (b.max_eval_tokens + 3.0 * 3 * b.niah_samples * L * 4), [=, &b] {
                     return with_threads({"probe", "receptive-field", "--ckpt", dir, "--restrict", "full;efficient",
                                          "--span", std::to_string(span), "--samples", std::to_string(b.niah_samples),
                                          "--haystack", "noise", "--max-tokens", std::to_string(b.max_eval_tokens)},
                                         T);
                   });
        }
        // c: retrieval heads and NIAH over training; d: the same, to see when each of RoPE and NoPE learns
        // retrieval (one task per run: add_eval keeps the first).
        if (id == "c" || id == "d")
          add_eval(s, r, "probe retrieval-heads " + r.planned.name, ev + "/retrieval-heads.json", {r.task},
                   static_cast<double>(steps / b.eval_every) * 5 * b.niah_samples * L * 6, [=, &b] {
                     return with_threads({"probe", "retrieval-heads", "--over-checkpoints", dir, "--samples",
                                          std::to_string(b.niah_samples), "--haystack", "noise"},
                                         T);
                   });
        if (id == "d") {
          const std::string lengths = comma_list(f.options.at("lengths"), "x");
          double mult = 0;
          for (auto& x : f.options.at("lengths")) mult += x.get<double>();
          add_eval(s, r, "eval niah " + r.planned.name, ev + "/niah-lengths.json", {r.task},
                   3.0 * 3 * b.niah_samples * L * mult * 4, [=, &b] {
                     return with_threads({"eval", "niah", "--ckpt", dir, "--lengths", lengths, "--depths",
                                          "0.1,0.5,0.9", "--samples", std::to_string(b.niah_samples), "--haystack",
                                          "noise"},
                                         T);
                   });
          if (f.options.contains("ruler_tasks") && !f.options["ruler_tasks"].empty()) {
            const std::string tasks = comma_list(f.options["ruler_tasks"]);
            const std::string rl = comma_list(f.options.value("ruler_lengths", f.options.at("lengths")), "x");
            add_eval(s, r, "eval ruler " + r.planned.name, ev + "/ruler.json", {r.task},
                     3.0 * f.options["ruler_tasks"].size() * b.niah_samples * L * mult * 4, [=, &b] {
                       // A task whose fixed text does not fit a length (with the run's tokenizer) is scored there
                       // by the tasks that fit; the report lists what was skipped.
                       return with_threads({"eval", "ruler", "--ckpt", dir, "--lengths", rl, "--tasks", tasks,
                                            "--samples", std::to_string(b.niah_samples), "--skip-too-short"},
                                           T);
                     });
          }
        }
      }
  }
}

// A plan inside the source tree is named relative to it (findings.json is committed; machine paths are not).
std::string shown_path(const std::string& file) {
  const fs::path rel = fs::absolute(file).lexically_normal().lexically_relative(fs::path(HLM_SOURCE_DIR));
  return rel.empty() || *rel.begin() == ".." ? file : rel.string();
}

StudyData study_data(const Study& s) {
  data::PrepareOptions po;
  const data::Dataset ds = data::prepare_dataset(s.sweep.data, s.sweep.tokenizer, "", po);
  StudyData d;
  d.dir = ds.dir;
  d.vocab = ds.vocab_size;
  d.train_tokens = data::TokenShard(ds.train_path, false).n_tokens();
  const data::TokenShard val(ds.val_path, false);
  try {
    d.longppl_docs = static_cast<int>(long_documents(val, s.budget.seq_len, s.budget.longppl_docs).size());
  } catch (const Error&) {
    d.longppl_docs = 0;
  }
  if (d.longppl_docs == 0 && s.wants("a"))
    fail("budget {}: no validation document of {} has seq_len = {} tokens, and finding a's LongPPL reads documents "
         "of the training length ({}); use a corpus with longer documents or a shorter seq_len", s.budget.name,
         val.path(), s.budget.seq_len, s.plan.file);
  return d;
}

// Training tokens/s of a run's model at the budget's shape on this machine, with the study's threads, precision and
// data's vocabulary: the median of 3 steps of a child `hybridlm bench` (after one warm-up step).
double measured_tokens_per_s(const Study& s, const StudyRun& r) {
  std::vector<std::string> args = {"bench"};
  args.insert(args.end(), r.planned.model_args.begin(), r.planned.model_args.end());
  args.insert(args.end(), {"--set", fmt::format("vocab_size={}", s.data.vocab), "--seq-len",
                           std::to_string(s.budget.seq_len), "--batch", std::to_string(s.budget.batch), "--steps", "3",
                           "--warmup", "1", "--threads", std::to_string(s.threads), "--precision", s.precision,
                           "--json"});
  const fs::path tmp = fs::temp_directory_path() / fmt::format("hlm-reproduce-bench-{}", getpid());
  const std::string log = tmp.string() + ".log", result = tmp.string() + ".json";
  const int rc = run_child(self_exe(), args, log, result);
  double rate = NAN;
  std::string why;
  if (rc == 0) {
    try {
      rate = read_json_file(result).at("train_tokens_per_s").get<double>();
    } catch (const std::exception& e) {
      why = e.what();
    }
  } else {
    why = last_error(log);
  }
  fs::remove(log);
  fs::remove(result);
  if (!std::isfinite(rate) || rate <= 0)
    fail("reproduce --dry-run --measure: `hybridlm {}` failed: {}", shell_join(args), why);
  return rate;
}

// Wall time of trainings taking `seconds` each when `slots` children take them in this order, each the next free
// child (as the task graph starts them); a run alone is not divided among children.
double list_scheduled_seconds(const std::vector<double>& seconds, int slots) {
  std::vector<double> busy(static_cast<size_t>(std::max(1, slots)), 0.0);
  for (double x : seconds) *std::min_element(busy.begin(), busy.end()) += x;
  return *std::max_element(busy.begin(), busy.end());
}

// --dry-run: the runs and tasks the study would run, with their size, and what is already on disk; with `measure`,
// each model's training rate here and the training time it gives.
json dry_run_summary(const Study& s, bool measure) {
  json runs = json::array();
  double tokens = 0, flops = 0;
  std::vector<double> train_seconds;  // what is left of each run's training
  std::map<std::string, double> rates;  // model arguments -> tokens/s
  for (auto& r : s.runs) {
    const HybridSpec& h = r.planned.name == "evaluator" ? s.plan.evaluator : s.plan.hybrid(r.hybrid);
    ModelConfig cfg = ModelConfig::from_json(r.planned.model_config, r.planned.name);  // with the run's window
    cfg.vocab_size = s.data.vocab;  // as train sets it from the tokenizer
    const Model m(cfg);
    const double f = m.flops(s.budget.seq_len).train_per_token * r.planned.tokens;
    // Text rows: the evaluator trains on text only, the others on the proxy's mix.
    const double text = r.planned.name == "evaluator" ? 1.0 : 1.0 - s.plan.mix_niah;
    const RunOnDisk d = inspect_run(r.planned);
    runs.push_back({{"name", r.planned.name}, {"preset", h.preset}, {"window", s.plan.window_tokens(h, s.budget)},
                    {"seed", r.seed}, {"steps", r.planned.steps}, {"tokens", r.planned.tokens},
                    {"params", m.num_params()}, {"train_flops", f},
                    {"text_passes", r.planned.tokens * text / static_cast<double>(s.data.train_tokens)},
                    {"on_disk", d.finished(r.planned.steps) ? "done"
                                : d.has_ckpt                            ? fmt::format("step {}", d.step)
                                                                        : "new"}});
    if (measure) {
      const std::string key = shell_join(r.planned.model_args);
      if (!rates.count(key)) rates[key] = measured_tokens_per_s(s, r);
      runs.back()["tokens_per_s"] = rates[key];
      runs.back()["train_seconds"] = r.planned.tokens / rates[key];
      const double left = d.has_ckpt ? 1.0 - static_cast<double>(d.step) / static_cast<double>(r.planned.steps) : 1.0;
      if (left > 0) train_seconds.push_back(r.planned.tokens * left / rates[key]);
    }
    tokens += r.planned.tokens;
    flops += f;
  }
  json kinds = json::object();  // "train", "eval longppl", "probe retrieval-heads", ...: [tasks, done]
  for (auto& t : s.tasks) {
    const std::string kind = t.is_run ? "train" : t.label.substr(0, t.label.find(' ', t.label.find(' ') + 1));
    if (!kinds.contains(kind)) kinds[kind] = {0, 0};
    kinds[kind][0] = kinds[kind][0].get<int>() + 1;
    if (t.done()) kinds[kind][1] = kinds[kind][1].get<int>() + 1;
  }
  const BudgetSpec& b = s.budget;
  const double train_left = std::accumulate(train_seconds.begin(), train_seconds.end(), 0.0);
  return {{"plan", shown_path(s.plan.file)}, {"name", s.plan.name}, {"budget", b.name}, {"findings", s.findings},
          {"seeds", s.seeds}, {"first_seed", s.first_seed}, {"precision", s.precision}, {"jobs", s.jobs},
          {"threads", s.threads}, {"out", s.out},
          {"data", {{"spec", b.data}, {"tokenizer", b.tokenizer}, {"dir", s.data.dir}, {"vocab", s.data.vocab},
                    {"train_tokens", s.data.train_tokens}, {"longppl_docs", s.data.longppl_docs},
                    {"longppl_docs_asked", b.longppl_docs}, {"doc_len", b.seq_len}}},
          {"runs", runs}, {"tasks", kinds},
          {"total", {{"runs", s.runs.size()}, {"tasks", s.tasks.size()}, {"tokens", tokens}, {"train_flops", flops}}},
          {"measured", measure ? json{{"train_seconds_left", train_left},
                                      {"wall_seconds_left", list_scheduled_seconds(train_seconds, s.jobs)},
                                      {"cpu", cpu_model_name()},
                                      {"simd", simd_target()}}
                               : json()}};
}

// ---- reading the results back ---------------------------------------------------------------------

json maybe_json(const std::string& path) { return fs::exists(path) ? read_json_file(path) : json(); }

// A run counts only when its training finished (a failed run may have left an evaluation row behind).
bool trained(const StudyRun& r) {
  const RunOnDisk d = inspect_run(r.planned);
  return d.finished(r.planned.steps);
}

// Final val loss of a finished run, NaN otherwise.
double final_val_loss(const StudyRun& r) {
  if (!trained(r)) return NAN;
  try {
    return scaling::read_run(r.planned.dir, "val_loss").points.back().value;
  } catch (const Error&) {
    return NAN;
  }
}

double num_or_nan(const json& j) { return j.is_number() ? j.get<double>() : NAN; }

json collect_scaling(const Study& s, const FindingSpec& f) {
  const BudgetSpec& b = s.budget;
  ScalingInput in;
  json curves = json::object(), fits = json::object();
  double largest = -1;
  long key_tokens = 0, longppl_files = 0;
  for (auto& h : f.hybrids) {
    const HybridSpec& hs = s.plan.hybrid(h);
    if (!hs.window.empty() && s.plan.windows.at(hs.window) > largest) {
      largest = s.plan.windows.at(hs.window);
      in.largest_window = h;
    }
    in.hybrids.push_back(h);
    in.seeds.emplace_back();
    json per_seed = json::array();
    std::vector<double> C, loss, Cl, lp;
    for (int seed : s.seed_list()) {
      const StudyRun& r = s.run(f, h, seed);
      json pts = json::array();
      ScalingSeedPoint sp;
      std::map<long, std::pair<double, double>> row;  // step -> (flops, val_loss)
      try {
        if (trained(r))
          for (auto& p : scaling::read_run(r.planned.dir, "val_loss").points) row[p.step] = {p.flops, p.value};
      } catch (const Error&) {
      }
      for (long step = b.eval_every; step <= r.planned.steps; step += b.eval_every) {
        const json lpj = maybe_json(s.longppl_file(r, step));
        const double llp = lpj.is_object() ? num_or_nan(lpj.value("log_longppl", json())) : NAN;
        if (lpj.is_object()) key_tokens += lpj.value("key_tokens", 0L), longppl_files += 1;
        const auto it = row.find(step);
        const double flops = it == row.end() ? NAN : it->second.first, vl = it == row.end() ? NAN : it->second.second;
        pts.push_back({{"step", step}, {"flops", flops}, {"val_loss", vl}, {"log_longppl", std::isfinite(llp) ? json(llp) : json()}});
        if (step == b.eval_every) sp.early_log_longppl = llp;
        if (step == r.planned.steps) sp.final_log_longppl = llp, sp.final_val_loss = vl;
        if (std::isfinite(flops) && std::isfinite(vl)) C.push_back(flops), loss.push_back(vl);
        if (std::isfinite(flops) && std::isfinite(llp)) Cl.push_back(flops), lp.push_back(llp);
      }
      in.seeds.back().push_back(sp);
      per_seed.push_back(pts);
    }
    curves[h] = per_seed;
    // Fits over the seeds' pooled points, on the lower frontier (the `scaling fit` default).
    auto fit = [](const std::vector<double>& c, const std::vector<double>& y, bool log_lp) -> json {
      std::vector<double> fc, fy;
      for (size_t i : scaling::lower_frontier(c, y)) fc.push_back(c[i]), fy.push_back(y[i]);
      if (std::set<double>(fc.begin(), fc.end()).size() < 3)
        return {{"skipped", fmt::format("{} frontier points, need 3", fc.size())}};
      scaling::FitOptions o;
      o.grid = scaling::Grid::kSmall;
      try {
        auto p = log_lp ? scaling::fit_log_longppl(fc, fy, o) : scaling::fit_power_law(fc, fy, o);
        return {{"E", p.E}, {"A", p.A}, {"alpha", p.alpha}, {"n_points", p.n_points}};
      } catch (const Error& e) {
        return {{"skipped", e.what()}};
      }
    };
    fits[h] = {{"val_loss", fit(C, loss, false)}, {"log_longppl", fit(Cl, lp, true)}};
  }
  json details = json::object();
  VerdictResult v = verdict_scaling(in, f.rule, &details);
  details["longppl_evaluations"] = longppl_files;
  details["longppl_key_tokens"] = key_tokens;
  if (longppl_files > 0 && key_tokens == 0)
    v.reason = fmt::format("the shared evaluator found no key tokens (LSD > {}, LCL > {}) in any of {} LongPPL "
                           "evaluations: no LongPPL to compare; ", f.options.value("longppl_alpha", 2.0),
                           f.options.value("longppl_beta", -2.0), longppl_files) + v.reason;
  return {{"verdict", verdict_name(v.verdict)}, {"reason", v.reason}, {"details", details},
          {"data", {{"curves", curves}, {"fits", fits}}}};
}

json collect_receptive(const Study& s, const FindingSpec& f) {
  ReceptiveInput in;
  json table = json::object();
  for (auto& h : f.hybrids) {
    in.hybrids.push_back(h);
    in.seeds.emplace_back();
    json seeds = json::array();
    for (int seed : s.seed_list()) {
      const json j = maybe_json(s.evals_dir(s.run(f, h, seed)) + "/receptive-field.json");
      ReceptiveSeed rs;
      json row = json::object();
      if (j.is_object())
        for (auto& x : j["rows"]) {
          const std::string which = x["restrict"];
          const double niah = num_or_nan(x["niah_accuracy"]);
          (which == "none" ? rs.base : which == "full" ? rs.full_capped : rs.efficient_capped) = niah;
          row[which] = {{"niah", niah}, {"loss", x["loss"]}, {"delta_loss", x["delta_loss"]}};
        }
      in.seeds.back().push_back(rs);
      seeds.push_back(row);
    }
    table[h] = seeds;
  }
  json details = json::object();
  VerdictResult v = verdict_receptive_field(in, f.rule, &details);
  return {{"verdict", verdict_name(v.verdict)}, {"reason", v.reason}, {"details", details},
          {"data", {{"span", span_tokens(s)}, {"per_seed", table}}}};
}

// NIAH (at the training length) and full-layer retrieval heads at every checkpoint of a run, from its
// retrieval-heads probe; null when the probe has not run.
json over_training(const Study& s, const StudyRun& r) {
  const json j = maybe_json(s.evals_dir(r) + "/retrieval-heads.json");
  if (!j.is_object()) return nullptr;
  json pts = json::array();
  for (auto& c : j["checkpoints"])
    pts.push_back({{"step", c["step"]}, {"niah", c["niah_accuracy"]}, {"heads_full", c["n_retrieval_heads_full"]},
                   {"heads_all", c["n_retrieval_heads"]}});
  return pts;
}

json collect_laziness(const Study& s, const FindingSpec& f) {
  LazinessInput in;
  in.steps = s.steps_of(f);
  in.eval_every = s.budget.eval_every;
  const int heads_min = static_cast<int>(f.rule.at("heads_min").get<double>());
  std::vector<std::string> order = f.hybrids;  // smallest window first
  std::stable_sort(order.begin(), order.end(), [&](auto& a, auto& b) {
    return s.plan.windows.at(s.plan.hybrid(a).window) < s.plan.windows.at(s.plan.hybrid(b).window);
  });
  json curves = json::object();
  for (auto& h : order) {
    in.hybrids.push_back(h);
    in.onset.emplace_back();
    json seeds = json::array();
    for (int seed : s.seed_list()) {
      const json pts = over_training(s, s.run(f, h, seed));
      double onset = NAN;
      if (pts.is_array())
        for (auto& p : pts)
          if (p["heads_full"].get<int>() >= heads_min) {
            onset = static_cast<double>(p["step"].get<long>());
            break;
          }
      in.onset.back().push_back(onset);
      seeds.push_back(pts.is_array() ? pts : json::array());
    }
    curves[h] = seeds;
  }
  json details = json::object();
  VerdictResult v = verdict_laziness(in, f.rule, &details);
  return {{"verdict", verdict_name(v.verdict)}, {"reason", v.reason}, {"details", details},
          {"data", {{"order", order}, {"curves", curves}}}};
}

json collect_nope(const Study& s, const FindingSpec& f) {
  std::vector<NopeSeed> seeds;
  const double learned_min = f.rule.at("learned_min").get<double>();
  json by_length = json::object();
  std::set<std::string> ruler_skipped;  // RULER cells too short for their task (the same for every run)
  for (int seed : s.seed_list()) {
    NopeSeed ns;
    for (size_t k = 0; k < 2; ++k) {
      const StudyRun& r = s.run(f, f.hybrids[k], seed);
      const json niah = maybe_json(s.evals_dir(r) + "/niah-lengths.json");
      const json ruler = maybe_json(s.evals_dir(r) + "/ruler.json");
      double score = NAN, loss = NAN;
      json lens = json::array();
      if (niah.is_object()) {
        // accuracy[depth][length] -> per length mean over depths
        const auto& acc = niah["accuracy"];
        double sum = 0;
        int n = 0;
        for (size_t l = 0; l < niah["lengths"].size(); ++l) {
          double m = 0;
          for (auto& row : acc) m += row[l].get<double>();
          m /= static_cast<double>(acc.size());
          lens.push_back({{"length", niah["lengths"][l]}, {"niah", m}});
          sum += m;
          ++n;
        }
        score = sum / n;
        double rs = 0;
        int rn = 0;  // lengths at which some RULER task fits
        if (ruler.is_object())
          for (auto& x : ruler["average"])
            if (!x.is_null()) rs += x.get<double>() / 100.0, ++rn;
        if (rn > 0) score = 0.5 * (score + rs / rn);
        if (ruler.is_object())
          for (auto& sk : ruler.value("skipped", json::array())) ruler_skipped.insert(sk["reason"].get<std::string>());
      }
      loss = final_val_loss(r);
      (k == 0 ? ns.rope_score : ns.nope_score) = score;
      (k == 0 ? ns.rope_loss : ns.nope_loss) = loss;
      if (!by_length.contains(f.hybrids[k])) by_length[f.hybrids[k]] = json::array();
      json row = {{"lengths", lens}, {"ruler", ruler.is_object() ? ruler["average"] : json()},
                  {"score", std::isfinite(score) ? json(score) : json()},
                  {"val_loss", std::isfinite(loss) ? json(loss) : json()}};
      // When the run learned retrieval: the first checkpoint whose NIAH reaches learned_min (beside the verdict).
      if (const json pts = over_training(s, r); pts.is_array()) {
        json learned_at = "never";
        for (auto& p : pts)
          if (p["niah"].is_number() && p["niah"].get<double>() >= learned_min) {
            learned_at = p["step"];
            break;
          }
        row["over_training"] = pts;
        row["learned_at"] = learned_at;
      }
      by_length[f.hybrids[k]].push_back(row);
    }
    seeds.push_back(ns);
  }
  json details = json::object();
  VerdictResult v = verdict_nope(seeds, f.rule, &details);
  return {{"verdict", verdict_name(v.verdict)}, {"reason", v.reason}, {"details", details},
          {"data", {{"rope", f.hybrids[0]}, {"nope", f.hybrids[1]}, {"per_seed", by_length},
                    {"ruler_skipped", ruler_skipped}}}};
}

// How this folder's study grew its seeds after a report had been written there, oldest first. A run with more seeds
// than the findings.json it will replace keeps that report's seed count, finish time and verdicts, since a verdict
// seen before seeds are added may be why they were added (the report then says so); earlier entries carry over.
json seed_growth(const fs::path& findings_file, int seeds) {
  if (!fs::exists(findings_file)) return json::array();
  const json before = read_json_file(findings_file.string(), "the study's last findings");
  const json run = before.value("run", json::object());
  json growth = run.value("seeds_added", json::array());
  const json had = before.value("seeds", json());
  if (had.is_number_integer() && had.get<int>() >= 1 && seeds > had.get<int>()) {
    json verdicts = json::object();
    for (auto& f : before.value("findings", json::array()))
      verdicts[f.value("id", std::string("?"))] = f.value("verdict", std::string());
    growth.push_back({{"from", had}, {"to", seeds}, {"report_finished", run.value("finished", std::string())},
                      {"report_verdicts", verdicts}});
  }
  return growth;
}

// One sitting of the study (a start of `reproduce` that runs tasks; the next resumes where it stopped): when and where
// it ran, with which job layout; its seconds and tasks are filled in when it ends. The report lists the machines.
json this_sitting(const Study& s, int ranks) {
  return {{"started", now_iso()}, {"cpu", cpu_model_name()}, {"cores", cores()}, {"simd", simd_target()},
          {"bf16_amx", s.precision == "bf16" && ops::bf16_pairs::amx_active()}, {"jobs", s.jobs},
          {"threads_per_job", s.threads}, {"ranks", ranks}, {"seconds", nullptr}, {"tasks_done", nullptr}};
}

// The sittings a study.json records; a folder from before they were recorded has only its total time, kept as one
// sitting on a machine not recorded.
json recorded_sittings(const json& study_state, const std::string& file) {
  if (study_state.contains("sittings")) {
    if (!study_state["sittings"].is_array())
      fail("{}: field 'sittings' must be an array, got {}", file, study_state["sittings"].dump());
    return study_state["sittings"];
  }
  const double before = study_state.value("wall_seconds", 0.0);
  return before > 0 ? json::array({{{"seconds", before}}}) : json::array();
}

json collect(const Study& s, const GraphOutcome& g, const json& study_state, const json& seeds_added) {
  json hybrids = json::object();
  for (auto& r : s.runs)
    if (!hybrids.contains(r.hybrid)) {
      const HybridSpec& h = s.plan.hybrid(r.hybrid);
      hybrids[r.hybrid] = {{"preset", h.preset}, {"label", h.label}, {"window", s.plan.window_tokens(h, s.budget)},
                           {"set", h.sets}};
    }
  json findings = json::array();
  for (auto& id : s.findings) {
    const FindingSpec& f = *s.plan.finding(id);
    json r = id == "a" ? collect_scaling(s, f) : id == "b" ? collect_receptive(s, f) : id == "c" ? collect_laziness(s, f)
                                                                                   : collect_nope(s, f);
    r["id"] = id;
    r["title"] = f.title;
    r["claim"] = f.claim;
    r["metric"] = f.metric;
    r["rule_text"] = f.rule_text;
    r["rule"] = f.rule;
    r["hybrids"] = f.hybrids;
    r["steps"] = s.steps_of(f);
    findings.push_back(r);
  }
  const BudgetSpec& b = s.budget;
  return {{"version", 1},
          {"plan", {{"file", shown_path(s.plan.file)}, {"name", s.plan.name}, {"description", s.plan.description},
                    {"window_mapping", s.plan.window_mapping}, {"windows", s.plan.windows},
                    {"amendments", s.plan.amendments}}},
          {"budget", {{"name", b.name}, {"seq_len", b.seq_len}, {"batch", b.batch}, {"steps", b.steps},
                      {"eval_every", b.eval_every}, {"tokens_per_run", static_cast<double>(b.steps) * b.tokens_per_step()},
                      {"data", b.data}, {"tokenizer", b.tokenizer}, {"set", b.sets}, {"train", b.train_args},
                      {"niah_samples", b.niah_samples}, {"longppl_docs", b.longppl_docs}}},
          {"seeds", s.seeds}, {"first_seed", s.first_seed},
          {"proxy", {{"mix_niah", s.plan.mix_niah}, {"mix_haystack", s.plan.mix_haystack},
                     {"niah_digits", s.plan.niah_digits}, {"note", s.plan.proxy_note}}},
          {"evaluator", s.evaluator ? json{{"preset", s.plan.evaluator.preset}, {"steps", s.evaluator->planned.steps},
                                           {"dir", fs::relative(s.evaluator->planned.dir, s.out).string()}}  // relative: the folder moves
                                    : json()},
          {"hybrids", hybrids},
          {"run", {{"finished", now_iso()}, {"wall_seconds", study_state["wall_seconds"]},
                   {"sittings", study_state["sittings"]}, {"jobs", s.jobs},
                   {"threads_per_job", s.threads}, {"cores", cores()}, {"cpu", cpu_model_name()},
                   {"precision", s.precision},
                   // bf16 rounds differently on AMX tiles (ops/bf16_amx.cpp) than with vdpbf16ps: say which ran
                   {"bf16_amx", s.precision == "bf16" && ops::bf16_pairs::amx_active()},
                   {"simd", simd_target()}, {"seeds_added", seeds_added}, {"tasks", s.tasks.size()},
                   {"tasks_failed", g.failed}, {"tasks_skipped", g.skipped}, {"errors", g.errors}}},
          {"findings", findings}};
}

}  // namespace

ReproduceOutcome run_reproduce(const ReproduceOptions& o, const TrainOptionKind& train_option) {
  ReproduceOutcome res;
  if (o.out.empty()) fail("reproduce needs --out DIR");
  if (o.dry_run && o.ranks > 1) fail("reproduce --dry-run: run it as one process, not under an MPI launcher");
  const fs::path out = o.out;
  if (o.sample_size) {
    std::vector<std::string> paths{(out / "findings.json").string()};
    for (auto& p : o.pilots) paths.push_back((fs::path(p) / "findings.json").string());
    std::vector<json> files;
    for (auto& p : paths) {
      if (!fs::exists(p)) fail("--sample-size: {} does not exist (a study folder's findings.json)", p);
      files.push_back(read_json_file(p));
      if (!files.back().contains("findings") || !files.back()["findings"].is_array())
        fail("--sample-size: {}: field 'findings' is missing or not a list", p);
    }
    if (!o.only.empty()) {  // the findings asked for, in DIR's order
      json& fs = files.front()["findings"];
      fs.erase(std::remove_if(fs.begin(), fs.end(), [&](const json& f) {
                 return std::find(o.only.begin(), o.only.end(), f.value("id", "")) == o.only.end();
               }), fs.end());
    }
    res.sample_size = sample_size(files.front(), std::vector<json>(files.begin() + 1, files.end()), paths);
    return res;
  }
  if (o.report_only) {
    if (o.rank > 0) return res;  // rank 0 writes it
    const std::string fj = (out / "findings.json").string();
    if (!fs::exists(fj)) fail("--report-only: {} does not exist (run the study first)", fj);
    res.report = write_report(read_json_file(fj), o.out);
    res.findings = fj;
    return res;
  }
  Study s;
  s.plan = load_study_plan(o.plan.empty() ? default_plan_path() : o.plan, train_option);
  if (!s.plan.budgets.count(o.budget)) {
    std::string list;
    for (auto& [k, v] : s.plan.budgets) list += (list.empty() ? "" : ", ") + k;
    fail("--budget {}: the plan {} has no such budget (it has: {})", o.budget, s.plan.file, list);
  }
  s.budget = s.plan.budgets.at(o.budget);
  for (auto& id : o.only) {
    if (!s.plan.finding(id)) fail("--only {}: the plan {} has no finding '{}' (findings: a, b, c, d)", id, s.plan.file, id);
    if (!s.wants(id)) s.findings.push_back(id);
  }
  if (s.findings.empty())
    for (auto& f : s.plan.findings) s.findings.push_back(f.id);
  std::sort(s.findings.begin(), s.findings.end());
  if (o.seeds < 0) fail("--seeds must be >= 1, got {}", o.seeds);
  if (o.jobs < 0) fail("--jobs must be >= 1, got {}", o.jobs);
  if (o.first_seed < 0 || o.first_seed > 1000000000)
    fail("--first-seed must be a whole number from 1 to 1000000000, got {}", o.first_seed);
  s.seeds = o.seeds > 0 ? o.seeds : s.budget.seeds;
  s.first_seed = o.first_seed > 0 ? o.first_seed : 1;
  if (o.ranks > 1 && !o.barrier) fail("reproduce across {} ranks needs a barrier", o.ranks);
  const int cpus = o.cores > 0 ? o.cores : cores();
  s.jobs = o.jobs > 0 ? o.jobs : cpus;
  s.threads = std::max(1, cpus / s.jobs);
  s.out = o.out;
  s.precision = o.precision;
  // Refused before anything runs where the CPU cannot (train would refuse each run later).
  ops::require_supported(ops::parse_precision(s.precision, "--precision"));

  s.sweep.file = s.plan.file;
  s.sweep.out = (out / "runs").string();
  s.sweep.data = s.budget.data;
  s.sweep.tokenizer = s.budget.tokenizer;
  s.sweep.tokens_per_step = s.budget.tokens_per_step();

  // The folder belongs to one study: a rerun must ask for the same plan, budget, precision and first seed. Seeds may
  // grow (--seeds 5 over a 3-seed study trains seeds 4 and 5 and keeps the rest); without --seeds or --first-seed a
  // rerun keeps the folder's. A dry run checks the same and writes nothing.
  if (!o.dry_run) fs::create_directories(out);
  const std::string study_json = (out / "study.json").string();
  json st = {{"plan", fs::absolute(s.plan.file).lexically_normal().string()}, {"budget", s.budget.name},
             {"seeds", s.seeds}, {"first_seed", s.first_seed}, {"precision", s.precision}, {"wall_seconds", 0.0},
             {"sittings", json::array()}};
  if (fs::exists(study_json)) {
    json have = read_json_file(study_json);
    if (!have.contains("precision")) have["precision"] = "fp32";  // folders from before these options
    if (!have.contains("first_seed")) have["first_seed"] = 1;
    if (o.first_seed == 0 && have["first_seed"].is_number_integer()) s.first_seed = have["first_seed"].get<int>();
    st["first_seed"] = s.first_seed;
    for (const char* k : {"plan", "budget", "precision", "first_seed"})
      if (have.value(k, json()) != st[k])
        fail("{}: field '{}' is {} but this run asks for {}; use another --out or the same options", study_json, k,
             have.value(k, json()).dump(), st[k].dump());
    const json had = have.value("seeds", json());
    if (!had.is_number_integer() || had.get<int>() < 1)
      fail("{}: field 'seeds' must be a whole number >= 1, got {}", study_json, had.dump());
    if (o.seeds == 0) s.seeds = had.get<int>();
    if (s.seeds < had.get<int>())
      fail("{}: field 'seeds' is {} but this run asks for {}; a study can add seeds (--seeds {} or more) but not "
           "drop them: use another --out", study_json, had.get<int>(), s.seeds, had.get<int>());
    if (s.seeds > had.get<int>() && !o.quiet && !o.dry_run)
      fmt::print(stderr, "reproduce: {} holds {} seed{}; adding seed{} {}..{}\n", o.out, had.get<int>(),
                 had.get<int>() == 1 ? "" : "s", s.seeds - had.get<int>() == 1 ? "" : "s",
                 s.first_seed + had.get<int>(), s.first_seed + s.seeds - 1);
    st["seeds"] = s.seeds;
    st["wall_seconds"] = have.value("wall_seconds", 0.0);
    st["sittings"] = recorded_sittings(have, study_json);
  }
  // Read before any task runs: the findings.json there now is the report a reader may have seen.
  const json seeds_added = o.dry_run || o.rank > 0 ? json::array() : seed_growth(out / "findings.json", s.seeds);
  const std::string markers = (out / ".rank-markers").string();  // tasks that failed on some rank
  // Rank 0 prepares the data (the others then find it cached).
  if (o.rank == 0) s.data = study_data(s);
  if (o.rank == 0 && !o.dry_run) {
    write_file_atomic(study_json, st.dump(2) + "\n");
    fs::remove_all(markers);
    if (o.ranks > 1) fs::create_directories(markers);
  }
  if (o.ranks > 1) o.barrier();
  if (o.rank > 0) s.data = study_data(s);

  size_t most_runs = 1;
  for (auto& id : s.findings) most_runs += s.plan.finding(id)->hybrids.size() * static_cast<size_t>(s.seeds);
  s.runs.reserve(most_runs);  // tasks keep pointers into it
  // The evaluator is an instrument, the same for every sample of seeds: always seed 1.
  if (s.wants("a")) add_run(s, s.plan.evaluator, 1, true, s.plan.evaluator_steps_factor);
  for (auto& id : s.findings) {
    const FindingSpec& f = *s.plan.finding(id);
    for (auto& h : f.hybrids)
      for (int seed : s.seed_list()) add_run(s, s.plan.hybrid(h), seed, false, f.steps_factor);
  }
  if (s.wants("a")) s.evaluator = &s.runs.front();
  for (auto& r : s.runs) inspect_run(r.planned);  // a folder holding another model is refused before anything runs
  add_train_tasks(s);
  add_eval_tasks(s);
  if (o.dry_run) {
    res.dry_run = dry_run_summary(s, o.measure);
    return res;
  }
  std::set<long> run_steps;
  for (auto& r : s.runs) run_steps.insert(r.planned.steps);

  if (!o.quiet)
    fmt::print(stderr, "reproduce: plan {} ({}), budget {}: findings {}, {} runs of {} steps x {} tokens, {} seed{}{}, "
               "{} tasks, {} at a time x {} thread{}; into {}\n", s.plan.file, s.plan.name, s.budget.name,
               fmt::join(s.findings, ","), s.runs.size(), fmt::join(run_steps, " or "), s.budget.batch * s.budget.seq_len,
               s.seeds, s.seeds == 1 ? "" : "s",
               s.first_seed == 1 ? "" : fmt::format(" ({}..{})", s.first_seed, s.first_seed + s.seeds - 1),
               s.tasks.size(), s.jobs, s.threads, s.threads == 1 ? "" : "s", o.out);
  if (o.rank == 0) {  // recorded before it starts, so that a sitting stopped by a kill still names its machine
    st["sittings"].push_back(this_sitting(s, o.ranks));
    write_file_atomic(study_json, st.dump(2) + "\n");
  }
  GraphOutcome g = run_task_graph(self_exe(), s.tasks, s.jobs, o.quiet, {o.rank, o.ranks, markers});
  if (!g.interrupted && o.ranks > 1) o.barrier();  // every rank's tasks have ended
  if (o.rank > 0) {
    res.exit_code = g.interrupted ? 130 : 0;  // rank 0 reports every failure
    return res;
  }
  fs::remove_all(markers);
  st["wall_seconds"] = st["wall_seconds"].get<double>() + g.seconds;
  json& sitting = st["sittings"].back();
  sitting["seconds"] = g.seconds;
  sitting["tasks_done"] = g.done - g.done_before;
  sitting["interrupted"] = g.interrupted;
  write_file_atomic(study_json, st.dump(2) + "\n");
  if (g.interrupted) {
    if (!o.quiet) fmt::print(stderr, "reproduce: interrupted; run the same command again to continue\n");
    res.exit_code = 130;
    return res;
  }
  const json findings = collect(s, g, st, seeds_added);
  res.findings = (out / "findings.json").string();
  write_file_atomic(res.findings, findings.dump(1) + "\n");
  res.report = write_report(findings, o.out);
  res.exit_code = g.failed + g.skipped > 0 ? 1 : 0;
  if (!o.quiet && res.exit_code)
    for (auto& e : g.errors) fmt::print(stderr, "reproduce: FAILED {}\n", e);
  return res;
}

}  // namespace hlm::study
