#pragma once
// Shared by the fuzz targets: readers that take a path get the input as a file in a private scratch folder
// (in /dev/shm when there is one, so no disk I/O), and hlm::Error is the expected way to refuse bad input.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace hlm::fuzz {

// Removed when the run ends (libFuzzer's time limit ends with exit(), which runs this destructor); a crash
// leaves it, beside the crash input.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    const std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    path = base / ("hlm_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline const std::filesystem::path& scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

// Writes the input to <scratch>/<rel> (folders created) and returns the path.
inline std::string write_input(const std::uint8_t* data, std::size_t size, const std::string& rel) {
  const auto p = scratch_dir() / rel;
  std::filesystem::create_directories(p.parent_path());
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return p.string();
}

inline std::string as_string(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace hlm::fuzz
