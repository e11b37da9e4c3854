// Row tails of the SIMD kernels (ops/simd_math-inl.h load_part / store_part): a kernel must not read or write past
// the end of a row whose length is not a multiple of the vector width. Each array here ends where an inaccessible
// page begins, so an access past its end faults instead of going unnoticed (a whole-vector masked load or
// load-blend-store, as Highway's NEON target implements MaskedLoad / BlendedStore, would); the results must be
// bitwise those of the same call on ordinary arrays. Row lengths 7 and 6 leave a partial vector on every target
// with more than one lane. Runs on the best target and, through simd_fallback_kernels, on the fallback.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/gated_unit.h"
#include "ops/l2norm.h"
#include "ops/rmsnorm.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

// n values of T ending exactly at the start of a PROT_NONE page.
template <typename T>
class GuardedArray {
 public:
  explicit GuardedArray(const std::vector<T>& init) : n_(init.size()) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), bytes = n_ * sizeof(T);
    const size_t data_pages = (bytes + page - 1) / page;
    size_ = (data_pages + 1) * page;
    void* base = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    HLM_CHECK(base != MAP_FAILED, "GuardedArray: mmap of {} bytes failed", size_);
    base_ = static_cast<char*>(base);
    HLM_CHECK(mprotect(base_ + data_pages * page, page, PROT_NONE) == 0, "GuardedArray: mprotect failed");
    data_ = reinterpret_cast<T*>(base_ + data_pages * page - bytes);
    std::memcpy(data_, init.data(), bytes);
  }
  GuardedArray(const GuardedArray&) = delete;
  GuardedArray& operator=(const GuardedArray&) = delete;
  ~GuardedArray() { munmap(base_, size_); }
  T* data() { return data_; }
  std::vector<T> values() const { return std::vector<T>(data_, data_ + n_); }

 private:
  size_t n_, size_ = 0;
  char* base_ = nullptr;
  T* data_ = nullptr;
};

// Runs `op` on ordinary copies of `arrays` and on guarded copies; every array (inputs too: they must be left as
// they were) must come out bitwise the same.
template <typename T, typename Op>
void expect_same_on_guarded(const std::vector<std::vector<T>>& arrays, const Op& op, const char* what) {
  std::vector<std::vector<T>> plain = arrays;
  std::vector<T*> pp;
  for (auto& a : plain) pp.push_back(a.data());
  op(pp);
  std::vector<std::unique_ptr<GuardedArray<T>>> guarded;
  std::vector<T*> gp;
  for (const auto& a : arrays) {
    guarded.push_back(std::make_unique<GuardedArray<T>>(a));
    gp.push_back(guarded.back()->data());
  }
  op(gp);
  for (size_t i = 0; i < arrays.size(); ++i) {
    const std::vector<T> got = guarded[i]->values();
    EXPECT_EQ(std::memcmp(got.data(), plain[i].data(), got.size() * sizeof(T)), 0) << what << ": array " << i;
  }
}

std::vector<double> randn_double(size_t n, uint64_t seed) { return cast<double>(randn(n, seed)); }

}  // namespace

TEST(SimdTails, RmsNormAndGatedUnitsStayInsideTheirRows) {
  const i64 N = 5, D = 7;
  const size_t nd = static_cast<size_t>(N * D), n = static_cast<size_t>(N);
  expect_same_on_guarded<float>({randn(nd, 1), randn(static_cast<size_t>(D), 2), nan_vec(nd), nan_vec(n)},
                                [&](const std::vector<float*>& p) {
                                  ops::rmsnorm_forward(p[0], p[1], p[2], p[3], N, D, 1e-6f);
                                },
                                "rmsnorm_forward");
  // x, w, rstd (from a forward), dy, dx, dw
  std::vector<float> x = randn(nd, 3), w = randn(static_cast<size_t>(D), 4), y(nd), rstd(n);
  ops::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, D, 1e-6f);
  expect_same_on_guarded<float>({x, w, rstd, randn(nd, 5), nan_vec(nd), randn(static_cast<size_t>(D), 6)},
                                [&](const std::vector<float*>& p) {
                                  ops::rmsnorm_backward(p[0], p[1], p[2], p[3], p[4], p[5], N, D);
                                },
                                "rmsnorm_backward");
  const i64 F = 7;
  const size_t nf = static_cast<size_t>(N * F);
  expect_same_on_guarded<float>({randn(2 * nf, 7), nan_vec(nf)},
                                [&](const std::vector<float*>& p) { ops::swiglu_forward(p[0], p[1], N, F); },
                                "swiglu_forward");
  expect_same_on_guarded<float>({randn(2 * nf, 8), randn(nf, 9), nan_vec(2 * nf), nan_vec(nf)},
                                [&](const std::vector<float*>& p) { ops::swiglu_backward(p[0], p[1], p[2], N, F, p[3]); },
                                "swiglu_backward");
  expect_same_on_guarded<float>({randn(2 * nf, 17), nan_vec(nf)},
                                [&](const std::vector<float*>& p) { ops::geglu_forward(p[0], p[1], N, F); },
                                "geglu_forward");
  expect_same_on_guarded<float>({randn(2 * nf, 18), randn(nf, 19), nan_vec(2 * nf), nan_vec(nf)},
                                [&](const std::vector<float*>& p) {
                                  ops::geglu_backward(p[0], p[1], p[2], N, F, p[3]);
                                },
                                "geglu_backward");
}

TEST(SimdTails, L2NormStaysInsideItsRowsInFloatAndDouble) {
  const i64 N = 3, H = 2, K = 7;
  const size_t nk = static_cast<size_t>(N * H * K), nh = static_cast<size_t>(N * H);
  expect_same_on_guarded<float>({randn(nk, 10), nan_vec(nk), nan_vec(nh)},
                                [&](const std::vector<float*>& p) {
                                  ops::l2norm_forward<float>(p[0], H * K, p[1], H * K, p[2], N, H, K);
                                },
                                "l2norm_forward<float>");
  expect_same_on_guarded<float>({randn(nk, 11), randn(nh, 12), randn(nk, 13), nan_vec(nk)},
                                [&](const std::vector<float*>& p) {
                                  ops::l2norm_backward<float>(p[0], H * K, p[1], p[2], H * K, p[3], H * K, N, H, K);
                                },
                                "l2norm_backward<float>");
  expect_same_on_guarded<double>({randn_double(nk, 14), std::vector<double>(nk), std::vector<double>(nh)},
                                 [&](const std::vector<double*>& p) {
                                   ops::l2norm_forward<double>(p[0], H * K, p[1], H * K, p[2], N, H, K);
                                 },
                                 "l2norm_forward<double>");
}

TEST(SimdTails, AttentionWithAHeadWidthOfSixStaysInsideItsRows) {
  ops::AttentionArgs s;
  s.B = 1, s.T = 37, s.H = 2, s.Hkv = 1, s.hd = 6, s.window = 20;
  const size_t nq = static_cast<size_t>(s.T * s.H * s.hd), nkv = static_cast<size_t>(s.T * s.Hkv * s.hd);
  const size_t nl = static_cast<size_t>(s.H * s.T);
  // q, k, v, o, lse, dout, dq, dk, dv
  expect_same_on_guarded<float>({randn(nq, 15), randn(nkv, 16), randn(nkv, 17), nan_vec(nq), nan_vec(nl),
                                 randn(nq, 18), nan_vec(nq), nan_vec(nkv), nan_vec(nkv)},
                                [&](const std::vector<float*>& p) {
                                  ops::AttentionArgs a = s;
                                  a.q = p[0], a.k = p[1], a.v = p[2];
                                  ops::attention_forward(a, p[3], p[4]);
                                  ops::attention_backward(a, p[3], p[4], p[5], {p[6], p[7], p[8]});
                                },
                                "attention");
}
