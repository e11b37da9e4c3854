#include "core/machine.h"

#include <fstream>

namespace hlm {

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    // x86: "model name\t: AMD EPYC 7B13"; ARM Linux may give only "CPU part", so keep the fallback below.
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto begin = line.find_first_not_of(" \t", colon + 1);
    if (begin != std::string::npos) return line.substr(begin);
  }
  return "unknown CPU";
}

}  // namespace hlm
