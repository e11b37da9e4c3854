#include "study/child_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/signal_thread.h"

namespace hlm::study {

namespace fs = std::filesystem;

std::string self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

std::string shell_join(const std::vector<std::string>& args) {
  std::string s;
  for (auto& a : args) {
    bool plain = !a.empty() && a.find_first_of(" \t\"'$\\;&|<>*?()[]{}") == std::string::npos;
    s += (s.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return s;
}

std::string last_error(const std::string& log) {
  std::ifstream f(log);
  std::string line, err, last;
  while (std::getline(f, line)) {
    if (line.rfind("error: ", 0) == 0) err = line.substr(7);
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  if (!err.empty()) return err;
  return last.empty() ? "no message; see " + log : last;  // a crash prints no "error: "
}

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal.store(sig); }
struct sigaction g_old_int {}, g_old_term {};
std::set<pid_t> g_running, g_forwarded;

void forward_if_interrupted() {
  if (!g_signal.load()) return;
  for (pid_t pid : g_running)
    if (g_forwarded.insert(pid).second) ::kill(pid, SIGINT);
}

}  // namespace

InterruptGuard::InterruptGuard() {
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

bool InterruptGuard::requested() { return g_signal.load() != 0; }

pid_t spawn_child(const std::string& exe, const std::vector<std::string>& args, const std::string& log,
                  const std::string& stdout_file) {
  std::vector<char*> argv;
  std::string arg0 = "hybridlm";
  argv.push_back(arg0.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The child is a single process of its own: without the MPI launcher's variables it does not start MPI
  // (train/distributed.h), where with them it would claim this rank's place in the parent's MPI job.
  std::vector<std::string> env_copy;
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    if (v.starts_with("OMPI_") || v.starts_with("PMIX_") || v.starts_with("PMI_")) continue;
    env_copy.emplace_back(v);
  }
  std::vector<char*> envp;
  for (auto& v : env_copy) envp.push_back(v.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) fail("fork failed ({})", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    // Killed parent (kill -9): the child is told as by Ctrl-C (a training saves and exits), so no orphan keeps
    // writing into a folder that the next run of the parent resumes.
    ::prctl(PR_SET_PDEATHSIG, SIGINT);
    if (::getppid() != parent) ::_exit(130);
    restore_startup_signal_mask();  // the parent blocks Ctrl-C outside its signal thread; the child must not
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    if (!stdout_file.empty()) {
      const int out = ::open(stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out >= 0) {
        ::dup2(out, 1);
        ::close(out);
      }
    }
    ::execve(exe.c_str(), argv.data(), envp.data());
    std::fprintf(stderr, "error: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  g_running.insert(pid);
  forward_if_interrupted();  // a signal that came before the child existed still reaches it
  return pid;
}

namespace {

// Forgets child w and decodes its wait status: {pid, exit code}, 128 + signal when killed.
std::pair<pid_t, int> reaped(pid_t w, int status) {
  g_running.erase(w);
  g_forwarded.erase(w);
  if (WIFEXITED(status)) return {w, WEXITSTATUS(status)};
  if (WIFSIGNALED(status)) return {w, 128 + WTERMSIG(status)};
  return {w, 1};
}

}  // namespace

std::pair<pid_t, int> wait_any_child_for(double seconds) {
  if (g_running.empty()) return {-1, 0};
  // Polls, from 1 ms up to 100 ms apart: a short child is reaped at once, a long wait costs nothing.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (useconds_t pause_us = 1000;; pause_us = std::min<useconds_t>(2 * pause_us, 100000)) {
    int status = 0;
    const pid_t w = ::waitpid(-1, &status, WNOHANG);
    if (w > 0 && g_running.count(w)) return reaped(w, status);
    if (w < 0 && errno != EINTR) fail("waitpid failed ({})", std::strerror(errno));
    forward_if_interrupted();
    if (std::chrono::steady_clock::now() >= deadline) return {0, 0};
    ::usleep(pause_us);
  }
}

std::pair<pid_t, int> wait_any_child() {
  // Polls rather than blocks in waitpid: the signal is handled on another thread (core/signal_thread.h), so
  // it would not interrupt a blocking wait in this one and could not be forwarded until a child ended.
  while (true) {
    const auto r = wait_any_child_for(3600);
    if (r.first != 0) return r;
  }
}

int run_child(const std::string& exe, const std::vector<std::string>& args, const std::string& log,
              const std::string& stdout_file) {
  const pid_t pid = spawn_child(exe, args, log, stdout_file);
  while (true) {
    auto [w, code] = wait_any_child();
    if (w == pid || w < 0) return code;
  }
}

}  // namespace hlm::study
