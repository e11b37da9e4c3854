#pragma once
// What machine a number was measured on: every benchmark and study report names the CPU beside its ISA.
#include <string>

namespace hlm {

// The CPU's model name ("AMD EPYC 7B13", from /proc/cpuinfo on Linux); "unknown CPU" where it cannot be read.
std::string cpu_model_name();

}  // namespace hlm
