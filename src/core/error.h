#pragma once
// The one error type of hybridlm. Every user-facing failure (bad config, bad file, bad flag) throws
// hlm::Error with a one-line message that names the file and/or field; the CLI prints it and exits 1.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace hlm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Work stopped by Ctrl-C or SIGTERM in a process that goes on after the signal (it was ignored or handled by its
// owner): not a failure of the input, so not an Error. The CLI exits 130, as a shell reports a death by SIGINT.
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(const std::string& msg) : std::runtime_error(msg) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace hlm

// Internal invariant / argument check: message starts with the op name (first format argument).
#define HLM_CHECK(cond, ...)                  \
  do {                                        \
    if (!(cond)) ::hlm::fail(__VA_ARGS__);    \
  } while (0)
