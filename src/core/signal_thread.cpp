#include "core/signal_thread.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <mutex>

namespace hlm {

namespace {

constexpr int kRouted[] = {SIGINT, SIGTERM, SIGUSR1};  // the signals the program installs handlers for

sigset_t g_startup_mask;
bool g_saved = false;
sigset_t g_unblock;  // the routed signals that were not blocked at start: the idle thread takes these

void* idle_thread(void*) {
  ::pthread_sigmask(SIG_UNBLOCK, &g_unblock, nullptr);
  for (;;) ::pause();  // handlers run here; exit() ends the thread with the process
  return nullptr;
}

}  // namespace

void route_signals_to_own_thread() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t routed;
    sigemptyset(&routed);
    for (int sig : kRouted) sigaddset(&routed, sig);
    if (::pthread_sigmask(SIG_BLOCK, &routed, &g_startup_mask) != 0) return;
    g_saved = true;
    sigemptyset(&g_unblock);
    for (int sig : kRouted)
      if (!sigismember(&g_startup_mask, sig)) sigaddset(&g_unblock, sig);
    pthread_attr_t attr;
    ::pthread_attr_init(&attr);
    ::pthread_attr_setstacksize(&attr, 256 * 1024);  // handlers are small; a signal frame is a few KB
    ::pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    const bool started = ::pthread_create(&t, &attr, idle_thread, nullptr) == 0;
    ::pthread_attr_destroy(&attr);
    // Without the thread, signals are taken where they land, as before (and the heap risk with them).
    if (!started) ::pthread_sigmask(SIG_SETMASK, &g_startup_mask, nullptr);
  });
}

void restore_startup_signal_mask() {
  if (g_saved) ::pthread_sigmask(SIG_SETMASK, &g_startup_mask, nullptr);
}

}  // namespace hlm
