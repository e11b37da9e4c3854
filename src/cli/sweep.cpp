// hybridlm sweep PLAN.json: trains every (arch x size x budget) of a plan as a child `hybridlm train`
// process, resumably (finished runs are skipped, interrupted ones continue with --resume), and keeps
// <out>/sweep.json with each run's status, so that `hybridlm scaling fit <out>` can fit the result.
// Plan format and behaviour: docs/scaling.md.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/timer.h"
#include "eval/scaling.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace hlm::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct PlannedRun {
  std::string name, arch, size;
  long budget = 0;        // as written in the plan (steps or tokens)
  long steps = 0;         // optimizer steps to train
  double tokens = 0;      // steps * tokens per step
  std::vector<std::string> model_args, train_args;  // flags for `train` (model: only on a fresh start)
  json model_config;      // the resolved config (to check an existing run folder against)
  std::string dir;
};

struct Plan {
  std::string file, out, data = "default", tokenizer, budget_unit = "steps";
  double tokens_per_step = 0;
  std::vector<PlannedRun> runs;
};

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

Plan load_plan(const std::string& file) {
  std::ifstream f(file);
  if (!f) fail("{}: cannot open the plan file", file);
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {  // also out_of_range: a number too large
    fail("{}: malformed JSON: {}", file, e.what());
  }
  if (!j.is_object()) fail("{}: a plan must be a JSON object", file);
  for (auto& [k, v] : j.items())
    if (!kPlanKeys.count(k))
      fail("{}: unknown field '{}' (known: out, data, tokenizer, archs, sizes, budgets, budget_unit, train, description)",
           file, k);
  Plan p;
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

  // ---- train flags, checked against the real `train` subcommand.
  CLI::App probe_app;
  const Command train_cmd = register_train(probe_app);
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
      CLI::Option* opt = train_cmd.sub->get_option_no_throw("--" + flag);
      if (!opt) fail("{}: field '{}': `hybridlm train` has no option --{}", file, field, flag);
      const bool is_flag = opt->get_expected_max() == 0;  // add_flag: takes no value
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
  p.tokens_per_step = batch * seq_len * accum;

  // ---- budgets
  if (!j.contains("budgets")) fail("{}: field 'budgets' is missing (a list of step counts, or tokens with budget_unit)", file);
  if (!j["budgets"].is_array() || j["budgets"].empty()) fail("{}: field 'budgets' must be a non-empty array", file);
  std::vector<long> budgets;
  for (size_t i = 0; i < j["budgets"].size(); ++i) {
    long b = 0;
    if (!whole_positive(j["budgets"][i], &b))
      fail("{}: field 'budgets[{}]' must be a positive whole number of {}", file, i, p.budget_unit);
    budgets.push_back(b);
  }

  // ---- archs: preset names or {"name", "preset", "config", "set"}
  struct Arch {
    std::string name, preset, config;
    std::vector<std::string> sets;
  };
  if (!j.contains("archs")) fail("{}: field 'archs' is missing (presets like \"swa128\" or objects)", file);
  if (!j["archs"].is_array() || j["archs"].empty()) fail("{}: field 'archs' must be a non-empty array", file);
  std::vector<Arch> archs;
  for (size_t i = 0; i < j["archs"].size(); ++i) {
    const json& a = j["archs"][i];
    const std::string field = fmt::format("archs[{}]", i);
    Arch ar;
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

  // ---- sizes: {"name", "set"}; absent = one size "base" with the arch's own dimensions
  struct Size {
    std::string name;
    std::vector<std::string> sets;
  };
  std::vector<Size> sizes;
  if (j.contains("sizes")) {
    if (!j["sizes"].is_array() || j["sizes"].empty()) fail("{}: field 'sizes' must be a non-empty array", file);
    for (size_t i = 0; i < j["sizes"].size(); ++i) {
      const json& s = j["sizes"][i];
      const std::string field = fmt::format("sizes[{}]", i);
      if (!s.is_object()) fail("{}: field '{}' must be an object {{\"name\", \"set\"}}", file, field);
      for (auto& [k, v] : s.items())
        if (k != "name" && k != "set") fail("{}: unknown field '{}.{}' (known: name, set)", file, field, k);
      if (!s.contains("name") || !s["name"].is_string()) fail("{}: field '{}.name' must be a string", file, field);
      Size sz{s["name"].get<std::string>(), {}};
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

  // ---- the runs
  std::set<std::string> names;
  for (size_t ai = 0; ai < archs.size(); ++ai)
    for (size_t si = 0; si < sizes.size(); ++si) {
      const Arch& a = archs[ai];
      const Size& s = sizes[si];
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
  return p;
}

// What a run folder says: no checkpoint yet, or the step of its newest checkpoint.
struct OnDisk {
  bool exists = false, has_ckpt = false;
  long step = 0;
};

OnDisk inspect(const PlannedRun& r) {
  OnDisk d;
  d.exists = fs::exists(r.dir);
  if (!d.exists || !fs::exists(fs::path(r.dir) / "latest")) return d;
  const std::string ckpt = resolve_checkpoint(r.dir);
  json st = load_trainer_state(ckpt);
  if (!st.contains("step") || !st["step"].is_number_integer())
    fail("{}: trainer_state.json has no integer 'step'", ckpt);
  d.has_ckpt = true;
  d.step = st["step"].get<long>();
  // The folder must hold the planned model (vocab_size follows the tokenizer, so it is not compared).
  const fs::path cp = fs::path(r.dir) / "config.json";
  if (fs::exists(cp)) {
    std::ifstream f(cp);
    json have;
    try {
      have = json::parse(f);
    } catch (const json::exception& e) {  // also out_of_range: a number too large
      fail("{}: malformed JSON: {}", cp.string(), e.what());
    }
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

std::string self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

std::vector<std::string> train_command(const PlannedRun& r, const Plan& p, bool resume) {
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

std::string shell_join(const std::vector<std::string>& args) {
  std::string s;
  for (auto& a : args) {
    bool plain = !a.empty() && a.find_first_of(" \t\"'$\\;&|<>*?()[]{}") == std::string::npos;
    s += (s.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return s;
}

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal.store(sig); }

// Runs `exe args...` with stdout/stderr appended to log, in its own process group (the sweep forwards
// Ctrl-C once, so the trainer saves a checkpoint and exits). Returns the exit code (128+signal if killed).
int run_child(const std::string& exe, const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  std::string arg0 = "hybridlm";
  argv.push_back(arg0.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) fail("sweep: fork failed ({})", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "error: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  bool forwarded = false;
  int status = 0;
  while (true) {
    const pid_t w = ::waitpid(pid, &status, 0);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) fail("sweep: waitpid failed ({})", std::strerror(errno));
    if (g_signal.load() && !forwarded) {
      ::kill(pid, SIGINT);
      forwarded = true;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The last "error: ..." line of a log (what the child said when it failed), else its last non-empty line (a
// crash prints no "error: "), else a pointer to the log.
std::string last_error(const std::string& log) {
  std::ifstream f(log);
  std::string line, err, last;
  while (std::getline(f, line)) {
    if (line.rfind("error: ", 0) == 0) err = line.substr(7);
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  if (!err.empty()) return err;
  return last.empty() ? "no message; see " + log : last;
}

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

struct SweepOpts {
  std::string plan;
  bool dry_run = false, json = false;
};

int run_sweep(const SweepOpts& o) {
  Plan p = load_plan(o.plan);
  const std::string exe = self_exe();
  json runs = json::array();
  std::vector<OnDisk> disk;
  for (auto& r : p.runs) {
    OnDisk d = inspect(r);
    disk.push_back(d);
    const bool done = d.has_ckpt && d.step == r.steps;
    json e = {{"name", r.name}, {"arch", r.arch}, {"size", r.size}, {"budget", r.budget},
              {"budget_unit", p.budget_unit}, {"steps", r.steps}, {"tokens", r.tokens}, {"dir", r.dir},
              {"status", done ? "done" : "pending"}};
    if (d.has_ckpt && !done) e["resume_from_step"] = d.step;
    const auto cmd = train_command(r, p, d.has_ckpt && !done);
    e["command"] = "hybridlm " + shell_join(cmd);
    runs.push_back(e);
  }
  auto summary = [&]() {
    std::map<std::string, int> c;
    for (auto& r : runs) c[r["status"].get<std::string>()]++;
    return json(c);
  };
  if (o.dry_run) {
    if (o.json) {
      print_json({{"plan", o.plan}, {"out", p.out}, {"dry_run", true}, {"runs", runs}, {"summary", summary()}});
      return 0;
    }
    fmt::print("sweep {}: {} runs into {}\n", o.plan, runs.size(), p.out);
    for (auto& r : runs) {
      std::string what = r["status"] == "done"               ? "done, skip"
                         : r.contains("resume_from_step") ? fmt::format("resume from step {}", r["resume_from_step"].get<long>())
                                                          : "train";
      fmt::print("  {:<32} {:>8} steps {:>12.0f} tokens  {}\n    {}\n", r["name"].get<std::string>(),
                 r["steps"].get<long>(), r["tokens"].get<double>(), what, r["command"].get<std::string>());
    }
    return 0;
  }

  fs::create_directories(p.out);
  const std::string sweep_json = (fs::path(p.out) / "sweep.json").string();
  auto save = [&]() {
    json s = {{"version", 1}, {"plan", fs::absolute(o.plan).string()}, {"out", p.out}, {"updated", now_iso()},
              {"runs", runs}, {"summary", summary()}};
    write_file_atomic(sweep_json, s.dump(2) + "\n");
  };
  save();
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: waitpid returns EINTR so the signal is forwarded at once
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  int failed = 0;
  bool interrupted = false;
  for (size_t i = 0; i < p.runs.size(); ++i) {
    const PlannedRun& r = p.runs[i];
    json& e = runs[i];
    const std::string tag = fmt::format("[{}/{}] {}", i + 1, p.runs.size(), r.name);
    if (e["status"] == "done") {
      if (!o.json) fmt::print(stderr, "{}: done (step {}), skipped\n", tag, r.steps);
      continue;
    }
    OnDisk d = inspect(r);  // again: an earlier run of this sweep cannot have changed it, but be exact
    const bool resume = d.has_ckpt;
    if (d.exists && !d.has_ckpt && fs::exists(fs::path(r.dir) / "metrics.jsonl")) {
      // Started but never checkpointed: train starts over; keep the old rows aside so they are not mixed in.
      fs::path old = fs::path(r.dir) / "metrics.jsonl";
      fs::path aside = fs::path(r.dir) / fmt::format("metrics.jsonl.stale-{}", std::time(nullptr));
      fs::rename(old, aside);
    }
    fs::create_directories(r.dir);
    const auto cmd = train_command(r, p, resume);
    const std::string log = (fs::path(r.dir) / "train.log").string();
    e["status"] = "running";
    e["command"] = "hybridlm " + shell_join(cmd);
    e["log"] = log;
    e["started"] = now_iso();
    save();
    if (!o.json)
      fmt::print(stderr, "{}: {} ({} steps, {:.3g} tokens; log {})\n", tag,
                 resume ? fmt::format("resuming from step {}", d.step) : std::string("training"), r.steps, r.tokens, log);
    Timer t;
    const int code = run_child(exe, cmd, log);
    e["seconds"] = t.seconds();
    e["exit_code"] = code;
    e.erase("resume_from_step");
    if (code == 130 || g_signal.load()) {
      e["status"] = "interrupted";
      interrupted = true;
    } else if (code == 0) {
      OnDisk after = inspect(r);
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
      e["error"] = last_error(log);
    }
    if (e["status"] == "failed") ++failed;
    save();
    if (!o.json) {
      if (e["status"] == "done")
        fmt::print(stderr, "{}: done in {:.1f}s{}\n", tag, t.seconds(),
                   e.contains("final_val_loss") ? fmt::format(", val loss {:.4f}", e["final_val_loss"].get<double>()) : "");
      else if (e["status"] == "failed")
        fmt::print(stderr, "{}: FAILED (exit {}): {}\n", tag, code, e.value("error", std::string("see the log")));
      else
        fmt::print(stderr, "{}: interrupted; run the sweep again to continue\n", tag);
    }
    if (interrupted) break;
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (o.json) {
    print_json({{"plan", o.plan}, {"out", p.out}, {"sweep_json", sweep_json}, {"runs", runs}, {"summary", summary()}});
  } else {
    std::string s;
    const json counts = summary();
    for (auto& [k, v] : counts.items()) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", v.get<int>(), k);
    fmt::print(stderr, "sweep: {} ({}); fit with: hybridlm scaling fit {}\n", s, sweep_json, p.out);
  }
  if (interrupted) return 130;
  return failed ? 1 : 0;
}

}  // namespace

Command register_sweep(CLI::App& app) {
  auto* sub = app.add_subcommand("sweep", "train every (arch x size x budget) of a plan file, resumably");
  auto o = std::make_shared<SweepOpts>();
  sub->add_option("plan", o->plan, "plan JSON file (docs/scaling.md)")->required();
  sub->add_flag("--dry-run", o->dry_run, "list the runs and what would happen; train nothing");
  sub->add_flag("--json", o->json, "print one JSON object (the runs and their status)");
  return {sub, [o]() -> int { return run_sweep(*o); }};
}

}  // namespace hlm::cli
