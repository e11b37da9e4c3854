// Gated delta rule kernels (ops/gated_delta.h) and per-head L2 norm (ops/l2norm.h):
// a literal double-precision recurrence as the oracle, chunked == recurrent (outputs, final state and every
// gradient) at awkward lengths, central finite differences of the recurrent backward, gates at their
// extremes, packed documents == separate runs, decode steps == full forward.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "ops/bf16_pairs.h"
#include "ops/gated_delta.h"
#include "ops/precision.h"
#include "ops/l2norm.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::ops;
using namespace hlm::testing;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One problem in double: q, k, v strided (row padding holds NaN so a kernel reading it fails), the rest dense.
struct Problem {
  i64 B = 1, T = 1, H = 1, K = 4, V = 4, C = 4;
  i64 qs = 0, ks = 0, vs = 0;
  std::vector<double> q, k, v, g, beta, init;  // [B,T,H,K]/[B,T,H,V] strided; [B,T,H]; [B,H,K,V]
  bool has_init = true;
  std::vector<int32_t> ds;  // empty = no packing
};

double softplus(double x) { return x > 30 ? x : std::log1p(std::exp(x)); }

// Realistic inputs: q, k rows L2-normalised (q also scaled by K^-1/2), beta in (0,1), g = -softplus(.) in [-5, 0].
Problem make_problem(i64 B, i64 T, i64 H, i64 K, i64 V, i64 C, uint64_t seed, bool init = true) {
  Problem p;
  p.B = B, p.T = T, p.H = H, p.K = K, p.V = V, p.C = C;
  p.qs = H * K + 3, p.ks = H * K + 1, p.vs = H * V + 2;
  Rng r(seed);
  p.q.assign(B * T * p.qs, kNaN);
  p.k.assign(B * T * p.ks, kNaN);
  p.v.assign(B * T * p.vs, kNaN);
  for (i64 n = 0; n < B * T; ++n)
    for (i64 h = 0; h < H; ++h) {
      for (auto [buf, st, sc] : {std::tuple{&p.q, p.qs, 1 / std::sqrt(double(K))}, std::tuple{&p.k, p.ks, 1.0}}) {
        double* x = buf->data() + n * st + h * K;
        double ss = 0;
        for (i64 i = 0; i < K; ++i) x[i] = r.normal(), ss += x[i] * x[i];
        for (i64 i = 0; i < K; ++i) x[i] *= sc / std::sqrt(ss + 1e-6);
      }
      for (i64 i = 0; i < V; ++i) p.v[n * p.vs + h * V + i] = r.normal();
    }
  p.g.resize(B * T * H);
  p.beta.resize(B * T * H);
  for (auto& x : p.g) x = -std::min(5.0, softplus(1.5 * r.normal() - 1.0));
  for (auto& x : p.beta) x = 1 / (1 + std::exp(-1.5 * r.normal()));
  p.has_init = init;
  p.init.resize(B * H * K * V);
  for (auto& x : p.init) x = 0.5 * r.normal();
  return p;
}

// The problem in precision F with its argument struct.
template <typename F>
struct Typed {
  std::vector<F> q, k, v, g, beta, init;
  GatedDeltaArgs<F> a;
  explicit Typed(const Problem& p)
      : q(cast<F>(p.q)),
        k(cast<F>(p.k)),
        v(cast<F>(p.v)),
        g(cast<F>(p.g)),
        beta(cast<F>(p.beta)),
        init(cast<F>(p.init)) {
    a.B = p.B, a.T = p.T, a.H = p.H, a.K = p.K, a.V = p.V, a.chunk = p.C;
    a.q = q.data(), a.k = k.data(), a.v = v.data(), a.g = g.data(), a.beta = beta.data();
    a.q_stride = p.qs, a.k_stride = p.ks, a.v_stride = p.vs;
    a.initial_state = p.has_init ? init.data() : nullptr;
    a.doc_start = p.ds.empty() ? nullptr : p.ds.data();
  }
  Typed(const Typed&) = delete;
};

struct Result {
  std::vector<double> o, fin, dq, dk, dv, dg, dbeta, dinit;
};

// Dense [N, H, D] from a strided buffer; the row padding must still be NaN (never written).
template <typename F>
std::vector<double> unpad(const std::vector<F>& x, i64 N, i64 HD, i64 stride, const char* what) {
  for (i64 n = 0; n < N; ++n)
    for (i64 i = HD; i < stride; ++i) EXPECT_TRUE(std::isnan(double(x[n * stride + i]))) << what << " padding written";
  return unpack_rows(x, N, stride, 0, HD);
}

enum class Mode { Recurrent, Chunked, ChunkedSaved };

// Forward and (when dO is not empty) backward with loss = <dO, o> + <dfin, final state>.
template <typename F>
Result run(const Problem& p, Mode mode, const std::vector<double>& dO = {}, const std::vector<double>& dfin = {}) {
  Typed<F> x(p);
  const i64 N = p.B * p.T, KV = p.K * p.V;
  Result r;
  auto o = cast<F>(nan_vec(N * p.H * p.V)), fin = cast<F>(nan_vec(p.B * p.H * KV));
  std::vector<F> cs;
  if (mode == Mode::Recurrent) {
    gated_delta_recurrent_forward(x.a, o.data(), fin.data());
  } else {
    if (mode == Mode::ChunkedSaved) cs = cast<F>(nan_vec(gated_delta_chunk_states_numel(x.a)));
    gated_delta_chunked_forward(x.a, o.data(), fin.data(), cs.empty() ? nullptr : cs.data());
  }
  r.o.assign(o.begin(), o.end());
  r.fin.assign(fin.begin(), fin.end());
  if (dO.empty()) return r;
  auto dOf = cast<F>(dO), dff = cast<F>(dfin);
  auto dq = cast<F>(nan_vec(N * p.qs)), dk = cast<F>(nan_vec(N * p.ks)), dv = cast<F>(nan_vec(N * p.vs));
  auto dg = cast<F>(nan_vec(N * p.H)), db = cast<F>(nan_vec(N * p.H)), di = cast<F>(nan_vec(p.B * p.H * KV));
  GatedDeltaGrads<F> gr{dq.data(), dk.data(), dv.data(), dg.data(), db.data(), di.data()};
  const F* dfp = dfin.empty() ? nullptr : dff.data();
  if (mode == Mode::Recurrent)
    gated_delta_recurrent_backward(x.a, dOf.data(), dfp, gr);
  else
    gated_delta_chunked_backward(x.a, cs.empty() ? nullptr : cs.data(), dOf.data(), dfp, gr);
  r.dq = unpad(dq, N, p.H * p.K, p.qs, "dq");
  r.dk = unpad(dk, N, p.H * p.K, p.ks, "dk");
  r.dv = unpad(dv, N, p.H * p.V, p.vs, "dv");
  r.dg.assign(dg.begin(), dg.end());
  r.dbeta.assign(db.begin(), db.end());
  r.dinit.assign(di.begin(), di.end());
  return r;
}

// Literal recurrence in double (the oracle): S~ = a S; u = beta (v - S~^T k); S = S~ + k u^T; o = S^T q.
void naive_forward(const Problem& p, std::vector<double>& o, std::vector<double>& fin) {
  const i64 K = p.K, V = p.V;
  o.assign(p.B * p.T * p.H * V, 0);
  fin.assign(p.B * p.H * K * V, 0);
  for (i64 b = 0; b < p.B; ++b)
    for (i64 h = 0; h < p.H; ++h) {
      std::vector<double> S(K * V, 0), St(K * V), r(V), u(V);
      if (p.has_init)
        std::copy(p.init.begin() + (b * p.H + h) * K * V, p.init.begin() + (b * p.H + h + 1) * K * V, S.begin());
      for (i64 t = 0; t < p.T; ++t) {
        const i64 n = b * p.T + t;
        if (!p.ds.empty() && t > 0 && p.ds[n] == t) std::fill(S.begin(), S.end(), 0.0);
        const double a = std::exp(p.g[n * p.H + h]), be = p.beta[n * p.H + h];
        const double *q = &p.q[n * p.qs + h * K], *k = &p.k[n * p.ks + h * K], *v = &p.v[n * p.vs + h * V];
        for (i64 i = 0; i < K * V; ++i) St[i] = a * S[i];
        for (i64 j = 0; j < V; ++j) {
          r[j] = 0;
          for (i64 i = 0; i < K; ++i) r[j] += St[i * V + j] * k[i];
          u[j] = be * (v[j] - r[j]);
        }
        for (i64 i = 0; i < K; ++i)
          for (i64 j = 0; j < V; ++j) S[i * V + j] = St[i * V + j] + k[i] * u[j];
        for (i64 j = 0; j < V; ++j) {
          double s = 0;
          for (i64 i = 0; i < K; ++i) s += S[i * V + j] * q[i];
          o[(n * p.H + h) * V + j] = s;
        }
      }
      std::copy(S.begin(), S.end(), fin.begin() + (b * p.H + h) * K * V);
    }
}

std::vector<double> rand_like(size_t n, uint64_t seed) { return to_double(randn(n, seed)); }

void expect_fwd(const Result& got, const Result& want, double tol, const std::string& what) {
  EXPECT_TRUE(close_rel(got.o, want.o, tol, what + " o"));
  EXPECT_TRUE(close_rel(got.fin, want.fin, tol, what + " final_state"));
}

void expect_bwd(const Result& got, const Result& want, double tol, const std::string& what, bool with_init = true) {
  EXPECT_TRUE(close_rel(got.dq, want.dq, tol, what + " dq"));
  EXPECT_TRUE(close_rel(got.dk, want.dk, tol, what + " dk"));
  EXPECT_TRUE(close_rel(got.dv, want.dv, tol, what + " dv"));
  EXPECT_TRUE(close_rel(got.dg, want.dg, tol, what + " dg"));
  EXPECT_TRUE(close_rel(got.dbeta, want.dbeta, tol, what + " dbeta"));
  if (with_init) {
    EXPECT_TRUE(close_rel(got.dinit, want.dinit, tol, what + " d_initial_state"));
  }
}

// fp32 error depth of the gated delta rule (testing.h fp32_tol, docs/testing.md): tokens summed into the
// state (T), K for each of the S k and q S products, C in the within-chunk triangular solve. Gradients: the
// forward's and the backward's chains plus dg's and dbeta's sums over the K x V state per token.
double delta_depth(const Problem& p) { return fp32_depth({double(p.T), double(2 * p.K), double(p.C)}); }
double delta_grad_depth(const Problem& p) { return 2 * delta_depth(p) + double(p.K * p.V); }

struct Cfg {
  i64 B, T, H, K, V, C;
  bool init;
};
std::string name(const Cfg& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) +
         " K=" + std::to_string(c.K) + " V=" + std::to_string(c.V) + " C=" + std::to_string(c.C) +
         (c.init ? " init" : " zero-init");
}

// Awkward lengths: T not a multiple of C, T < C, T = 1, T a multiple of C, several heads, B > 1, K != V.
const std::vector<Cfg> kShapes = {
    {2, 37, 3, 8, 12, 8, true}, {1, 5, 2, 6, 5, 8, true},    {2, 1, 2, 5, 7, 4, true},
    {1, 32, 1, 8, 8, 8, true},  {3, 19, 2, 4, 9, 16, false}, {1, 23, 1, 7, 3, 1, true},
};

}  // namespace

TEST(GatedDelta, RecurrentMatchesLiteralRecurrence) {
  for (const Cfg& c : kShapes) {
    Problem p = make_problem(c.B, c.T, c.H, c.K, c.V, c.C, 1, c.init);
    Result want;
    naive_forward(p, want.o, want.fin);
    expect_fwd(run<double>(p, Mode::Recurrent), want, 1e-13, "double recurrent " + name(c));
    // fp32 state and products over <= 37 steps: a few ulps of the output scale.
    expect_fwd(run<float>(p, Mode::Recurrent), want, fp32_tol(delta_depth(p)), "float recurrent " + name(c));
  }
}

TEST(GatedDelta, ChunkedMatchesRecurrentInDouble) {
  for (const Cfg& c : kShapes) {
    Problem p = make_problem(c.B, c.T, c.H, c.K, c.V, c.C, 2, c.init);
    auto dO = rand_like(p.B * p.T * p.H * p.V, 3), dfin = rand_like(p.B * p.H * p.K * p.V, 4);
    Result want = run<double>(p, Mode::Recurrent, dO, dfin);
    for (Mode m : {Mode::Chunked, Mode::ChunkedSaved}) {
      Result got = run<double>(p, m, dO, dfin);
      const std::string what = std::string(m == Mode::Chunked ? "chunked " : "chunked(saved) ") + name(c);
      expect_fwd(got, want, 1e-13, what);
      expect_bwd(got, want, 1e-13, what);
    }
    // Without d_final_state (nullptr = zeros).
    Result want0 = run<double>(p, Mode::Recurrent, dO, {});
    expect_bwd(run<double>(p, Mode::Chunked, dO, {}), want0, 1e-13, "no d_final " + name(c));
  }
}

TEST(GatedDelta, ChunkedFloatMatchesDoubleAtModelSize) {
  // K = V = 64, C = 64, T = 150 (two full chunks and a tail of 22), B = 2, H = 2.
  Problem p = make_problem(2, 150, 2, 64, 64, 64, 5);
  auto dO = rand_like(p.B * p.T * p.H * p.V, 6), dfin = rand_like(p.B * p.H * p.K * p.V, 7);
  Result want = run<double>(p, Mode::Recurrent, dO, dfin);
  // Float recurrent (the decode path) for scale, then the chunked float kernel, both vs the double oracle.
  Result rec = run<float>(p, Mode::Recurrent, dO, dfin);
  expect_fwd(rec, want, fp32_tol(delta_depth(p)), "float recurrent");
  expect_bwd(rec, want, fp32_tol(delta_grad_depth(p)), "float recurrent");
  for (Mode m : {Mode::Chunked, Mode::ChunkedSaved}) {
    Result got = run<float>(p, m, dO, dfin);
    expect_fwd(got, want, fp32_tol(delta_depth(p)), "float chunked");
    expect_bwd(got, want, fp32_tol(delta_grad_depth(p)), "float chunked");
  }
}

TEST(GatedDelta, RecurrentBackwardMatchesFiniteDifferences) {
  for (bool packed : {false, true}) {
    Problem p = make_problem(2, 7, 2, 3, 4, 3, 8);
    if (packed) p.ds = doc_start_from_lengths(7, {{3, 4}, {1, 2, 4}});
    const i64 N = p.B * p.T;
    auto wo = rand_like(N * p.H * p.V, 9), wf = rand_like(p.B * p.H * p.K * p.V, 10);
    auto loss = [&]() {
      std::vector<double> o, fin;
      naive_forward(p, o, fin);
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i) l += wo[i] * o[i];
      for (size_t i = 0; i < fin.size(); ++i) l += wf[i] * fin[i];
      return l;
    };
    Result got = run<double>(p, Mode::Recurrent, wo, wf);
    auto check = [&](std::vector<double>& x, i64 rows, i64 width, i64 stride, const std::vector<double>& grad,
                     const char* what) {
      std::vector<double> fd;
      for (i64 n = 0; n < rows; ++n)
        for (i64 i = 0; i < width; ++i) fd.push_back(fd_grad(x, n * stride + i, loss, 1e-6));
      EXPECT_TRUE(close_rel(grad, fd, 1e-8, std::string(what) + (packed ? " (packed)" : "")));
    };
    check(p.q, N, p.H * p.K, p.qs, got.dq, "dq");
    check(p.k, N, p.H * p.K, p.ks, got.dk, "dk");
    check(p.v, N, p.H * p.V, p.vs, got.dv, "dv");
    check(p.g, N, p.H, p.H, got.dg, "dg");
    check(p.beta, N, p.H, p.H, got.dbeta, "dbeta");
    check(p.init, p.B * p.H, p.K * p.V, p.K * p.V, got.dinit, "d_initial_state");
  }
}

TEST(GatedDelta, GatesAtExtremes) {
  struct Gate {
    const char* name;
    std::function<double(Rng&)> g, beta;
  };
  const std::vector<Gate> gates = {
      {"alpha=1 (g=0)", [](Rng&) { return 0.0; }, [](Rng& r) { return r.uniform(0.05, 0.95); }},
      {"alpha~0 (g=-20)", [](Rng&) { return -20.0; }, [](Rng& r) { return r.uniform(0.05, 0.95); }},
      {"beta~0", [](Rng& r) { return -r.uniform(0, 5); }, [](Rng&) { return 1e-4; }},
      {"beta~1", [](Rng& r) { return -r.uniform(0, 5); }, [](Rng&) { return 0.9999; }},
      {"g=0 and beta~1", [](Rng&) { return 0.0; }, [](Rng&) { return 0.9999; }},
      {"mixed extremes", [](Rng& r) { return r.uniform() < 0.5 ? -20.0 : -1e-4; },
       [](Rng& r) { return r.uniform() < 0.5 ? 1e-4 : 0.9999; }},
  };
  for (const Gate& gt : gates) {
    Problem p = make_problem(2, 45, 2, 16, 16, 16, 11);
    Rng r(12);
    for (auto& x : p.g) x = gt.g(r);
    for (auto& x : p.beta) x = gt.beta(r);
    auto dO = rand_like(p.B * p.T * p.H * p.V, 13), dfin = rand_like(p.B * p.H * p.K * p.V, 14);
    Result want = run<double>(p, Mode::Recurrent, dO, dfin);
    Result naive;
    naive_forward(p, naive.o, naive.fin);
    expect_fwd(want, naive, 1e-13, std::string("double recurrent vs literal, ") + gt.name);
    Result got = run<double>(p, Mode::Chunked, dO, dfin);
    expect_fwd(got, want, 1e-13, std::string("double chunked, ") + gt.name);
    expect_bwd(got, want, 1e-13, std::string("double chunked, ") + gt.name);
    Result gr = run<float>(p, Mode::Recurrent, dO, dfin);
    expect_fwd(gr, want, fp32_tol(delta_depth(p)), std::string("float recurrent, ") + gt.name);
    expect_bwd(gr, want, fp32_tol(delta_grad_depth(p)), std::string("float recurrent, ") + gt.name);
    Result gf = run<float>(p, Mode::Chunked, dO, dfin);
    expect_fwd(gf, want, fp32_tol(delta_depth(p)), std::string("float chunked, ") + gt.name);
    expect_bwd(gf, want, fp32_tol(delta_grad_depth(p)), std::string("float chunked, ") + gt.name);
  }
}

namespace {

// Packed rows == each document run on its own: the first document of a row starts from the row's initial
// state, the others from zero; the row's final state is its last document's; d_final_state only reaches
// the last document and d_initial_state only comes from the first.
template <typename F>
void check_packing(Mode mode, double tol) {
  const i64 T = 37, H = 2, K = 8, V = 6, C = 8;
  const std::vector<std::vector<i64>> rows = {{5, 20, 1, 11}, {16, 21}, {37}};
  Problem p = make_problem(3, T, H, K, V, C, 15);
  p.ds = doc_start_from_lengths(T, rows);
  auto dO = rand_like(p.B * T * H * V, 16), dfin = rand_like(p.B * H * K * V, 17);
  Result got = run<F>(p, mode, dO, dfin);
  const i64 KV = K * V;
  for (i64 b = 0; b < p.B; ++b) {
    i64 t0 = 0;
    for (size_t di = 0; di < rows[b].size(); ++di) {
      const i64 len = rows[b][di];
      const bool first = di == 0, last = di + 1 == rows[b].size();
      Problem s = p;
      s.B = 1, s.T = len, s.ds.clear();
      auto rows_of = [&](const std::vector<double>& x, i64 w) {
        return std::vector<double>(x.begin() + (b * T + t0) * w, x.begin() + (b * T + t0 + len) * w);
      };
      s.q = rows_of(p.q, p.qs), s.k = rows_of(p.k, p.ks), s.v = rows_of(p.v, p.vs);
      s.g = rows_of(p.g, H), s.beta = rows_of(p.beta, H);
      s.has_init = first;
      s.init.assign(p.init.begin() + b * H * KV, p.init.begin() + (b + 1) * H * KV);
      std::vector<double> sdfin;
      if (last) sdfin.assign(dfin.begin() + b * H * KV, dfin.begin() + (b + 1) * H * KV);
      Result want = run<F>(s, mode, rows_of(dO, H * V), sdfin);
      const std::string what = "row " + std::to_string(b) + " doc " + std::to_string(di);
      auto sl = [&](const std::vector<double>& x, i64 w) { return rows_of(x, w); };
      EXPECT_TRUE(close_rel(sl(got.o, H * V), want.o, tol, what + " o"));
      EXPECT_TRUE(close_rel(sl(got.dq, H * K), want.dq, tol, what + " dq"));
      EXPECT_TRUE(close_rel(sl(got.dk, H * K), want.dk, tol, what + " dk"));
      EXPECT_TRUE(close_rel(sl(got.dv, H * V), want.dv, tol, what + " dv"));
      EXPECT_TRUE(close_rel(sl(got.dg, H), want.dg, tol, what + " dg"));
      EXPECT_TRUE(close_rel(sl(got.dbeta, H), want.dbeta, tol, what + " dbeta"));
      auto state_of = [&](const std::vector<double>& x) {
        return std::vector<double>(x.begin() + b * H * KV, x.begin() + (b + 1) * H * KV);
      };
      if (last) {
        EXPECT_TRUE(close_rel(state_of(got.fin), want.fin, tol, what + " final_state"));
      }
      if (first) {
        EXPECT_TRUE(close_rel(state_of(got.dinit), want.dinit, tol, what + " d_initial_state"));
      }
      t0 += len;
    }
  }
}

}  // namespace

TEST(GatedDelta, PackedDocumentsMatchSeparateRuns) {
  // Same code path per document, so double agrees to rounding; float to a few ulps.
  check_packing<double>(Mode::Recurrent, 1e-13);
  check_packing<double>(Mode::Chunked, 1e-13);
  check_packing<double>(Mode::ChunkedSaved, 1e-13);
  check_packing<float>(Mode::Recurrent, 1e-6);
  check_packing<float>(Mode::Chunked, 1e-6);
}

TEST(GatedDelta, PackedChunkedMatchesPackedRecurrent) {
  // Document boundaries at every offset inside a chunk, incl. one-token documents and a boundary at t = 1.
  Problem p = make_problem(2, 40, 2, 8, 8, 16, 18);
  p.ds = doc_start_from_lengths(40, {{1, 3, 13, 1, 1, 17, 4}, {16, 17, 7}});
  auto dO = rand_like(p.B * p.T * p.H * p.V, 19), dfin = rand_like(p.B * p.H * p.K * p.V, 20);
  Result want = run<double>(p, Mode::Recurrent, dO, dfin);
  Result naive;
  naive_forward(p, naive.o, naive.fin);
  expect_fwd(want, naive, 1e-13, "packed recurrent vs literal");
  Result got = run<double>(p, Mode::Chunked, dO, dfin);
  expect_fwd(got, want, 1e-13, "packed chunked");
  expect_bwd(got, want, 1e-13, "packed chunked");
  // dg of a document's first token is exactly irrelevant (it decays a zero state).
  for (i64 n = 0; n < p.B * p.T; ++n) {
    if (n % p.T == 0 || p.ds[n] != n % p.T) continue;
    for (i64 h = 0; h < p.H; ++h) EXPECT_NEAR(got.dg[n * p.H + h], 0.0, 1e-12);
  }
}

namespace {

template <typename F>
void check_step() {
  // Prefill 13 tokens with the chunked kernel, then decode the remaining 8 one at a time.
  Problem p = make_problem(2, 21, 2, 8, 6, 8, 21);
  const double tol = std::is_same_v<F, double> ? 1e-13 : fp32_tol(2 * delta_depth(p));  // two fp32 computations
  const i64 P = 13, HV = p.H * p.V, KV = p.K * p.V;
  Result full = run<F>(p, Mode::Chunked);
  Problem pre = p;
  pre.T = P;
  auto rows = [&](const std::vector<double>& x, i64 w, i64 T) {
    std::vector<double> out;
    for (i64 b = 0; b < p.B; ++b) out.insert(out.end(), x.begin() + b * p.T * w, x.begin() + (b * p.T + T) * w);
    return out;
  };
  pre.q = rows(p.q, p.qs, P), pre.k = rows(p.k, p.ks, P), pre.v = rows(p.v, p.vs, P);
  pre.g = rows(p.g, p.H, P), pre.beta = rows(p.beta, p.H, P);
  Result r = run<F>(pre, Mode::Chunked);
  std::vector<F> state(r.fin.begin(), r.fin.end());
  Typed<F> x(p);
  for (i64 t = P; t < p.T; ++t) {
    // One token per row: the row stride of the step is T rows of the full buffers.
    GatedDeltaArgs<F> a = x.a;
    a.T = 1;
    a.q = x.q.data() + t * p.qs, a.k = x.k.data() + t * p.ks, a.v = x.v.data() + t * p.vs;
    a.q_stride = p.T * p.qs, a.k_stride = p.T * p.ks, a.v_stride = p.T * p.vs;
    std::vector<F> g, be;
    for (i64 b = 0; b < p.B; ++b)
      for (i64 h = 0; h < p.H; ++h)
        g.push_back(x.g[(b * p.T + t) * p.H + h]), be.push_back(x.beta[(b * p.T + t) * p.H + h]);
    a.g = g.data(), a.beta = be.data();
    auto o = cast<F>(nan_vec(p.B * HV));
    gated_delta_step(a, state.data(), o.data());
    std::vector<double> want, got(o.begin(), o.end());
    for (i64 b = 0; b < p.B; ++b)
      want.insert(want.end(), full.o.begin() + (b * p.T + t) * HV, full.o.begin() + (b * p.T + t + 1) * HV);
    EXPECT_TRUE(close_rel(got, want, tol, "step o at t=" + std::to_string(t)));
  }
  EXPECT_TRUE(close_rel(std::vector<double>(state.begin(), state.end()), full.fin, tol, "step final state"));
  (void)KV;
}

}  // namespace

TEST(GatedDelta, StepDecodeMatchesFullForward) {
  check_step<double>();
  check_step<float>();
}

TEST(GatedDelta, SavedChunkStatesGiveBitwiseSameGradientsAndRunsAreDeterministicAcrossThreadCounts) {
  Problem p = make_problem(2, 100, 3, 32, 16, 32, 22);
  p.ds = doc_start_from_lengths(100, {{40, 60}, {100}});
  auto dO = rand_like(p.B * p.T * p.H * p.V, 23), dfin = rand_like(p.B * p.H * p.K * p.V, 24);
  Result a = run<float>(p, Mode::Chunked, dO, dfin), b = run<float>(p, Mode::ChunkedSaved, dO, dfin),
         c = run<float>(p, Mode::Chunked, dO, dfin);
  // Each (b, h) is computed by one thread with the same code, so the thread count does not matter either.
  const int nt = omp_get_max_threads();
  omp_set_num_threads(1);
  Result d = run<float>(p, Mode::Chunked, dO, dfin);
  omp_set_num_threads(nt);
  for (auto m :
       {&Result::o, &Result::fin, &Result::dq, &Result::dk, &Result::dv, &Result::dg, &Result::dbeta, &Result::dinit}) {
    EXPECT_EQ(a.*m, b.*m);
    EXPECT_EQ(a.*m, c.*m);
    EXPECT_EQ(a.*m, d.*m);
  }
}

TEST(GatedDelta, BadArgumentsThrow) {
  Problem p = make_problem(1, 6, 1, 4, 4, 4, 25);
  Typed<float> x(p);
  std::vector<float> o(64), s(16);
  auto a = x.a;
  a.T = 0;
  EXPECT_THROW(gated_delta_chunked_forward(a, o.data(), nullptr), Error);
  a = x.a;
  a.q_stride = 3;
  EXPECT_THROW(gated_delta_recurrent_forward(a, o.data(), nullptr), Error);
  a = x.a;
  a.chunk = 0;
  EXPECT_THROW(gated_delta_chunked_forward(a, o.data(), nullptr), Error);
  a = x.a;
  std::vector<int32_t> ds = {0, 0, 2, 1, 4, 4};  // token 3 points back into a closed document
  a.doc_start = ds.data();
  EXPECT_THROW(gated_delta_chunked_forward(a, o.data(), nullptr), Error);
  ds = {1, 1, 1, 1, 1, 1};
  EXPECT_THROW(gated_delta_recurrent_forward(a, o.data(), nullptr), Error);
  a = x.a;
  EXPECT_THROW(gated_delta_step(a, s.data(), o.data()), Error);  // T != 1
  a.v = nullptr;
  EXPECT_THROW(gated_delta_chunked_forward(a, o.data(), nullptr), Error);
  try {
    a = x.a;
    a.k_stride = 2;
    gated_delta_chunked_forward(a, o.data(), nullptr);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("gated_delta_chunked_forward:", 0), 0u) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------------------
// L2 norm

TEST(L2Norm, ForwardMatchesReferenceAndBackwardMatchesFiniteDifferences) {
  const i64 N = 5, H = 3, K = 7, xs = H * K + 2, ys = H * K + 1;
  const double eps = 1e-6, scale = 0.25;
  auto x = rand_like(N * xs, 30);
  x[4] = 0;  // an all-small row still behaves (eps)
  for (i64 i = 0; i < K; ++i) x[xs + K + i] = 1e-5 * (i + 1);
  auto ref = [&](const std::vector<double>& xx) {
    std::vector<double> y(N * ys, kNaN);
    for (i64 n = 0; n < N; ++n)
      for (i64 h = 0; h < H; ++h) {
        double ss = 0;
        for (i64 i = 0; i < K; ++i) ss += xx[n * xs + h * K + i] * xx[n * xs + h * K + i];
        for (i64 i = 0; i < K; ++i) y[n * ys + h * K + i] = scale * xx[n * xs + h * K + i] / std::sqrt(ss + eps);
      }
    return y;
  };
  auto want = ref(x);
  std::vector<double> y(N * ys, kNaN), rstd(N * H, kNaN);
  l2norm_forward(x.data(), xs, y.data(), ys, rstd.data(), N, H, K, eps, scale);
  EXPECT_TRUE(close_rel(unpad(y, N, H * K, ys, "y"), unpad(want, N, H * K, ys, "yref"), 1e-14, "l2norm double"));
  auto xf = cast<float>(x);
  std::vector<float> yf = cast<float>(nan_vec(N * ys)), rf(N * H);
  l2norm_forward(xf.data(), xs, yf.data(), ys, rf.data(), N, H, K, 1e-6f, 0.25f);
  EXPECT_TRUE(close_rel(unpad(yf, N, H * K, ys, "yf"), unpad(want, N, H * K, ys, "yref"), 1e-6, "l2norm float"));

  // Backward: loss = <w, y>; dx has its own stride; compare with central differences of the reference.
  const i64 dys = H * K, dxs = H * K + 4;
  auto w = rand_like(N * dys, 31);
  std::vector<double> dx(N * dxs, kNaN);
  l2norm_backward(y.data(), ys, rstd.data(), w.data(), dys, dx.data(), dxs, N, H, K, scale);
  auto loss = [&]() {
    auto yy = ref(x);
    double l = 0;
    for (i64 n = 0; n < N; ++n)
      for (i64 i = 0; i < H * K; ++i) l += w[n * dys + i] * yy[n * ys + i];
    return l;
  };
  std::vector<double> fd;
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < H * K; ++i) fd.push_back(fd_grad(x, n * xs + i, loss, 1e-7));
  EXPECT_TRUE(close_rel(unpad(dx, N, H * K, dxs, "dx"), fd, 1e-7, "l2norm backward vs FD"));
  auto wf = cast<float>(w);
  std::vector<float> dxf = cast<float>(nan_vec(N * dxs));
  l2norm_backward(yf.data(), ys, rf.data(), wf.data(), dys, dxf.data(), dxs, N, H, K, 0.25f);
  EXPECT_TRUE(close_rel(unpad(dxf, N, H * K, dxs, "dxf"), fd, 1e-5, "l2norm float backward"));
  // In place (y aliases x, dx aliases dy).
  std::vector<double> z = x, rz(N * H);
  l2norm_forward(z.data(), xs, z.data(), xs, rz.data(), N, H, K, eps, scale);
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < H * K; ++i) EXPECT_NEAR(z[n * xs + i], want[n * ys + i], 1e-15);
  EXPECT_THROW(l2norm_forward(x.data(), 3, y.data(), ys, rstd.data(), N, H, K, eps, scale), Error);
}

// Under --precision bf16 (CPUs with AVX512_BF16) the chunked kernel's products take bf16 operands (ops/kernel_blas.h,
// ops/bf16_pairs.h) with fp32 accumulation. Bound (docs/precision.md): 4 u_bf sqrt(N), N the bf16 roundings along an
// output's chain: per chunk k (twice), k and v scaled by beta, the triangular factor, W, the state, q, q k^T and the
// new values as operands (10), the chunks carried in the state; gradients the forward's and the backward's chains.
TEST(GatedDeltaBf16, ChunkedFollowsTheDoubleReferenceWithinTheBf16Bound) {
  SKIP_UNLESS_BF16_KERNELS();
  for_each_bf16_product_path([&] {
    std::vector<Problem> ps;
    for (const Cfg& c : kShapes) ps.push_back(make_problem(c.B, c.T, c.H, c.K, c.V, c.C, 8, c.init));
    ps.push_back(make_problem(2, 150, 2, 64, 64, 64, 9));  // model size: two full chunks and a tail
    for (const Problem& p : ps) {
      const std::string what = "B=" + std::to_string(p.B) + " T=" + std::to_string(p.T) + " K=" + std::to_string(p.K) +
                               " V=" + std::to_string(p.V) + " C=" + std::to_string(p.C);
      const double depth = 10.0 * static_cast<double>((p.T + p.C - 1) / p.C);
      auto dO = rand_like(p.B * p.T * p.H * p.V, 10), dfin = rand_like(p.B * p.H * p.K * p.V, 11);
      Result want = run<double>(p, Mode::Recurrent, dO, dfin);
      Result f32 = run<float>(p, Mode::Chunked, dO, dfin);
      const PrecisionScope bf(Precision::bf16, /*allow_emulated=*/true);
      for (Mode m : {Mode::Chunked, Mode::ChunkedSaved}) {
        Result got = run<float>(p, m, dO, dfin);
        expect_fwd(got, want, bf16_tol(depth), "bf16 chunked " + what);
        expect_bwd(got, want, bf16_tol(2 * depth), "bf16 chunked " + what);
        // bf16 really ran: o differs from the fp32 kernel's by more than a tenth of u_bf.
        EXPECT_GT(rel_rms_diff(got.o, f32.o), 0.1 * kBf16UnitRoundoff) << what;
      }
    }
  });
}
