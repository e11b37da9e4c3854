// SIMD target dispatch (core/simd_target.h): the target is reported, every target this CPU has can be forced
// and gives the same answers as the portable fallback within the fp32 bound (docs/testing.md), bitwise the same
// for any thread count; an unknown target is a clear error. Each kernel's own tests run on the best target and,
// through the ctest entry simd_fallback_kernels (HLM_SIMD=fallback), on the fallback.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/simd_target.h"
#include "ops/attention.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

struct AttnOut {
  std::vector<float> o, lse, dq, dk, dv;
};

// GQA 4:2, hd 48 (not a multiple of 16: masked vector tails), T 200 (a partial last tile), a window that cuts
// tiles, two packed documents in row 1; large enough for the kernels' parallel regions.
AttnOut run_attention() {
  ops::AttentionArgs s;
  s.B = 2, s.T = 200, s.H = 4, s.Hkv = 2, s.hd = 48, s.window = 100;
  const i64 qs = s.H * s.hd, kvs = s.Hkv * s.hd, n = s.B * s.T;
  const auto q = randn(static_cast<size_t>(n * qs), 1), k = randn(static_cast<size_t>(n * kvs), 2);
  const auto v = randn(static_cast<size_t>(n * kvs), 3), dout = randn(static_cast<size_t>(n * qs), 4);
  std::vector<int32_t> ds(static_cast<size_t>(n));
  for (i64 t = 0; t < s.T; ++t) ds[t] = 0, ds[s.T + t] = t < 61 ? 0 : 61;
  AttnOut r{nan_vec(q.size()), nan_vec(static_cast<size_t>(s.B * s.H * s.T)), nan_vec(q.size()), nan_vec(k.size()),
            nan_vec(v.size())};
  s.q = q.data(), s.q_stride = qs, s.k = k.data(), s.v = v.data(), s.kv_stride = kvs, s.doc_start = ds.data();
  ops::attention_forward(s, r.o.data(), r.lse.data());
  ops::attention_backward(s, r.o.data(), r.lse.data(), dout.data(), {r.dq.data(), r.dk.data(), r.dv.data()});
  return r;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(SimdTarget, ReportsAndForcesEveryAvailableTarget) {
  TargetGuard guard;
  const std::vector<std::string> avail = simd_targets_available();
  ASSERT_FALSE(avail.empty());
  // In the log, so a run on another machine or under emulation (scripts/check_arm64.sh) says which paths it tested.
  std::string names;
  for (const auto& t : avail) names += (names.empty() ? "" : ", ") + t;
  std::printf("simd: running %s; available %s\n", simd_target().c_str(), names.c_str());
  for (const auto& t : avail) {
    set_simd_target(t);
    EXPECT_EQ(simd_target(), t);
  }
  set_simd_target("fallback");
  EXPECT_EQ(simd_target(), avail.back());
  try {
    set_simd_target("AVX1024");
    FAIL() << "an unknown target was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AVX1024: not a SIMD target"), std::string::npos) << e.what();
  }
  EXPECT_EQ(simd_target(), avail.back()) << "a refused name changed the forced target";
  set_simd_target("best");
  EXPECT_EQ(simd_target(), avail.front());
}

TEST(SimdTarget, AttentionAgreesOnEveryTargetAndIsBitwiseEqualAcrossThreadCounts) {
  TargetGuard guard;
  set_simd_target("fallback");
  const AttnOut base = run_attention();
  // Two fp32 computations: scores over hd 48, softmax and P V over the 100-key window; gradients also sum
  // over the window of queries. Each side's depth: hd + W + W (forward), twice that + W (gradients).
  const double fwd = 48 + 100 + 100, grad = 2 * fwd + 100;
  const int old = omp_get_max_threads();
  for (const auto& t : simd_targets_available()) {
    set_simd_target(t);
    omp_set_num_threads(1);
    const AttnOut one = run_attention();
    omp_set_num_threads(3);
    const AttnOut three = run_attention();
    omp_set_num_threads(old);
    EXPECT_TRUE(bitwise_equal(one.o, three.o) && bitwise_equal(one.dq, three.dq) &&
                bitwise_equal(one.dk, three.dk) && bitwise_equal(one.dv, three.dv))
        << t << ": 1 and 3 threads differ";
    EXPECT_TRUE(close_rel(one.o, base.o, fp32_tol(2 * fwd), t + " o"));
    EXPECT_TRUE(close_rel(one.lse, base.lse, fp32_tol(2 * fwd), t + " lse"));
    EXPECT_TRUE(close_rel(one.dq, base.dq, fp32_tol(2 * grad), t + " dq"));
    EXPECT_TRUE(close_rel(one.dk, base.dk, fp32_tol(2 * grad), t + " dk"));
    EXPECT_TRUE(close_rel(one.dv, base.dv, fp32_tol(2 * grad), t + " dv"));
  }
}
