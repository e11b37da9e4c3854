#pragma once
// Child `hybridlm` processes for sweeps and studies: started in their own process group with their output
// in a log file, waited for while Ctrl-C / SIGTERM is caught once and forwarded to them as SIGINT (a
// training then saves a checkpoint and exits with 130), so the parent can record what happened and stop.
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace hlm::study {

// The running executable (/proc/self/exe), used to start `hybridlm <subcommand>` children.
std::string self_exe();
// Arguments as one shell line, quoting those that need it (for logs and "command" fields).
std::string shell_join(const std::vector<std::string>& args);
// The last "error: ..." line of a log (what a failed child said), without the prefix; else its last
// non-empty line; else a pointer to the log (a failure never has an empty reason).
std::string last_error(const std::string& log);
// Now, UTC, as 2026-12-03T09:10:44Z.
std::string now_iso();

// While alive, SIGINT and SIGTERM set a flag instead of killing this process (the waits below poll it, so the
// signal is forwarded to running children within 0.1 s). The previous handlers come back on destruction.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  static bool requested();  // a signal arrived since the guard was made
};

// Starts `exe args...` (argv[0] "hybridlm") in its own process group, without the MPI launcher's environment
// variables (OMPI_*, PMIX_*, PMI_*: a child is always a single process, even when its parent is an MPI rank). stderr is appended to `log`; stdout
// too, unless `stdout_file` is given (it is then truncated and gets stdout alone, e.g. a --json result).
pid_t spawn_child(const std::string& exe, const std::vector<std::string>& args, const std::string& log,
                  const std::string& stdout_file = "");
// Waits for one of the children this module started; {pid, exit code} (128 + signal when killed). When an
// interrupt is requested, every running child gets SIGINT once. {-1, 0} when no child is running.
std::pair<pid_t, int> wait_any_child();
// As wait_any_child, but gives up after `seconds`: {0, 0} when no child ended by then.
std::pair<pid_t, int> wait_any_child_for(double seconds);
// spawn_child + wait for that child.
int run_child(const std::string& exe, const std::vector<std::string>& args, const std::string& log,
              const std::string& stdout_file = "");

}  // namespace hlm::study
