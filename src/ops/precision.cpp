#include "ops/precision.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>

#include "core/error.h"
#include "ops/matmul_bf16.h"

namespace hlm::ops {

namespace {
std::atomic<Precision> g_precision{Precision::fp32};

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "SSE4.1";
    case dnnl::cpu_isa::avx: return "AVX";
    case dnnl::cpu_isa::avx2: return "AVX2";
    case dnnl::cpu_isa::avx2_vnni: return "AVX2 + VNNI";
    case dnnl::cpu_isa::avx512_core: return "AVX-512";
    case dnnl::cpu_isa::avx512_core_vnni: return "AVX-512 + VNNI";
    case dnnl::cpu_isa::avx512_core_bf16: return "AVX-512 + AVX512_BF16";
    case dnnl::cpu_isa::avx512_core_amx: return "AVX-512 + AMX";
    default: return "a CPU oneDNN has no x86-64 JIT level for";
  }
}
}  // namespace

Precision parse_precision(const std::string& name, const std::string& where) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  throw Error(fmt::format("{}: unknown precision '{}' (fp32 | bf16)", where, name));
}

const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

std::string bf16_native_missing() {
#if defined(__x86_64__)
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  const auto bits = static_cast<unsigned>(isa), need = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if ((bits & need) == need) return "";  // AVX512_BF16, or AMX (whose level includes it)
  return fmt::format(
      "bf16 needs a CPU with native bf16 matmuls (AVX512_BF16 or AMX-BF16: Intel Cooper Lake / Sapphire Rapids and "
      "later, AMD Zen 4 and later); oneDNN finds {} here, where bf16 would be emulated or unavailable and slower "
      "than fp32 (ONEDNN_MAX_CPU_ISA, if set, caps what it finds)",
      isa_name(isa));
#else
  return "bf16 matmuls are only wired to oneDNN's x86-64 kernels (AVX512_BF16 / AMX); this build is not x86-64";
#endif
}

bool bf16_matmul_available() {
  try {
    const bf16 a[4] = {to_bf16(1.f), to_bf16(2.f), to_bf16(3.f), to_bf16(4.f)};
    float c[4] = {};
    matmul_bf16(false, false, 2, 2, 2, 1.f, a, 2, a, 2, 0.f, c, 2);
    return c[0] == 7.f && c[3] == 22.f;
  } catch (const Error&) {
    return false;
  }
}

void require_supported(Precision p, const std::string& where) {
  if (p != Precision::bf16) return;
  const std::string missing = bf16_native_missing();
  if (!missing.empty()) throw Error(where + ": " + missing + "; use --precision fp32");
}

void set_precision(Precision p, bool allow_emulated) {
  if (!allow_emulated) require_supported(p);
  if (p == Precision::bf16 && !bf16_matmul_available())
    throw Error("--precision bf16: oneDNN has no bf16 matmul on this CPU (" + bf16_native_missing() + ")");
  g_precision.store(p);
}

Precision precision() { return g_precision.load(std::memory_order_relaxed); }

}  // namespace hlm::ops
