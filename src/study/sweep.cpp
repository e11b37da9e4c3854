#include "study/sweep.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/timer.h"
#include "eval/scaling.h"
#include "model/config.h"
#include "study/child_process.h"
#include "study/json_file.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train/run_folder.h"

namespace hlm::study {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::set<std::string> kPlanKeys = {"out", "data", "tokenizer", "archs", "sizes", "budgets", "budget_unit",
                                         "train", "description"};
// Train flags the sweep sets itself.
const std::set<std::string> kReservedTrainKeys = {"steps", "out", "resume", "preset", "config", "set",
                                                  "data", "tokenizer", "json", "help"};

bool safe_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

std::string budget_label(long b, const std::string& unit) {
  if (unit == "steps") return std::to_string(b);
  if (b % 1000000000 == 0) return std::to_string(b / 1000000000) + "Gtok";
  if (b % 1000000 == 0) return std::to_string(b / 1000000) + "Mtok";
  if (b % 1000 == 0) return std::to_string(b / 1000) + "ktok";
  return std::to_string(b) + "tok";
}

// A JSON number that is a whole positive count (100 or 1e6, not 2.5 or -1).
bool whole_positive(const json& v, long* out) {
  if (!v.is_number()) return false;
  const double d = v.get<double>();
  if (!(d >= 1) || d != std::floor(d) || d > 9e15) return false;
  *out = static_cast<long>(d);
  return true;
}

std::vector<std::string> string_list(const json& v, const std::string& file, const std::string& field) {
  if (!v.is_array()) fail("{}: field '{}' must be an array of \"key=value\" strings", file, field);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get<std::string>().find('=') == std::string::npos)
      fail("{}: field '{}[{}]' must be a \"key=value\" string", file, field, i);
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::string set_key(const std::string& s) { return s.substr(0, s.find('=')); }

}  // namespace

namespace {

// The plan's train flags, checked against the real `train` subcommand, as arguments; batch, seq_len and
// grad_accum (the defaults of TrainConfig unless given) give the tokens per step.
std::vector<std::string> read_sweep_train_flags(const std::string& file, const json& j,
                                                const TrainOptionKind& train_option, double& tokens_per_step) {
  std::vector<std::string> train_args;
  TrainConfig tdef;
  double batch = static_cast<double>(tdef.batch), seq_len = static_cast<double>(tdef.seq_len), accum = tdef.grad_accum;
  if (j.contains("train")) {
    const json& t = j["train"];
    if (!t.is_object()) fail("{}: field 'train' must be an object of train flags (e.g. {{\"batch\": 8}})", file);
    for (auto& [k, v] : t.items()) {
      std::string flag = k;
      std::replace(flag.begin(), flag.end(), '_', '-');
      const std::string field = "train." + k;
      if (kReservedTrainKeys.count(flag))
        fail("{}: field '{}' is set by the sweep (budgets give --steps; out/data/tokenizer are plan fields; "
             "archs/sizes give the model)", file, field);
      const int kind = train_option("--" + flag);
      if (kind < 0) fail("{}: field '{}': `hybridlm train` has no option --{}", file, field, flag);
      const bool is_flag = kind == 0;
      if (is_flag) {
        if (!v.is_boolean()) fail("{}: field '{}' is a switch: use true or false", file, field);
        if (v.get<bool>()) train_args.push_back("--" + flag);
        continue;
      }
      auto text = [&](const json& x) -> std::string {
        if (x.is_number_integer()) return std::to_string(x.get<long long>());
        if (x.is_number()) return fmt::format("{}", x.get<double>());
        if (x.is_string()) return x.get<std::string>();
        fail("{}: field '{}' must be a number, a string, or a list of them", file, field);
      };
      for (const json& x : v.is_array() ? v : json::array({v})) {  // a list repeats the flag
        train_args.push_back("--" + flag);
        train_args.push_back(text(x));
      }
      if (flag == "batch" || flag == "seq-len" || flag == "grad-accum") {
        long n = 0;
        if (!whole_positive(v, &n)) fail("{}: field '{}' must be a positive integer", file, field);
        (flag == "batch" ? batch : flag == "seq-len" ? seq_len : accum) = static_cast<double>(n);
      }
    }
  }
  tokens_per_step = batch * seq_len * accum;
  return train_args;
}

// budgets: step counts, or token counts with budget_unit "tokens".
std::vector<long> read_sweep_budgets(const std::string& file, const json& j, const std::string& budget_unit) {
  if (!j.contains("budgets")) fail("{}: field 'budgets' is missing (a list of step counts, or tokens with budget_unit)", file);
  if (!j["budgets"].is_array() || j["budgets"].empty()) fail("{}: field 'budgets' must be a non-empty array", file);
  std::vector<long> budgets;
  for (size_t i = 0; i < j["budgets"].size(); ++i) {
    long b = 0;
    if (!whole_positive(j["budgets"][i], &b))
      fail("{}: field 'budgets[{}]' must be a positive whole number of {}", file, i, budget_unit);
    budgets.push_back(b);
  }
  return budgets;
}

struct SweepArch {
  std::string name, preset, config;
  std::vector<std::string> sets;
};

// archs: preset names or {"name", "preset", "config", "set"}.
std::vector<SweepArch> read_sweep_archs(const std::string& file, const json& j) {
  if (!j.contains("archs")) fail("{}: field 'archs' is missing (presets like \"swa128\" or objects)", file);
  if (!j["archs"].is_array() || j["archs"].empty()) fail("{}: field 'archs' must be a non-empty array", file);
  std::vector<SweepArch> archs;
  for (size_t i = 0; i < j["archs"].size(); ++i) {
    const json& a = j["archs"][i];
    const std::string field = fmt::format("archs[{}]", i);
    SweepArch ar;
    if (a.is_string()) {
      ar.name = ar.preset = a.get<std::string>();
    } else if (a.is_object()) {
      for (auto& [k, v] : a.items())
        if (k != "name" && k != "preset" && k != "config" && k != "set")
          fail("{}: unknown field '{}.{}' (known: name, preset, config, set)", file, field, k);
      if (!a.contains("name") || !a["name"].is_string()) fail("{}: field '{}.name' must be a string", file, field);
      ar.name = a["name"].get<std::string>();
      if (a.contains("preset")) {
        if (!a["preset"].is_string()) fail("{}: field '{}.preset' must be a string", file, field);
        ar.preset = a["preset"].get<std::string>();
      }
      if (a.contains("config")) {
        if (!a["config"].is_string()) fail("{}: field '{}.config' must be a string (a model config file)", file, field);
        ar.config = a["config"].get<std::string>();
      }
      if (a.contains("set")) ar.sets = string_list(a["set"], file, field + ".set");
    } else {
      fail("{}: field '{}' must be a preset name or an object {{\"name\", \"preset\", \"config\", \"set\"}}", file, field);
    }
    if (!safe_name(ar.name)) fail("{}: field '{}.name' \"{}\" must use only letters, digits, '-', '_', '.'", file, field, ar.name);
    if (!ar.preset.empty()) {
      try {
        preset_json(ar.preset);
      } catch (const Error& e) {
        fail("{}: field '{}': {}", file, a.is_string() ? field : field + ".preset", e.what());
      }
    }
    for (auto& o : archs)
      if (o.name == ar.name) fail("{}: field '{}.name': \"{}\" is used twice", file, field, ar.name);
    archs.push_back(ar);
  }
  return archs;
}

struct SweepSize {
  std::string name;
  std::vector<std::string> sets;
};

// sizes: {"name", "set"}; absent = one size "base" with the arch's own dimensions.
std::vector<SweepSize> read_sweep_sizes(const std::string& file, const json& j) {
  std::vector<SweepSize> sizes;
  if (j.contains("sizes")) {
    if (!j["sizes"].is_array() || j["sizes"].empty()) fail("{}: field 'sizes' must be a non-empty array", file);
    for (size_t i = 0; i < j["sizes"].size(); ++i) {
      const json& s = j["sizes"][i];
      const std::string field = fmt::format("sizes[{}]", i);
      if (!s.is_object()) fail("{}: field '{}' must be an object {{\"name\", \"set\"}}", file, field);
      for (auto& [k, v] : s.items())
        if (k != "name" && k != "set") fail("{}: unknown field '{}.{}' (known: name, set)", file, field, k);
      if (!s.contains("name") || !s["name"].is_string()) fail("{}: field '{}.name' must be a string", file, field);
      SweepSize sz{s["name"].get<std::string>(), {}};
      if (!safe_name(sz.name))
        fail("{}: field '{}.name' \"{}\" must use only letters, digits, '-', '_', '.'", file, field, sz.name);
      if (s.contains("set")) sz.sets = string_list(s["set"], file, field + ".set");
      for (auto& o : sizes)
        if (o.name == sz.name) fail("{}: field '{}.name': \"{}\" is used twice", file, field, sz.name);
      sizes.push_back(sz);
    }
  } else {
    sizes.push_back({"base", {}});
  }
  return sizes;
}

// The runs: every arch x size (their sets must not overlap, and must resolve to a model) x budget.
void plan_sweep_runs(const std::string& file, const std::vector<SweepArch>& archs, const std::vector<SweepSize>& sizes,
                     const std::vector<long>& budgets, const std::vector<std::string>& train_args, SweepPlan& p) {
  std::set<std::string> names;
  for (size_t ai = 0; ai < archs.size(); ++ai)
    for (size_t si = 0; si < sizes.size(); ++si) {
      const SweepArch& a = archs[ai];
      const SweepSize& s = sizes[si];
      std::set<std::string> arch_keys;
      for (auto& x : a.sets) arch_keys.insert(set_key(x));
      for (auto& x : s.sets)
        if (arch_keys.count(set_key(x)))
          fail("{}: archs[{}] ({}) and sizes[{}] ({}) both set '{}'; set it in one place", file, ai, a.name, si, s.name,
               set_key(x));
      std::vector<std::string> sets = a.sets;
      sets.insert(sets.end(), s.sets.begin(), s.sets.end());
      ModelConfig cfg;
      try {
        cfg = resolve_config(a.preset, a.config, sets);
      } catch (const Error& e) {
        fail("{}: archs[{}] ({}) x sizes[{}] ({}): {}", file, ai, a.name, si, s.name, e.what());
      }
      std::vector<std::string> model_args;
      if (!a.preset.empty()) model_args.insert(model_args.end(), {"--preset", a.preset});
      if (!a.config.empty()) model_args.insert(model_args.end(), {"--config", a.config});
      for (auto& x : sets) model_args.insert(model_args.end(), {"--set", x});
      for (long b : budgets) {
        PlannedRun r;
        r.arch = a.name;
        r.size = s.name;
        r.budget = b;
        r.steps = p.budget_unit == "steps" ? b : static_cast<long>(std::ceil(static_cast<double>(b) / p.tokens_per_step));
        r.tokens = static_cast<double>(r.steps) * p.tokens_per_step;
        r.name = a.name + "-" + s.name + "-" + budget_label(b, p.budget_unit);
        if (!names.insert(r.name).second) fail("{}: field 'budgets': run name {} occurs twice", file, r.name);
        r.dir = (fs::path(p.out) / r.name).string();
        r.model_args = model_args;
        r.train_args = train_args;
        r.model_config = cfg.to_json();
        p.runs.push_back(std::move(r));
      }
    }
}

}  // namespace

SweepPlan load_sweep_plan(const std::string& file, const TrainOptionKind& train_option) {
  const json j = read_json_file(file, " the plan file");
  if (!j.is_object()) fail("{}: a plan must be a JSON object", file);
  for (auto& [k, v] : j.items())
    if (!kPlanKeys.count(k))
      fail("{}: unknown field '{}' (known: out, data, tokenizer, archs, sizes, budgets, budget_unit, train, description)",
           file, k);
  SweepPlan p;
  p.file = file;
  auto str = [&](const char* k, std::string& dst, bool required) {
    if (!j.contains(k)) {
      if (required) fail("{}: field '{}' is missing", file, k);
      return;
    }
    if (!j[k].is_string() || j[k].get<std::string>().empty()) fail("{}: field '{}' must be a non-empty string", file, k);
    dst = j[k].get<std::string>();
  };
  str("out", p.out, true);
  str("data", p.data, false);
  str("tokenizer", p.tokenizer, false);
  str("budget_unit", p.budget_unit, false);
  if (p.budget_unit != "steps" && p.budget_unit != "tokens")
    fail("{}: field 'budget_unit' must be \"steps\" or \"tokens\", got \"{}\"", file, p.budget_unit);
  const std::vector<std::string> train_args = read_sweep_train_flags(file, j, train_option, p.tokens_per_step);
  const std::vector<long> budgets = read_sweep_budgets(file, j, p.budget_unit);
  const std::vector<SweepArch> archs = read_sweep_archs(file, j);
  const std::vector<SweepSize> sizes = read_sweep_sizes(file, j);
  plan_sweep_runs(file, archs, sizes, budgets, train_args, p);
  return p;
}

RunOnDisk inspect_run(const PlannedRun& r) {
  RunOnDisk d;
  d.exists = fs::exists(r.dir);
  if (!d.exists || !fs::exists(run_folder::latest(r.dir))) return d;
  const std::string ckpt = resolve_checkpoint(r.dir);
  json st = load_trainer_state(ckpt);
  if (!st.contains("step") || !st["step"].is_number_integer())
    fail("{}: trainer_state.json has no integer 'step'", ckpt);
  d.has_ckpt = true;
  d.step = st["step"].get<long>();
  // The folder must hold the planned model (vocab_size follows the tokenizer, so it is not compared).
  const fs::path cp = run_folder::config(r.dir);
  if (fs::exists(cp)) {
    json have = read_json_file(cp.string());
    json want = r.model_config;
    for (auto* j : {&have, &want}) j->erase("vocab_size");
    for (auto& [k, v] : want.items())
      if (!have.contains(k) || have[k] != v)
        fail("{}: field '{}' is {} but the plan's {} x {} has {}; use another 'out' folder or remove this run", cp.string(),
             k, have.contains(k) ? have[k].dump() : "missing", r.arch, r.size, v.dump());
  }
  if (d.step > r.steps)
    fail("{}: has a checkpoint at step {}, past the plan's {} steps; use another 'out' folder or remove this run",
         r.dir, d.step, r.steps);
  return d;
}

std::vector<std::string> train_command(const PlannedRun& r, const SweepPlan& p, bool resume) {
  std::vector<std::string> a = {"train"};
  if (!resume) {
    a.insert(a.end(), r.model_args.begin(), r.model_args.end());
    a.insert(a.end(), {"--data", p.data});
    if (!p.tokenizer.empty()) a.insert(a.end(), {"--tokenizer", p.tokenizer});
  }
  a.insert(a.end(), {"--steps", std::to_string(r.steps)});
  a.insert(a.end(), r.train_args.begin(), r.train_args.end());
  a.insert(a.end(), {"--out", r.dir});
  if (resume) a.push_back("--resume");
  return a;
}

void prepare_run_folder(const PlannedRun& r) {
  const RunOnDisk d = inspect_run(r);
  if (d.exists && !d.has_ckpt && fs::exists(run_folder::metrics(r.dir))) {
    fs::path old = run_folder::metrics(r.dir);
    fs::path aside = fs::path(r.dir) / fmt::format("metrics.jsonl.stale-{}", std::time(nullptr));
    fs::rename(old, aside);
  }
  fs::create_directories(r.dir);
}

json status_summary(const json& runs) {
  std::map<std::string, int> c;
  for (auto& r : runs) c[r["status"].get<std::string>()]++;
  return json(c);
}

json sweep_status(const SweepPlan& p) {
  json runs = json::array();
  for (auto& r : p.runs) {
    RunOnDisk d = inspect_run(r);
    const bool done = d.has_ckpt && d.step == r.steps;
    json e = {{"name", r.name}, {"arch", r.arch}, {"size", r.size}, {"budget", r.budget},
              {"budget_unit", p.budget_unit}, {"steps", r.steps}, {"tokens", r.tokens}, {"dir", r.dir},
              {"status", done ? "done" : "pending"}};
    if (d.has_ckpt && !done) e["resume_from_step"] = d.step;
    e["command"] = "hybridlm " + shell_join(train_command(r, p, d.has_ckpt && !done));
    runs.push_back(e);
  }
  return runs;
}

namespace {

std::string rank_status_file(const SweepPlan& p, int rank, int ranks) {
  return (fs::path(p.out) / (ranks > 1 ? fmt::format("sweep.rank-{}.json", rank) : std::string("sweep.json"))).string();
}

void write_status(const SweepPlan& p, const std::string& file, const json& runs) {
  json s = {{"version", 1}, {"plan", fs::absolute(p.file).string()}, {"out", p.out}, {"updated", now_iso()},
            {"runs", runs}, {"summary", status_summary(runs)}};
  write_file_atomic(file, s.dump(2) + "\n");
}

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  for (auto& a : args)
    if (a == flag || a.starts_with(flag + "=")) return true;
  return false;
}

}  // namespace

SweepOutcome run_sweep(const SweepPlan& p, bool quiet, const SweepShare& share) {
  if (share.jobs < 1 || share.ranks < 1 || share.rank < 0 || share.rank >= share.ranks)
    fail("sweep: jobs {} / rank {} of {} is not a valid share", share.jobs, share.rank, share.ranks);
  const std::string exe = self_exe();
  SweepOutcome out;
  std::vector<size_t> mine;  // indices into p.runs (and into `all`)
  for (size_t i = 0; i < p.runs.size(); ++i)
    if (static_cast<int>(i % static_cast<size_t>(share.ranks)) == share.rank) mine.push_back(i);
  const json all = sweep_status(p);
  json& runs = out.runs;
  runs = json::array();
  for (size_t i : mine) runs.push_back(all[i]);
  fs::create_directories(p.out);
  out.sweep_json = rank_status_file(p, share.rank, share.ranks);
  auto save = [&]() { write_status(p, out.sweep_json, runs); };
  save();
  const std::string who = share.ranks > 1 ? fmt::format("rank {}: ", share.rank) : "";
  InterruptGuard guard;
  std::map<pid_t, size_t> running;  // pid -> index into mine / runs
  std::map<size_t, Timer> timers;
  size_t next = 0;
  auto start = [&](size_t k) {
    const PlannedRun& r = p.runs[mine[k]];
    json& e = runs[k];
    const std::string tag = fmt::format("{}[{}/{}] {}", who, mine[k] + 1, p.runs.size(), r.name);
    if (e["status"] == "done") {
      if (!quiet) fmt::print(stderr, "{}: done (step {}), skipped\n", tag, r.steps);
      return;
    }
    RunOnDisk d = inspect_run(r);  // again: an earlier run of this sweep cannot have changed it, but be exact
    const bool resume = d.has_ckpt;
    prepare_run_folder(r);
    auto cmd = train_command(r, p, resume);
    if (share.threads > 0 && !has_flag(r.train_args, "--threads"))
      cmd.insert(cmd.end(), {"--threads", std::to_string(share.threads)});
    const std::string log = run_folder::train_log(r.dir).string();
    e["status"] = "running";
    e["command"] = "hybridlm " + shell_join(cmd);
    e["log"] = log;
    e["started"] = now_iso();
    save();
    if (!quiet)
      fmt::print(stderr, "{}: {} ({} steps, {:.3g} tokens; log {})\n", tag,
                 resume ? fmt::format("resuming from step {}", d.step) : std::string("training"), r.steps, r.tokens, log);
    running[spawn_child(exe, cmd, log)] = k;
    timers[k] = Timer();
  };
  auto finish = [&](size_t k, int code) {
    const PlannedRun& r = p.runs[mine[k]];
    json& e = runs[k];
    const std::string tag = fmt::format("{}[{}/{}] {}", who, mine[k] + 1, p.runs.size(), r.name);
    const double seconds = timers[k].seconds();
    e["seconds"] = seconds;
    e["exit_code"] = code;
    e.erase("resume_from_step");
    if (code == 130 || InterruptGuard::requested()) {
      e["status"] = "interrupted";
      out.interrupted = true;
    } else if (code == 0) {
      RunOnDisk after = inspect_run(r);
      if (after.has_ckpt && after.step == r.steps) {
        e["status"] = "done";
        try {
          auto rd = scaling::read_run(r.dir, "val_loss");
          e["final_val_loss"] = rd.points.back().value;
        } catch (const Error&) {
        }
      } else {
        e["status"] = "failed";
        e["error"] = fmt::format("train exited 0 but the newest checkpoint is at step {}, not {}", after.step, r.steps);
      }
    } else {
      e["status"] = "failed";
      e["error"] = last_error(e["log"].get<std::string>());
    }
    if (e["status"] == "failed") ++out.failed;
    save();
    if (quiet) return;
    if (e["status"] == "done")
      fmt::print(stderr, "{}: done in {:.1f}s{}\n", tag, seconds,
                 e.contains("final_val_loss") ? fmt::format(", val loss {:.4f}", e["final_val_loss"].get<double>()) : "");
    else if (e["status"] == "failed")
      fmt::print(stderr, "{}: FAILED (exit {}): {}\n", tag, code, e.value("error", std::string("see the log")));
    else
      fmt::print(stderr, "{}: interrupted; run the sweep again to continue\n", tag);
  };
  while (true) {
    while (!out.interrupted && !InterruptGuard::requested() && static_cast<int>(running.size()) < share.jobs &&
           next < mine.size())
      start(next++);
    if (running.empty()) break;
    auto [pid, code] = wait_any_child();
    if (pid < 0) break;
    auto it = running.find(pid);
    if (it == running.end()) continue;
    const size_t k = it->second;
    running.erase(it);
    finish(k, code);
  }
  if (InterruptGuard::requested()) out.interrupted = true;
  return out;
}

json merge_rank_status(const SweepPlan& p, int ranks) {
  json merged = sweep_status(p);  // runs no rank reported keep their on-disk status
  for (int rank = 0; rank < ranks; ++rank) {
    const std::string f = rank_status_file(p, rank, ranks);
    if (!fs::exists(f)) continue;
    const json part = read_json_file(f);
    if (!part.contains("runs") || !part["runs"].is_array())
      fail("{}: field 'runs' must be an array (a rank's sweep status)", f);
    size_t k = 0;
    for (size_t i = static_cast<size_t>(rank); i < p.runs.size() && k < part["runs"].size(); i += ranks, ++k)
      merged[i] = part["runs"][k];
  }
  write_status(p, rank_status_file(p, 0, 1), merged);
  for (int rank = 0; rank < ranks; ++rank) fs::remove(rank_status_file(p, rank, ranks));
  return merged;
}

}  // namespace hlm::study
