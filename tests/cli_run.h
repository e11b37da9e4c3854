#pragma once
// Running the `hybridlm` binary from a test: a scratch folder per test process (removed at exit unless
// HLM_KEEP_TEST_FILES is set), the command's exit code, stdout and stderr, and the one-line error check.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace hlm::testing {

struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& prefix)
      : path(std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!std::getenv("HLM_KEEP_TEST_FILES")) std::filesystem::remove_all(path, ec);
  }
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct CliResult {
  int code = -1;
  std::string out, err;
};

// `hybridlm <args>` with its output captured in files under `scratch`.
inline CliResult run_cli(const std::filesystem::path& scratch, const std::string& args) {
  const std::string out = (scratch / "stdout.txt").string(), err = (scratch / "stderr.txt").string();
  const std::string cmd = std::string(HLM_BINARY) + " " + args + " >" + out + " 2>" + err;
  const int st = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// A refused command: non-zero exit, an "error: " line, and `needle` in stderr.
inline void expect_cli_error(const CliResult& r, const std::string& needle) {
  EXPECT_NE(r.code, 0) << "stdout: " << r.out;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "want '" << needle << "' in stderr: " << r.err;
}

}  // namespace hlm::testing
