#include "data/interrupt_cleanup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace hlm::data {

namespace {

constexpr int kSlots = 8;      // concurrent builds in one process (threads) that are cleaned on a signal
constexpr int kPathMax = 4096;

// Filled before `used` is set; read by the handler only while `used` is true.
struct Slot {
  std::atomic<bool> used{false};
  char path[kPathMax];
};
std::array<Slot, kSlots> g_slots;

// The handlers are installed while at least one guard lives (counted under the mutex, never in the handler).
std::mutex g_mu;
int g_live = 0;
bool g_installed[2] = {false, false};
constexpr int kSignals[2] = {SIGINT, SIGTERM};

void write_stderr(const char* s) {
  for (size_t n = std::strlen(s); n > 0;) {
    ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// Deletes the files of a flat folder, then the folder. Entries removed while reading the folder can make
// getdents skip others, and a writer thread may still add a file, so a few passes are made.
void remove_flat_folder(const char* path) {
  for (int pass = 0; pass < 8; ++pass) {
    const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    alignas(8) char buf[4096];
    for (ssize_t n; (n = ::getdents64(fd, buf, sizeof buf)) > 0;) {
      for (ssize_t off = 0; off < n;) {
        const auto* d = reinterpret_cast<const struct dirent64*>(buf + off);
        off += d->d_reclen;
        if (std::strcmp(d->d_name, ".") != 0 && std::strcmp(d->d_name, "..") != 0) ::unlinkat(fd, d->d_name, 0);
      }
    }
    ::close(fd);
    if (::rmdir(path) == 0 || errno == ENOENT) return;
  }
}

struct sigaction g_old[2];  // the actions before the first guard, called (or restored) by ours
std::atomic<bool> g_flag{false};
std::atomic<pid_t> g_child{0};

bool default_action(const struct sigaction& a) { return a.sa_handler == SIG_DFL && !(a.sa_flags & SA_SIGINFO); }

extern "C" void on_interrupt(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  const int k = sig == SIGINT ? 0 : 1;
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, SIGKILL);
  if (default_action(g_old[k])) {
    if (child > 0) ::waitpid(child, nullptr, 0);  // its last writes end before its folder goes
    for (Slot& s : g_slots) {
      if (!s.used.load()) continue;
      remove_flat_folder(s.path);
      write_stderr("data: interrupted; removing the partial build ");
      write_stderr(s.path);
      write_stderr("\n");
    }
    errno = saved;
    // Dies of the signal once the handler returns (it is blocked until then): the default action, as before.
    ::sigaction(sig, &g_old[k], nullptr);
    ::raise(sig);
    return;
  }
  g_flag.store(true);
  errno = saved;
  if (g_old[k].sa_flags & SA_SIGINFO) g_old[k].sa_sigaction(sig, info, context);
  else if (g_old[k].sa_handler != SIG_IGN) g_old[k].sa_handler(sig);
}

}  // namespace

InterruptCleanup::InterruptCleanup(const std::string& folder) {
  if (folder.size() >= static_cast<size_t>(kPathMax)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[static_cast<size_t>(i)];
    if (s.used.load()) continue;
    std::memcpy(s.path, folder.c_str(), folder.size() + 1);
    s.used.store(true);
    slot_ = i;
    break;
  }
  if (slot_ < 0 || g_live++ > 0) return;
  for (int k = 0; k < 2; ++k) {
    struct sigaction sa {};
    sa.sa_sigaction = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sa.sa_flags = SA_SIGINFO;
    g_installed[k] = ::sigaction(kSignals[k], &sa, &g_old[k]) == 0;
  }
}

InterruptCleanup::~InterruptCleanup() {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_live == 0) {
    for (int k = 0; k < 2; ++k) {
      if (!g_installed[k]) continue;
      g_installed[k] = false;
      struct sigaction cur {};
      ::sigaction(kSignals[k], nullptr, &cur);
      if (cur.sa_sigaction != on_interrupt) continue;  // replaced meanwhile by its new owner (or already fired)
      ::sigaction(kSignals[k], &g_old[k], nullptr);
    }
    g_flag.store(false);
  }
  g_slots[static_cast<size_t>(slot_)].used.store(false);
}

bool build_interrupted() { return g_flag.load(); }

void throw_if_build_interrupted(const char* what) {
  if (g_flag.load()) throw Interrupted(fmt::format("data: the build stopped while {}", what));
}

void set_build_child(pid_t pid) { g_child.store(pid); }

}  // namespace hlm::data
