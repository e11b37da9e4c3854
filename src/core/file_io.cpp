#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace hlm {

namespace {

std::string sys_err() { return std::strerror(errno); }

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Writes all of `data` to fd; on failure closes fd, removes `unlink_path` (if not empty) and throws.
void write_all(int fd, const std::string& data, const std::string& path, const std::string& unlink_path) {
  const char* p = data.data();
  std::size_t n = data.size();
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string err = w < 0 ? sys_err() : "no progress";
      ::close(fd);
      if (!unlink_path.empty()) ::unlink(unlink_path.c_str());
      fail("{}: write failed ({})", path, err);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

void fsync_dir(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot create ({})", tmp, sys_err());
  write_all(fd, contents, path, tmp);
  if (::fsync(fd) != 0) {
    const std::string err = sys_err();
    ::close(fd);
    ::unlink(tmp.c_str());
    fail("{}: fsync failed ({})", path, err);
  }
  if (::close(fd) != 0) {
    const std::string err = sys_err();
    ::unlink(tmp.c_str());
    fail("{}: close failed ({})", path, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = sys_err();
    ::unlink(tmp.c_str());
    fail("{}: cannot rename {} over it ({})", path, tmp, err);
  }
  fsync_dir(parent_dir(path));
}

void append_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot open for appending ({})", path, sys_err());
  write_all(fd, text, path, "");
  if (::close(fd) != 0) fail("{}: close failed ({})", path, sys_err());
}

std::string read_text_file(const std::string& path, const std::string& what, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer before fstat can refuse it.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open {} ({})", path, what, sys_err());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("{}: cannot stat {} ({})", path, what, sys_err());
  if (!S_ISREG(st.st_mode)) fail("{}: {} is {}, expected a regular file", path, what, file_kind(st.st_mode));
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size > max_bytes)
    fail("{}: {} is {} bytes, over the limit of {} bytes", path, what, size, max_bytes);
  std::string out(size, '\0');
  std::size_t got = 0;
  while (got < size) {
    ssize_t r = ::read(fd, out.data() + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("{}: read error in {} ({})", path, what, sys_err());
    if (r == 0) break;  // shrank while reading
    got += static_cast<std::size_t>(r);
  }
  out.resize(got);
  return out;
}

}  // namespace hlm
