#include "data/interrupt_cleanup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

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

extern "C" void on_interrupt(int sig) {
  const int saved = errno;
  for (Slot& s : g_slots) {
    if (!s.used.load()) continue;
    remove_flat_folder(s.path);
    write_stderr("data: interrupted; removing the partial build ");
    write_stderr(s.path);
    write_stderr("\n");
  }
  errno = saved;
  // SA_RESETHAND restored the default action: dying of the signal once the handler returns.
  ::raise(sig);
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
    struct sigaction old {};
    ::sigaction(kSignals[k], nullptr, &old);
    if (old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;  // ignored or handled by its owner
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sa.sa_flags = SA_RESETHAND;
    g_installed[k] = ::sigaction(kSignals[k], &sa, nullptr) == 0;
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
      if (cur.sa_handler != on_interrupt) continue;  // replaced meanwhile by its new owner (or already fired)
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      ::sigaction(kSignals[k], &dfl, nullptr);
    }
  }
  g_slots[static_cast<size_t>(slot_)].used.store(false);
}

}  // namespace hlm::data
