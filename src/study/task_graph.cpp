#include "study/task_graph.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/timer.h"
#include "study/child_process.h"

namespace hlm::study {

namespace fs = std::filesystem;

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

GraphOutcome run_task_graph(const std::string& exe, std::vector<Task>& tasks, int jobs, bool quiet) {
  enum class State { kWaiting, kRunning, kDone, kFailed, kSkipped };
  const size_t n = tasks.size();
  std::vector<State> st(n, State::kWaiting);
  GraphOutcome out;
  Timer timer;
  double total_w = 0, done_w = 0, done_w_now = 0;  // done_w_now: done in this sitting (for the rate)
  int runs_total = 0, runs_done = 0;
  for (size_t i = 0; i < n; ++i) {
    total_w += tasks[i].weight;
    runs_total += tasks[i].is_run;
    if (tasks[i].done && tasks[i].done()) {
      st[i] = State::kDone;
      done_w += tasks[i].weight;
      runs_done += tasks[i].is_run;
      ++out.done;
    }
  }
  auto progress = [&](const std::string& what) {
    if (quiet) return;
    const double el = timer.seconds();
    const double rate = done_w_now > 0 ? done_w_now / el : 0;
    const std::string eta = rate > 0 ? format_duration((total_w - done_w) / rate) : "?";
    fmt::print(stderr, "reproduce: [{}/{} tasks, runs {}/{} trained] {} elapsed, ETA {}{}{}\n", out.done, n, runs_done,
               runs_total, format_duration(el), eta, what.empty() ? "" : ": ", what);
  };
  if (out.done > 0) progress(fmt::format("{} task{} already done (resumed)", out.done, out.done == 1 ? "" : "s"));
  InterruptGuard guard;
  std::map<pid_t, size_t> running;
  std::map<size_t, Timer> started;
  while (true) {
    // Skip what can no longer run; start what is ready.
    bool changed = true;
    while (changed) {
      changed = false;
      for (size_t i = 0; i < n; ++i) {
        if (st[i] != State::kWaiting) continue;
        for (size_t d : tasks[i].deps)
          if (st[d] == State::kFailed || st[d] == State::kSkipped) {
            st[i] = State::kSkipped;
            ++out.skipped;
            changed = true;
            break;
          }
      }
    }
    if (!InterruptGuard::requested())
      for (size_t i = 0; i < n && static_cast<int>(running.size()) < jobs; ++i) {
        if (st[i] != State::kWaiting) continue;
        bool ready = true;
        for (size_t d : tasks[i].deps) ready &= st[d] == State::kDone;
        if (!ready) continue;
        Task& t = tasks[i];
        try {
          if (t.before) t.before();
          const std::vector<std::string> args = t.args();
          if (!t.log.empty()) fs::create_directories(fs::path(t.log).parent_path());
          const pid_t pid = spawn_child(exe, args, t.log, t.output.empty() ? "" : t.output + ".tmp");
          running[pid] = i;
          started[i] = Timer();
          st[i] = State::kRunning;
        } catch (const Error& e) {
          st[i] = State::kFailed;
          ++out.failed;
          out.errors.push_back(fmt::format("{}: {}", t.label, e.what()));
          progress(fmt::format("FAILED {}: {}", t.label, e.what()));
        }
      }
    if (running.empty()) break;
    auto [pid, code] = wait_any_child();
    if (pid < 0) break;
    auto it = running.find(pid);
    if (it == running.end()) continue;
    const size_t i = it->second;
    running.erase(it);
    Task& t = tasks[i];
    std::string error;
    if (code == 0) {
      if (!t.output.empty()) fs::rename(t.output + ".tmp", t.output);
      if (t.check) error = t.check();
    } else if (code == 130 || InterruptGuard::requested()) {
      out.interrupted = true;
      st[i] = State::kWaiting;  // not done; the next run starts or resumes it
      if (!t.output.empty()) fs::remove(t.output + ".tmp");
      progress(fmt::format("interrupted {}", t.label));
      continue;
    } else {
      error = fmt::format("exit {}: {}", code, last_error(t.log));
    }
    if (error.empty()) {
      st[i] = State::kDone;
      ++out.done;
      done_w += t.weight;
      done_w_now += t.weight;
      runs_done += t.is_run;
      progress(fmt::format("{} ({})", t.label, format_duration(started[i].seconds())));
    } else {
      st[i] = State::kFailed;
      ++out.failed;
      out.errors.push_back(fmt::format("{}: {} (log {})", t.label, error, t.log));
      progress(fmt::format("FAILED {}: {} (log {})", t.label, error, t.log));
    }
  }
  if (InterruptGuard::requested()) out.interrupted = true;
  out.seconds = timer.seconds();
  return out;
}

}  // namespace hlm::study
