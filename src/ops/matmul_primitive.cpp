#include "ops/matmul_primitive.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/aligned.h"
#include "core/error.h"

namespace hlm::ops {
namespace {

// One primitive per operand type, shape, layout and (alpha, beta): oneDNN picks and JIT-compiles its kernel at
// creation (milliseconds), so they are kept. A training step uses a few dozen shapes.
struct Key {
  MatmulType type;
  i64 M, N, K, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (i64 v : {i64(k.type), k.M, k.N, k.K, k.lda, k.ldb, k.ldc, i64(k.ta), i64(k.tb)})
      h = (h ^ size_t(v)) * 1099511628211ull;
    h = (h ^ std::hash<float>{}(k.alpha)) * 1099511628211ull;
    return (h ^ std::hash<float>{}(k.beta)) * 1099511628211ull;
  }
};
struct Entry {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

Entry make_entry(const Key& k) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dt in = k.type == MatmulType::f32 ? dt::f32 : dt::bf16;
  const dt out = k.type == MatmulType::bf16_out ? dt::bf16 : dt::f32;
  // Logical A [M, K], B [K, N], C [M, N]; a transposed operand is the stored matrix read column-wise.
  const dnnl::memory::desc a({k.M, k.K}, in, k.ta ? dims{1, k.lda} : dims{k.lda, 1});
  const dnnl::memory::desc b({k.K, k.N}, in, k.tb ? dims{1, k.ldb} : dims{k.ldb, 1});
  const dnnl::memory::desc c({k.M, k.N}, out, dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  // The caller's thread owns the scratchpad, so one primitive can run on several threads at once.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.alpha != 1.f) attr.set_output_scales(0, {k.alpha});
  if (k.beta != 0.f) {
    dnnl::post_ops po;
    po.append_sum(k.beta);  // C = beta * C + alpha * A B
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
  return {pd, dnnl::matmul(pd)};
}

// Shared pointers: a thread may still run an entry that another thread's clear() dropped from the cache.
std::shared_ptr<const Entry> entry(const char* op, const Key& k) {
  static std::mutex mu;
  static std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(k);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 4096) cache.clear();  // inference with ever-new shapes: stay bounded
  try {
    return cache.emplace(k, std::make_shared<const Entry>(make_entry(k))).first->second;
  } catch (const dnnl::error& e) {
    throw Error(fmt::format("{}: oneDNN has no {} matmul for M={} N={} K={} on this CPU ({}: status {})", op,
                            k.type == MatmulType::f32 ? "fp32" : "bf16", k.M, k.N, k.K, e.what(),
                            static_cast<int>(e.status)));
  }
}

}  // namespace

void matmul_primitive(const char* op, MatmulType type, bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha,
                      const void* A, i64 lda, const void* B, i64 ldb, float beta, void* C, i64 ldc) {
  // The sum post-op reads C even when scaled by 0; beta == 0 therefore gets its own primitive (no post-op).
  const auto e = entry(op, {type, M, N, K, lda, ldb, ldc, trans_a, trans_b, alpha, beta});
  thread_local dnnl::stream stream(engine());
  thread_local aligned_vector<std::uint8_t> scratch;
  const dnnl::memory::desc sd = e->pd.scratchpad_desc();
  if (scratch.size() < sd.get_size()) scratch.resize(sd.get_size());
  dnnl::memory a(e->pd.src_desc(), engine(), const_cast<void*>(A));  // oneDNN's handle type is void*; read only
  dnnl::memory b(e->pd.weights_desc(), engine(), const_cast<void*>(B));
  dnnl::memory c(e->pd.dst_desc(), engine(), C);
  dnnl::memory s(sd, engine(), scratch.data());
  e->prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, s}});
  stream.wait();
}

const char* matmul_primitive_impl(MatmulType type, bool trans_a, bool trans_b, i64 M, i64 N, i64 K) {
  const i64 lda = trans_a ? M : K, ldb = trans_b ? K : N;
  // The cache keeps the entry, so the string stays valid.
  return entry("matmul_primitive_impl", {type, M, N, K, lda, ldb, N, trans_a, trans_b, 1.f, 0.f})->pd.impl_info_str();
}

}  // namespace hlm::ops
