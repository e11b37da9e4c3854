#pragma once
// One writer per run folder. RunLock takes an exclusive flock(2) on <run>/lock and writes its pid there; a
// second trainer on the same folder is refused naming the holder's pid. The kernel drops the lock when its
// holder dies (also on kill -9), so a stale lock file from a dead process is simply taken over.
#include <string>

namespace hlm {

class RunLock {
 public:
  // Creates the folder if needed. Throws hlm::Error when another live process holds the lock.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// True when the folder holds (part of) a run: a checkpoint, `latest`, run.json or metrics.jsonl.
bool holds_run(const std::string& run_dir);

// Removes a run's files (checkpoints/, latest, run.json, config.json, metrics.jsonl) and nothing else; for
// `train --overwrite`, called while holding the lock.
void clear_run(const std::string& run_dir);

}  // namespace hlm
