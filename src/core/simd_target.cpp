#include "core/simd_target.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/simd_target.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/error.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::HWY_NAMESPACE {
// Compiled once per target: dispatching to it tells which target the dispatcher picks.
int64_t this_target() { return HWY_TARGET; }
}  // namespace hlm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm {
HWY_EXPORT(this_target);

namespace {

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

int64_t g_forced = 0;  // the forced target's bit, 0 = the CPU's best

void apply(const std::string& name, const char* source) {
  const std::string want = upper(name);
  if (want.empty() || want == "BEST") {
    g_forced = 0;
  } else {
    hwy::SetSupportedTargetsForTest(0);
    const std::vector<int64_t> all = hwy::SupportedAndGeneratedTargets();  // best first
    hwy::SetSupportedTargetsForTest(g_forced);  // unchanged if the name is refused below
    int64_t found = want == "FALLBACK" ? all.back() : 0;
    for (int64_t t : all)
      if (want == upper(hwy::TargetName(t))) found = t;
    HLM_CHECK(found != 0, "{}={}: not a SIMD target of this binary on this CPU (available: {})", source, name,
              joined(simd_targets_available()));
    g_forced = found;
  }
  hwy::SetSupportedTargetsForTest(g_forced);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace

void init_simd() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* e = std::getenv("HLM_SIMD")) apply(e, "HLM_SIMD");
  });
}

std::string simd_target() {
  init_simd();
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(this_target)());
}

std::vector<std::string> simd_targets_available() {
  // SupportedTargets() follows a forced target; lift it to list what the CPU can do, then put it back.
  std::vector<std::string> out;
  hwy::SetSupportedTargetsForTest(0);
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.emplace_back(hwy::TargetName(t));
  hwy::SetSupportedTargetsForTest(g_forced);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return out;
}

void set_simd_target(const std::string& name) {
  init_simd();
  apply(name, "simd target");
}

}  // namespace hlm
#endif  // HWY_ONCE
