#include "study/task_graph.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_io.h"
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

double eta_seconds(double remaining_weight, double finished_weight, double finished_seconds,
                   const std::vector<std::pair<double, double>>& running, int slots) {
  if (remaining_weight <= 0) return 0;  // also when no task ran in this sitting (all done before it)
  if (finished_weight <= 0 || finished_seconds <= 0 || slots < 1) return -1;
  const double rate = finished_weight / finished_seconds;  // weight per second of one child
  double left = remaining_weight;
  for (auto& [w, sec] : running) left -= std::min(w, rate * sec);
  return std::max(0.0, left) / (rate * slots);
}

GraphOutcome run_task_graph(const std::string& exe, std::vector<Task>& tasks, int jobs, bool quiet,
                            const GraphShare& share) {
  enum class State { kWaiting, kRunning, kDone, kFailed, kSkipped };
  const size_t n = tasks.size();
  std::vector<State> st(n, State::kWaiting);
  GraphOutcome out;
  Timer timer;
  double timed_w = 0, timed_s = 0;  // tasks this process finished in this sitting: weight and their own run time
  int runs_total = 0, runs_done = 0;
  for (size_t i = 0; i < n; ++i) {
    runs_total += tasks[i].is_run;
    if (tasks[i].done && tasks[i].done()) {
      st[i] = State::kDone;
      runs_done += tasks[i].is_run;
      ++out.done;
    }
  }
  // Which process runs each task: groups in order of first appearance, round robin over the ranks.
  std::vector<int> owner(n, 0);
  std::map<std::string, int> group_index;
  for (size_t i = 0; i < n; ++i)
    if (!tasks[i].group.empty())
      owner[i] = group_index.emplace(tasks[i].group, static_cast<int>(group_index.size())).first->second % share.ranks;
  auto mine = [&](size_t i) { return owner[i] == share.rank; };
  auto marker = [&](size_t i) { return (fs::path(share.markers) / fmt::format("task-{}.failed", i)).string(); };
  const std::string who = share.ranks > 1 ? fmt::format("rank {}: ", share.rank) : "";
  InterruptGuard guard;
  std::map<pid_t, size_t> running;
  std::map<size_t, Timer> started;
  auto progress = [&](const std::string& what) {
    if (quiet) return;
    const double el = timer.seconds();
    std::vector<std::pair<double, double>> now;
    for (auto& [pid, i] : running) now.emplace_back(tasks[i].weight, started[i].seconds());
    int left = 0;  // a study with fewer tasks left than children runs only that many at once
    double left_w = 0;
    for (size_t i = 0; i < n; ++i)
      if (st[i] == State::kWaiting || st[i] == State::kRunning) ++left, left_w += tasks[i].weight;
    const double eta_s = eta_seconds(left_w, timed_w, timed_s, now, std::min(jobs * share.ranks, left));
    const std::string eta = eta_s >= 0 ? format_duration(eta_s) : "?";
    fmt::print(stderr, "{}reproduce: [{}/{} tasks, runs {}/{} trained] {} elapsed, ETA {}{}{}\n", who, out.done, n, runs_done,
               runs_total, format_duration(el), eta, what.empty() ? "" : ": ", what);
  };
  out.done_before = out.done;
  if (out.done > 0) progress(fmt::format("{} task{} already done (resumed)", out.done, out.done == 1 ? "" : "s"));
  auto mark_done = [&](size_t i, const std::string& note) {
    st[i] = State::kDone;
    ++out.done;
    if (started.count(i)) timed_w += tasks[i].weight, timed_s += started[i].seconds();  // one of this process's
    runs_done += tasks[i].is_run;
    progress(fmt::format("{} ({})", tasks[i].label, note));
  };
  auto mark_failed = [&](size_t i, const std::string& error) {
    st[i] = State::kFailed;
    ++out.failed;
    out.errors.push_back(fmt::format("{}: {}", tasks[i].label, error));
    progress(fmt::format("FAILED {}: {}", tasks[i].label, error));
    if (share.ranks > 1 && mine(i)) write_file_atomic(marker(i), error + "\n");  // the other ranks wait for it
  };
  // Tasks of the other ranks: done when the folder says so, failed when their owner left a marker.
  auto poll_others = [&]() {
    for (size_t i = 0; i < n && share.ranks > 1; ++i) {
      if (st[i] != State::kWaiting || mine(i)) continue;
      if (tasks[i].done && tasks[i].done()) mark_done(i, fmt::format("rank {}", owner[i]));
      else if (fs::exists(marker(i))) {
        std::ifstream f(marker(i));
        std::string why;
        std::getline(f, why);
        mark_failed(i, fmt::format("{} (on rank {})", why, owner[i]));
      }
    }
  };
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
        if (st[i] != State::kWaiting || !mine(i)) continue;
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
          mark_failed(i, e.what());
        }
      }
    if (running.empty()) {
      // Alone, nothing more can start. Across ranks, wait while another rank still owes a task.
      bool owed = false;
      for (size_t i = 0; i < n; ++i) owed |= st[i] == State::kWaiting;
      if (share.ranks == 1 || !owed || InterruptGuard::requested()) break;
      ::usleep(500000);
      poll_others();
      continue;
    }
    auto [pid, code] = share.ranks > 1 ? wait_any_child_for(1.0) : wait_any_child();
    poll_others();
    if (pid == 0) continue;  // no child ended within the poll interval
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
    if (error.empty()) mark_done(i, format_duration(started[i].seconds()));
    else mark_failed(i, fmt::format("{} (log {})", error, t.log));
  }
  if (InterruptGuard::requested()) out.interrupted = true;
  out.seconds = timer.seconds();
  return out;
}

}  // namespace hlm::study
