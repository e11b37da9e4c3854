#include "study/sweep.h"

#include <sys/stat.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_io.h"
#include "core/timer.h"
#include "eval/scaling.h"
#include "study/child_process.h"
#include "study/json_file.h"
#include "train/checkpoint_reader.h"
#include "train/run_folder.h"
#include "train/run_lock.h"

namespace hlm::study {

namespace fs = std::filesystem;
using nlohmann::json;

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

namespace {

// A trainer started by an earlier study that was killed gets SIGINT from the kernel and saves before it exits;
// until it has, the folder is not what it will be. Wait (up to a minute) for it to let go of the run's lock.
void wait_until_unlocked(const std::string& dir) {
  for (int tries = 0;; ++tries) {
    try {
      RunLock probe(dir);
      return;
    } catch (const Error&) {
      if (tries >= 600) throw;  // still held after 60 s: a live trainer, named in the message
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

void prepare_run_folder(const PlannedRun& r) {
  wait_until_unlocked(r.dir);
  const RunOnDisk d = inspect_run(r);
  if (d.exists && !d.has_ckpt) {
    // Started but never checkpointed: nothing to continue from, so it starts over. Its metrics rows are set
    // aside for a post-mortem; the rest (run.json, config.json) would make `train` refuse the folder.
    if (fs::exists(run_folder::metrics(r.dir))) {
      fs::path aside = fs::path(r.dir) / fmt::format("metrics.jsonl.stale-{}", std::time(nullptr));
      fs::rename(run_folder::metrics(r.dir), aside);
    }
    clear_run(r.dir);
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
    const bool done = d.finished(r.steps);
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
    prepare_run_folder(r);
    const RunOnDisk d = inspect_run(r);  // after: a trainer of a killed sweep may have saved in the meantime
    const bool resume = d.has_ckpt;
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
