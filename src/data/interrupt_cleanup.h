#pragma once
// Removes a folder that is being built when the process is interrupted (SIGINT / SIGTERM), so a Ctrl-C
// during a dataset build leaves no `<name>.tmp-PID-N` behind. While a guard lives, the first such signal
// deletes the files of every guarded folder and the folders themselves (async-signal-safe system calls
// only; the folders are flat), then dies of the signal as before (the shell still sees exit 130).
// Installed only where the signal has its default action: a command that ignores or handles the signal
// itself (a background job, the trainer's Ctrl-C save) keeps its behaviour.
#include <string>

namespace hlm::data {

class InterruptCleanup {
 public:
  explicit InterruptCleanup(const std::string& folder);
  ~InterruptCleanup();
  InterruptCleanup(const InterruptCleanup&) = delete;
  InterruptCleanup& operator=(const InterruptCleanup&) = delete;

 private:
  int slot_ = -1;  // -1: more concurrent builds than slots; the next build clears this one's folder instead
};

}  // namespace hlm::data
