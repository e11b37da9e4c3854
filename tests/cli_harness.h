#pragma once
// Runs the hybridlm binary in tests: scratch folders (one shared one with a small text corpus), the command's
// exit code, stdout and stderr, and the checks every bad input must pass (non-zero exit, an "error: " line
// naming it; in the library, an hlm::Error naming it).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"

namespace hlm::testing {

struct CliResult {
  int code = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
};

// A scratch folder per test process, removed at exit unless HLM_KEEP_TEST_FILES is set.
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

// The shared scratch folder of the CLI tests (removed at exit like every ScratchDir), with a small corpus.
inline const std::filesystem::path& cli_tmp_root() {
  namespace fs = std::filesystem;
  static const ScratchDir dir("hlm_cli_test_");
  static const bool filled = [] {
    const fs::path& d = dir.path;
    fs::create_directories(d / "corpus");
    for (int i = 0; i < 6; ++i) {
      std::ofstream f(d / "corpus" / ("doc" + std::to_string(i) + ".txt"));
      for (int j = 0; j < 200; ++j) f << "Document " << i << " line " << j << ": the quick brown fox jumps.\n";
    }
    fs::create_directories(d / "empty");
    ::setenv("HLM_DATA_CACHE", (d / "cache").c_str(), 1);
    return true;
  }();
  (void)filled;
  return dir.path;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

#ifdef HLM_BINARY  // not in the sanitized reader tests, which build without the CLI (docs/reliability.md)
// `hybridlm <args>` with stdout and stderr captured in files under `dir`; `prefix` runs before the binary in
// the same shell (e.g. "ulimit -f 64;").
inline CliResult run_cli_in(const std::filesystem::path& dir, const std::string& args, const std::string& prefix = "") {
  const std::string out = (dir / "stdout.txt").string(), err = (dir / "stderr.txt").string();
  const std::string cmd = prefix + std::string(HLM_BINARY) + " " + args + " >" + out + " 2>" + err;
  const int st = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// The same in the shared scratch folder (the one with the corpus).
inline CliResult run_cli(const std::string& args, const std::string& prefix = "") {
  return run_cli_in(cli_tmp_root(), args, prefix);
}
#endif

inline std::string tiny_model_flags() {
  return "--preset swa128-nope --set d_model=32 --set n_layers=2 --set n_heads=2 --set n_kv_heads=2 "
         "--set head_dim=16 --set d_ff=64 --set max_seq_len=64 --set window=8 --threads 1 ";
}
inline std::string tiny_corpus_flags() {
  return "--data " + (cli_tmp_root() / "corpus").string() + " --tokenizer byte ";
}

// The message of the hlm::Error that f() throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hlm::Error& e) {
    return e.what();
  }
  return "";
}

// A clean refusal: non-zero exit (not a crash), one "error: " line that contains `needle`.
inline void expect_cli_error(const CliResult& r, const std::string& needle) {
  EXPECT_GT(r.code, 0) << "stdout: " << r.out << "\nstderr: " << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
}

}  // namespace hlm::testing
