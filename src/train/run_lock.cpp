#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "train/run_folder.h"

namespace hlm {

namespace fs = std::filesystem;

RunLock::RunLock(const std::string& run_dir) {
  fs::create_directories(run_dir);
  const std::string path = run_folder::lock(run_dir).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("{}: cannot open the run's lock file ({})", path, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      fail("{}: the run folder is in use by another process (pid {}, lock file {}); wait for it or use another --out",
           run_dir, pid, path);
    }
    fail("{}: cannot lock ({})", path, std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    fail("{}: cannot write the lock file ({})", path, std::strerror(errno));
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock; the file stays (removing it would race a new holder)
}

bool holds_run(const std::string& run_dir) {
  for (const fs::path& f : {run_folder::latest(run_dir), run_folder::run_json(run_dir), run_folder::metrics(run_dir),
                            run_folder::checkpoints(run_dir)})
    if (fs::exists(f)) return true;
  return false;
}

void clear_run(const std::string& run_dir) {
  const fs::path d(run_dir);
  for (const fs::path& f : run_folder::run_files(d)) fs::remove_all(f);
}

}  // namespace hlm
