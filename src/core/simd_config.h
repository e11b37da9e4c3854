#pragma once
// The SIMD targets every Highway translation unit compiles; include before any <hwy/...> header (all such
// units must agree, since the dispatcher picks one index for all of them). Compiled: AVX-512 (AVX3, and AVX3_DL
// when the build's baseline has it, below), AVX2 and the portable fallback (Highway's SCALAR or EMU128) on x86;
// NEON and the fallback on Arm. The fallback is kept even when the build's baseline is better
// (HWY_COMPILE_ALL_ATTAINABLE) so tests can force it. SSSE3/SSE4 are left out (compile time; CPUs without AVX2 run
// the fallback), and SVE too: the kernels keep vectors in arrays, which SVE's sizeless vectors do not allow.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
// A -march=native build on a CPU with Highway's AVX3_DL feature set (Ice Lake, Sapphire Rapids and later Xeons:
// AVX-VNNI, VAES, VBMI2, BITALG, ...) has AVX3_DL as its static target, which Highway 1.0.3 (Debian 12) leaves out
// of the compiled targets unless asked (its check reads an undefined macro), stopping the build with "best
// baseline should be included in dynamic targets". Ask for it exactly when the baseline has it.
#if !defined(HWY_WANT_AVX3_DL) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && defined(__AVXVNNI__) && defined(__VAES__) && defined(__VPCLMULQDQ__) &&        \
    defined(__AVX512VBMI__) && defined(__AVX512VBMI2__) && defined(__AVX512VPOPCNTDQ__) && defined(__AVX512BITALG__)
#define HWY_WANT_AVX3_DL
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
