// Where the GEMM time of a run goes, by shape: preload this library into any hybridlm command and it times every
// dnnl_sgemm call (the fp32 products of ops/matmul.cpp), then prints one line per (transposes, M, N, K, beta) at
// exit, the largest total first:
//   LD_PRELOAD=build/release/libhlm_sgemm_profile.so build/release/hybridlm bench --config run/config.json --threads 1
// It wraps the symbol and forwards to oneDNN's (dlsym RTLD_NEXT); calls from several threads are summed. The narrow
// forward products that ops::matmul gives oneDNN's matmul primitive on AVX-512 CPUs do not pass through dnnl_sgemm:
// set HLM_SGEMM_ONLY=1 to see them here (or ONEDNN_VERBOSE=1, which prints each primitive's time).
// docs/performance.md says what it showed for the small study's shapes.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace {

using Sgemm = int (*)(char, char, long, long, long, float, const float*, long, const float*, long, float, float*, long);
using Shape = std::tuple<char, char, long, long, long, bool>;  // trans_a, trans_b, M, N, K, beta != 0

struct Totals {
  double seconds = 0;
  long calls = 0;
};

class Profile {
 public:
  Profile() : start_(std::chrono::steady_clock::now()) {}
  void add(const Shape& s, double seconds) {
    const std::lock_guard<std::mutex> lock(mu_);
    Totals& t = by_shape_[s];
    t.seconds += seconds;
    ++t.calls;
  }
  ~Profile() {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::vector<std::pair<Shape, Totals>> rows(by_shape_.begin(), by_shape_.end());
    std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
    double total = 0;
    for (auto& r : rows) total += r.second.seconds;
    std::fprintf(stderr, "sgemm profile: %.3f s in dnnl_sgemm of %.3f s since load (%.0f%%)\n", total, wall,
                 wall > 0 ? 100 * total / wall : 0.0);
    std::fprintf(stderr, "%-2s %7s %7s %7s %4s %9s %10s %8s\n", "op", "M", "N", "K", "beta", "calls", "total ms",
                 "GFLOP/s");
    for (auto& [s, t] : rows) {
      const auto [ta, tb, M, N, K, beta] = s;
      const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) * t.calls;
      std::fprintf(stderr, "%c%c %7ld %7ld %7ld %4d %9ld %10.1f %8.1f\n", ta, tb, M, N, K, beta ? 1 : 0, t.calls,
                   1e3 * t.seconds, flops / t.seconds / 1e9);
    }
  }

 private:
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::map<Shape, Totals> by_shape_;
};

Profile& profile() {
  static Profile p;
  return p;
}
const bool kStartedAtLoad = (profile(), true);  // "since load" counts from here, not from the first call

}  // namespace

extern "C" int dnnl_sgemm(char ta, char tb, long M, long N, long K, float alpha, const float* A, long lda,
                          const float* B, long ldb, float beta, float* C, long ldc) {
  static const Sgemm real = reinterpret_cast<Sgemm>(dlsym(RTLD_NEXT, "dnnl_sgemm"));
  if (!real) {
    std::fprintf(stderr, "sgemm profile: no dnnl_sgemm after this library (is the program linked with oneDNN?)\n");
    return 1;  // dnnl_invalid_arguments
  }
  Profile& p = profile();
  const auto t0 = std::chrono::steady_clock::now();
  const int status = real(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  p.add({ta, tb, M, N, K, beta != 0.f}, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return status;
}
