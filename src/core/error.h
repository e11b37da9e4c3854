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
