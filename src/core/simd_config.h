#pragma once
// The SIMD targets every Highway translation unit compiles; include before any <hwy/...> header (all such
// units must agree, since the dispatcher picks one index for all of them). Compiled: AVX-512 (AVX3), AVX2 and
// the portable fallback (Highway's SCALAR or EMU128) on x86; NEON and the fallback on Arm. The fallback is kept
// even when the build's baseline is better (HWY_COMPILE_ALL_ATTAINABLE) so tests can force it. SSSE3/SSE4 are
// left out (compile time; CPUs without AVX2 run the fallback), and SVE too: the kernels keep vectors in arrays,
// which SVE's sizeless vectors do not allow.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
