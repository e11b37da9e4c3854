// Scalar-decay linear attention (Lightning / Mamba-2 SSD kernel): recurrent and chunked forms against a plain
// double reference, chunked == recurrent in float and double (forward, final state, every gradient), the
// recurrent and chunked backward against central finite differences in double, decay extremes, packed
// documents == separate runs, decode steps == full forward, saved vs recomputed chunk states.
//
// Tolerances (relative RMS, testing.h): double kernels vs double reference 1e-12 (forward) / 1e-10 (grads);
// float kernels vs double reference: fp32_tol (testing.h, docs/testing.md) of the depths below.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "ops/bf16_pairs.h"
#include "ops/precision.h"
#include "ops/scalar_decay_scan.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::ops;
using namespace hlm::testing;

namespace {

constexpr double kSentinel = 123.0;  // padding between strided head slots must survive every kernel

struct Case {
  i64 B = 1, T = 1, H = 1, Hk = 1, K = 4, V = 4, C = 64;
  double scale = 1.0;
  bool init = false;                     // non-zero initial state
  bool strided = false;                  // padded rows and head gaps in q, k, v (and their gradients)
  double glo = -1.0, ghi = 0.0;          // g ~ U[glo, ghi]
  std::vector<std::vector<i64>> docs{};  // per row: document lengths (sum T); empty = one doc per row
  uint64_t seed = 1;
};

std::string name(const Case& c) {
  return fmt::format("B={} T={} H={} Hk={} K={} V={} C={} init={} strided={} docs={} g=[{},{}]", c.B, c.T, c.H, c.Hk,
                     c.K, c.V, c.C, c.init, c.strided, !c.docs.empty(), c.glo, c.ghi);
}

// Inputs in double, laid out with the case's strides.
struct Data {
  Case cs;
  i64 qr, qh, kr, kh, vr, vh;
  std::vector<double> q, k, v, g, init;
  std::vector<int32_t> ds;

  explicit Data(const Case& c) : cs(c) {
    qh = c.strided ? c.K + 3 : c.K;
    kh = c.strided ? c.K + 1 : c.K;
    vh = c.strided ? c.V + 2 : c.V;
    qr = c.strided ? c.Hk * qh + 5 : c.Hk * c.K;
    kr = c.strided ? c.Hk * kh + 2 : c.Hk * c.K;
    vr = c.strided ? c.H * vh + 1 : c.H * c.V;
    Rng r(c.seed);
    auto fill = [&](std::vector<double>& x, i64 rows, i64 row, i64 nh, i64 hs, i64 d, double sc) {
      x.assign(rows * row, kSentinel);
      for (i64 i = 0; i < rows; ++i)
        for (i64 h = 0; h < nh; ++h)
          for (i64 e = 0; e < d; ++e) x[i * row + h * hs + e] = sc * r.normal();
    };
    const i64 BT = c.B * c.T;
    fill(q, BT, qr, c.Hk, qh, c.K, 1.0 / std::sqrt(double(c.K)));
    fill(k, BT, kr, c.Hk, kh, c.K, 1.0 / std::sqrt(double(c.K)));
    fill(v, BT, vr, c.H, vh, c.V, 1.0);
    g.resize(BT * c.H);
    for (auto& x : g) x = r.uniform(c.glo, c.ghi);
    if (c.init) {
      init.resize(c.B * c.H * c.K * c.V);
      for (auto& x : init) x = 0.5 * r.normal();
    }
    if (!c.docs.empty()) ds = doc_start_from_lengths(c.T, c.docs);
  }
  size_t o_size() const { return cs.B * cs.T * cs.H * cs.V; }
  size_t state_size() const { return cs.B * cs.H * cs.K * cs.V; }
};

template <typename R>
::testing::AssertionResult padding_kept(const std::vector<R>& x, i64 rows, i64 row, i64 nh, i64 hs, i64 d) {
  for (i64 i = 0; i < rows; ++i)
    for (i64 e = 0; e < row; ++e) {
      const i64 h = e / hs, off = e % hs;
      const bool slot = h < nh && off < d;
      if (!slot && x[i * row + e] != R(kSentinel))
        return ::testing::AssertionFailure() << "padding overwritten at row " << i << " col " << e;
    }
  return ::testing::AssertionSuccess();
}

// Plain double reference, written independently of the kernels: explicit recurrence, state per (b, h).
void reference_forward(const Data& d, std::vector<double>& o, std::vector<double>& fin) {
  const Case& c = d.cs;
  o.assign(d.o_size(), 0.0);
  fin.assign(d.state_size(), 0.0);
  for (i64 b = 0; b < c.B; ++b)
    for (i64 h = 0; h < c.H; ++h) {
      const i64 hk = h / (c.H / c.Hk);
      std::vector<double> S(c.K * c.V, 0.0);
      if (c.init)
        std::copy(d.init.begin() + (b * c.H + h) * c.K * c.V, d.init.begin() + (b * c.H + h + 1) * c.K * c.V,
                  S.begin());
      for (i64 t = 0; t < c.T; ++t) {
        const bool reset = !d.ds.empty() && t > 0 && d.ds[b * c.T + t] == t;
        const double a = reset ? 0.0 : std::exp(d.g[(b * c.T + t) * c.H + h]);
        for (i64 x = 0; x < c.K; ++x)
          for (i64 y = 0; y < c.V; ++y)
            S[x * c.V + y] = a * S[x * c.V + y] +
                             d.k[(b * c.T + t) * d.kr + hk * d.kh + x] * d.v[(b * c.T + t) * d.vr + h * d.vh + y];
        for (i64 y = 0; y < c.V; ++y) {
          double s = 0;
          for (i64 x = 0; x < c.K; ++x) s += c.scale * d.q[(b * c.T + t) * d.qr + hk * d.qh + x] * S[x * c.V + y];
          o[((b * c.T + t) * c.H + h) * c.V + y] = s;
        }
      }
      std::copy(S.begin(), S.end(), fin.begin() + (b * c.H + h) * c.K * c.V);
    }
}

// One kernel run (forward, and backward when dout is given), inputs cast to R.
template <typename R>
struct ScanRun {
  std::vector<R> q, k, v, g, init;
  std::vector<R> o, fin, states, dq, dk, dv, dg, dinit;
  ScalarDecayArgs<R> a;

  explicit ScanRun(const Data& d)
      : q(cast<R>(d.q)), k(cast<R>(d.k)), v(cast<R>(d.v)), g(cast<R>(d.g)), init(cast<R>(d.init)) {
    const Case& c = d.cs;
    a.B = c.B, a.T = c.T, a.H = c.H, a.Hk = c.Hk, a.K = c.K, a.V = c.V, a.chunk = c.C;
    a.scale = static_cast<R>(c.scale);
    a.q_stride = d.qr, a.q_head_stride = d.qh, a.k_stride = d.kr, a.k_head_stride = d.kh, a.v_stride = d.vr,
    a.v_head_stride = d.vh;
    a.q = q.data(), a.k = k.data(), a.v = v.data(), a.g = g.data();
    a.initial_state = c.init ? init.data() : nullptr;
    a.doc_start = d.ds.empty() ? nullptr : d.ds.data();
  }
  std::vector<R> nan(size_t n) { return std::vector<R>(n, std::numeric_limits<R>::quiet_NaN()); }
  std::vector<R> nan_padded(const std::vector<R>& like, i64 rows, i64 row, i64 nh, i64 hs, i64 dd) {
    std::vector<R> x(like.size(), R(kSentinel));
    for (i64 i = 0; i < rows; ++i)
      for (i64 h = 0; h < nh; ++h)
        for (i64 e = 0; e < dd; ++e) x[i * row + h * hs + e] = std::numeric_limits<R>::quiet_NaN();
    return x;
  }
  void forward(const Data& d, bool chunked, bool save_states = true) {
    o = nan(d.o_size());
    fin = nan(d.state_size());
    if (chunked) {
      states = save_states ? nan(scalar_decay_chunk_states_numel(a)) : std::vector<R>{};
      scalar_decay_chunked_forward(a, o.data(), fin.data(), save_states ? states.data() : nullptr);
    } else {
      scalar_decay_recurrent_forward(a, o.data(), fin.data());
    }
  }
  void backward(const Data& d, bool chunked, const std::vector<double>& dout, const std::vector<double>& dfin,
                bool use_states = true, R* workspace = nullptr) {
    const Case& c = d.cs;
    const i64 BT = c.B * c.T;
    auto dO = cast<R>(dout), dF = cast<R>(dfin);
    dq = nan_padded(q, BT, d.qr, c.Hk, d.qh, c.K);
    dk = nan_padded(k, BT, d.kr, c.Hk, d.kh, c.K);
    dv = nan_padded(v, BT, d.vr, c.H, d.vh, c.V);
    dg = nan(g.size());
    dinit = nan(d.state_size());
    const R* dFp = dfin.empty() ? nullptr : dF.data();
    if (chunked)
      scalar_decay_chunked_backward(a, use_states ? states.data() : nullptr, dO.data(), dFp, grad_buffers(), workspace);
    else
      scalar_decay_recurrent_backward(a, dO.data(), dFp, grad_buffers());
  }
  ScalarDecayGrads<R> grad_buffers() { return {dq.data(), dk.data(), dv.data(), dg.data(), dinit.data()}; }
  // Gradients as dense double vectors: q, k, v, g, initial state.
  std::vector<std::vector<double>> grads(const Data& d) const {
    const Case& c = d.cs;
    const i64 BT = c.B * c.T;
    return {unpack_heads(dq, BT, d.qr, 0, c.Hk, d.qh, c.K),
            unpack_heads(dk, BT, d.kr, 0, c.Hk, d.kh, c.K),
            unpack_heads(dv, BT, d.vr, 0, c.H, d.vh, c.V),
            {dg.begin(), dg.end()},
            {dinit.begin(), dinit.end()}};
  }
  ::testing::AssertionResult paddings(const Data& d) const {
    const Case& c = d.cs;
    const i64 BT = c.B * c.T;
    auto r = padding_kept(dq, BT, d.qr, c.Hk, d.qh, c.K);
    if (r) r = padding_kept(dk, BT, d.kr, c.Hk, d.kh, c.K);
    if (r) r = padding_kept(dv, BT, d.vr, c.H, d.vh, c.V);
    return r;
  }
};

const char* kGradNames[] = {"dq", "dk", "dv", "dg", "dinit"};

std::vector<Case> shape_cases() {
  std::vector<Case> cs;
  auto add = [&](Case c) { cs.push_back(c); };
  add({.B = 1, .T = 1, .H = 1, .Hk = 1, .K = 4, .V = 3, .C = 8});                                  // T = 1
  add({.B = 2, .T = 5, .H = 2, .Hk = 2, .K = 4, .V = 3, .C = 8, .init = true});                    // T < C
  add({.B = 2, .T = 37, .H = 3, .Hk = 3, .K = 8, .V = 5, .C = 8, .scale = 0.5, .init = true});     // partial tail
  add({.B = 1, .T = 40, .H = 4, .Hk = 1, .K = 6, .V = 4, .C = 8, .init = true, .strided = true});  // Hk = 1 shared
  add({.B = 3, .T = 75, .H = 4, .Hk = 2, .K = 16, .V = 8, .C = 16, .strided = true, .seed = 7});   // GQA 2:1
  add({.B = 2, .T = 130, .H = 2, .Hk = 2, .K = 32, .V = 16, .C = 64, .init = true, .seed = 9});    // default C
  add({.B = 1, .T = 63, .H = 2, .Hk = 1, .K = 8, .V = 8, .C = 1, .init = true, .seed = 11});       // C = 1
  return cs;
}

std::vector<double> rand_vec(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<double> x(n);
  for (auto& e : x) e = r.normal();
  return x;
}

// fp32 error depth of the scan (testing.h fp32_tol): tokens summed into the state (T), K per q.S product, C inside
// a chunk. Gradients: the forward's and the backward's chains, plus dg's sum over the K x V state per token.
double scan_depth(const Case& c) { return fp32_depth({double(c.T), double(c.K), double(c.C)}); }
double scan_grad_depth(const Case& c) { return 2 * scan_depth(c) + double(c.K * c.V); }

// Compares a kernel run against the reference forward and a second run's gradients.
template <typename R>
void expect_forward(const ScanRun<R>& run, const std::vector<double>& o, const std::vector<double>& fin, double tol,
                    const std::string& what) {
  EXPECT_TRUE(close_rel(run.o, o, tol, what + " o"));
  EXPECT_TRUE(close_rel(run.fin, fin, tol, what + " final_state"));
}

void expect_grads(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want, double tol,
                  const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(close_rel(got[i], want[i], tol, what + " " + kGradNames[i]));
}

}  // namespace

TEST(ScalarDecayScan, RecurrentAndChunkedForwardMatchDoubleReference) {
  for (const Case& c : shape_cases()) {
    SCOPED_TRACE(name(c));
    Data d(c);
    std::vector<double> o, fin;
    reference_forward(d, o, fin);
    for (bool chunked : {false, true}) {
      ScanRun<double> rd(d);
      rd.forward(d, chunked);
      expect_forward(rd, o, fin, 1e-12, chunked ? "chunked<double>" : "recurrent<double>");
      ScanRun<float> rf(d);
      rf.forward(d, chunked);
      expect_forward(rf, o, fin, fp32_tol(scan_depth(c)), chunked ? "chunked<float>" : "recurrent<float>");
    }
  }
}

TEST(ScalarDecayScan, ChunkedBackwardMatchesRecurrentBackward) {
  for (const Case& c : shape_cases()) {
    SCOPED_TRACE(name(c));
    Data d(c);
    auto dout = rand_vec(d.o_size(), 100 + c.seed), dfin = rand_vec(d.state_size(), 200 + c.seed);
    ScanRun<double> rec(d);
    rec.backward(d, false, dout, dfin);
    EXPECT_TRUE(rec.paddings(d));
    const auto want = rec.grads(d);
    ScanRun<double> chd(d);
    chd.forward(d, true);
    chd.backward(d, true, dout, dfin);
    EXPECT_TRUE(chd.paddings(d));
    expect_grads(chd.grads(d), want, 1e-10, "chunked<double>");
    ScanRun<float> chf(d);
    chf.forward(d, true);
    chf.backward(d, true, dout, dfin);
    EXPECT_TRUE(chf.paddings(d));
    expect_grads(chf.grads(d), want, fp32_tol(scan_grad_depth(c)), "chunked<float>");
    ScanRun<float> recf(d);
    recf.backward(d, false, dout, dfin);
    expect_grads(recf.grads(d), want, fp32_tol(scan_grad_depth(c)), "recurrent<float>");
    // Without a final-state gradient (the last chunk's carried dS is zero: a separate code path).
    ScanRun<double> rec0(d), ch0(d);
    rec0.backward(d, false, dout, {});
    ch0.forward(d, true);
    ch0.backward(d, true, dout, {});
    expect_grads(ch0.grads(d), rec0.grads(d), 1e-10, "chunked<double>, no dfinal");
  }
}

// L = <o, Wo> + <final, Wf>; both backward forms against central differences in double.
TEST(ScalarDecayScan, BackwardMatchesFiniteDifferences) {
  std::vector<Case> cases = {
      {.B = 2,
       .T = 9,
       .H = 4,
       .Hk = 2,
       .K = 3,
       .V = 2,
       .C = 4,
       .scale = 0.7,
       .init = true,
       .strided = true,
       .glo = -2.0,
       .ghi = -0.01,
       .docs = {{3, 1, 5}, {9}},
       .seed = 3},
      {.B = 1,
       .T = 11,
       .H = 2,
       .Hk = 1,
       .K = 3,
       .V = 3,
       .C = 4,
       .init = true,
       .glo = -1.0,
       .ghi = 0.0,
       .docs = {{4, 7}},
       .seed = 5},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(name(c));
    Data d(c);
    auto wo = rand_vec(d.o_size(), 31), wf = rand_vec(d.state_size(), 32);
    for (bool chunked : {false, true}) {
      auto loss = [&]() {
        ScanRun<double> r(d);
        r.forward(d, chunked);
        double l = 0;
        for (size_t i = 0; i < wo.size(); ++i) l += wo[i] * r.o[i];
        for (size_t i = 0; i < wf.size(); ++i) l += wf[i] * r.fin[i];
        return l;
      };
      ScanRun<double> r(d);
      r.forward(d, chunked);
      r.backward(d, chunked, wo, wf);
      const auto got = r.grads(d);
      const i64 BT = c.B * c.T;
      std::vector<std::vector<double>> fd(5);
      auto fd_slots = [&](std::vector<double>& x, i64 row, i64 nh, i64 hs, i64 dd, std::vector<double>& out) {
        for (i64 i = 0; i < BT; ++i)
          for (i64 h = 0; h < nh; ++h)
            for (i64 e = 0; e < dd; ++e) out.push_back(fd_grad(x, i * row + h * hs + e, loss, 1e-6));
      };
      fd_slots(d.q, d.qr, c.Hk, d.qh, c.K, fd[0]);
      fd_slots(d.k, d.kr, c.Hk, d.kh, c.K, fd[1]);
      fd_slots(d.v, d.vr, c.H, d.vh, c.V, fd[2]);
      for (size_t i = 0; i < d.g.size(); ++i) fd[3].push_back(fd_grad(d.g, i, loss, 1e-6));
      for (size_t i = 0; i < d.init.size(); ++i) fd[4].push_back(fd_grad(d.init, i, loss, 1e-6));
      expect_grads(got, fd, 1e-7, chunked ? "chunked vs FD" : "recurrent vs FD");
      // The decay of a document's first token touches nothing.
      if (!d.ds.empty())
        for (i64 b = 0; b < c.B; ++b)
          for (i64 t = 1; t < c.T; ++t)
            if (d.ds[b * c.T + t] == t) {
              for (i64 h = 0; h < c.H; ++h) EXPECT_NEAR(r.dg[(b * c.T + t) * c.H + h], 0.0, 1e-12);
            }
    }
  }
}

// Decay ~1 (g near 0: the state is a plain running sum) and decay ~0 (g = -20: each token forgets the past).
TEST(ScalarDecayScan, DecayExtremes) {
  for (auto [glo, ghi] : {std::pair{-1e-6, 0.0}, std::pair{-20.0, -20.0}, std::pair{-20.0, 0.0}}) {
    Case c{.B = 2,
           .T = 150,
           .H = 2,
           .Hk = 1,
           .K = 16,
           .V = 16,
           .C = 64,
           .init = true,
           .glo = glo,
           .ghi = ghi,
           .docs = {{150}, {20, 100, 30}},
           .seed = 17};
    SCOPED_TRACE(name(c));
    Data d(c);
    std::vector<double> o, fin;
    reference_forward(d, o, fin);
    ScanRun<float> f(d);
    f.forward(d, true);
    expect_forward(f, o, fin, fp32_tol(scan_depth(c)), "chunked<float>");
    ScanRun<double> dd(d);
    dd.forward(d, true);
    expect_forward(dd, o, fin, 1e-12, "chunked<double>");
    auto dout = rand_vec(d.o_size(), 41), dfin = rand_vec(d.state_size(), 42);
    ScanRun<double> rec(d);
    rec.backward(d, false, dout, dfin);
    dd.backward(d, true, dout, dfin);
    expect_grads(dd.grads(d), rec.grads(d), 1e-10, "chunked<double>");
    f.backward(d, true, dout, dfin);
    expect_grads(f.grads(d), rec.grads(d), fp32_tol(scan_grad_depth(c)), "chunked<float>");
  }
}

// A packed row equals its documents run one by one (the initial state only feeds the first document).
TEST(ScalarDecayScan, PackedDocumentsEqualSeparateRuns) {
  const std::vector<i64> lens = {5, 70, 1, 30, 17};  // T = 123, boundaries inside chunks of 16, one at 80
  Case packed{.B = 1,
              .T = 123,
              .H = 3,
              .Hk = 1,
              .K = 8,
              .V = 4,
              .C = 16,
              .init = true,
              .strided = true,
              .glo = -0.3,
              .ghi = 0.0,
              .docs = {lens},
              .seed = 23};
  Data dp(packed);
  auto dout = rand_vec(dp.o_size(), 51), dfin = rand_vec(dp.state_size(), 52);
  for (bool chunked : {false, true}) {
    SCOPED_TRACE(chunked ? "chunked" : "recurrent");
    ScanRun<double> rp(dp);
    rp.forward(dp, chunked);
    rp.backward(dp, chunked, dout, dfin);
    const auto gp = rp.grads(dp);
    std::vector<double> o_sep, dq_sep, dk_sep, dv_sep, dg_sep, dinit_first;
    std::vector<double> fin_last;
    i64 t0 = 0;
    for (size_t di = 0; di < lens.size(); ++di) {
      Case c = packed;
      c.T = lens[di];
      c.docs.clear();
      c.init = di == 0;
      Data d(c);
      // Copy the packed row's slice into the separate run's inputs.
      auto slice = [&](const std::vector<double>& src, std::vector<double>& dst, i64 row) {
        std::copy(src.begin() + t0 * row, src.begin() + (t0 + c.T) * row, dst.begin());
      };
      slice(dp.q, d.q, dp.qr);
      slice(dp.k, d.k, dp.kr);
      slice(dp.v, d.v, dp.vr);
      slice(dp.g, d.g, packed.H);
      if (di == 0) d.init = dp.init;
      std::vector<double> dsub(dout.begin() + t0 * packed.H * packed.V,
                               dout.begin() + (t0 + c.T) * packed.H * packed.V);
      const bool last = di + 1 == lens.size();
      ScanRun<double> r(d);
      r.forward(d, chunked);
      r.backward(d, chunked, dsub, last ? dfin : std::vector<double>{});
      o_sep.insert(o_sep.end(), r.o.begin(), r.o.end());
      auto g = r.grads(d);
      dq_sep.insert(dq_sep.end(), g[0].begin(), g[0].end());
      dk_sep.insert(dk_sep.end(), g[1].begin(), g[1].end());
      dv_sep.insert(dv_sep.end(), g[2].begin(), g[2].end());
      dg_sep.insert(dg_sep.end(), g[3].begin(), g[3].end());
      if (di == 0) dinit_first = g[4];
      if (last) fin_last = {r.fin.begin(), r.fin.end()};
      t0 += c.T;
    }
    EXPECT_TRUE(close_rel(rp.o, o_sep, 1e-12, "o"));
    EXPECT_TRUE(close_rel(rp.fin, fin_last, 1e-12, "final_state"));
    EXPECT_TRUE(close_rel(gp[0], dq_sep, 1e-11, "dq"));
    EXPECT_TRUE(close_rel(gp[1], dk_sep, 1e-11, "dk"));
    EXPECT_TRUE(close_rel(gp[2], dv_sep, 1e-11, "dv"));
    EXPECT_TRUE(close_rel(gp[3], dg_sep, 1e-11, "dg"));
    EXPECT_TRUE(close_rel(gp[4], dinit_first, 1e-11, "dinit"));
  }
}

// Prefill with the chunked forward, then decode token by token: same outputs and state as one full forward.
TEST(ScalarDecayScan, DecodeStepsMatchFullForward) {
  Case c{.B = 2,
         .T = 45,
         .H = 4,
         .Hk = 2,
         .K = 16,
         .V = 8,
         .C = 16,
         .scale = 0.25,
         .init = true,
         .strided = true,
         .seed = 29};
  const i64 T0 = 19;
  Data d(c);
  ScanRun<float> full(d);
  full.forward(d, true);
  // Prefill the first T0 tokens (a copy of the inputs restricted to those rows).
  Case cp = c;
  cp.T = T0;
  Data dpre(cp);
  for (i64 b = 0; b < c.B; ++b) {
    std::copy(d.q.begin() + b * c.T * d.qr, d.q.begin() + (b * c.T + T0) * d.qr, dpre.q.begin() + b * T0 * d.qr);
    std::copy(d.k.begin() + b * c.T * d.kr, d.k.begin() + (b * c.T + T0) * d.kr, dpre.k.begin() + b * T0 * d.kr);
    std::copy(d.v.begin() + b * c.T * d.vr, d.v.begin() + (b * c.T + T0) * d.vr, dpre.v.begin() + b * T0 * d.vr);
    std::copy(d.g.begin() + b * c.T * c.H, d.g.begin() + (b * c.T + T0) * c.H, dpre.g.begin() + b * T0 * c.H);
  }
  dpre.init = d.init;
  ScanRun<float> pre(dpre);
  pre.forward(dpre, true, /*save_states=*/false);
  std::vector<float> state = pre.fin;
  std::vector<float> step_o(c.B * c.H * c.V);
  std::vector<float> qs(c.B * d.qr), ks(c.B * d.kr), vs(c.B * d.vr), gs(c.B * c.H);
  for (i64 t = T0; t < c.T; ++t) {
    for (i64 b = 0; b < c.B; ++b) {
      std::copy(full.q.begin() + (b * c.T + t) * d.qr, full.q.begin() + (b * c.T + t + 1) * d.qr,
                qs.begin() + b * d.qr);
      std::copy(full.k.begin() + (b * c.T + t) * d.kr, full.k.begin() + (b * c.T + t + 1) * d.kr,
                ks.begin() + b * d.kr);
      std::copy(full.v.begin() + (b * c.T + t) * d.vr, full.v.begin() + (b * c.T + t + 1) * d.vr,
                vs.begin() + b * d.vr);
      std::copy(full.g.begin() + (b * c.T + t) * c.H, full.g.begin() + (b * c.T + t + 1) * c.H, gs.begin() + b * c.H);
    }
    ScalarDecayArgs<float> a = full.a;
    a.T = 1;
    a.q = qs.data(), a.k = ks.data(), a.v = vs.data(), a.g = gs.data();
    a.initial_state = nullptr;
    std::fill(step_o.begin(), step_o.end(), std::nanf(""));
    scalar_decay_step(a, state.data(), step_o.data());
    std::vector<float> want;
    for (i64 b = 0; b < c.B; ++b)
      want.insert(want.end(), full.o.begin() + (b * c.T + t) * c.H * c.V,
                  full.o.begin() + (b * c.T + t + 1) * c.H * c.V);
    ASSERT_TRUE(close_rel(step_o, want, fp32_tol(2 * scan_depth(c)), "step o at t=" + std::to_string(t)));
  }
  EXPECT_TRUE(close_rel(state, full.fin, fp32_tol(2 * scan_depth(c)), "state after decoding"));
  // The prefill's outputs are the full forward's first T0 tokens.
  std::vector<float> want_pre;
  for (i64 b = 0; b < c.B; ++b)
    want_pre.insert(want_pre.end(), full.o.begin() + b * c.T * c.H * c.V, full.o.begin() + (b * c.T + T0) * c.H * c.V);
  EXPECT_TRUE(close_rel(pre.o, want_pre, fp32_tol(2 * scan_depth(c)), "prefill o"));
}

// Saved vs recomputed chunk states, caller workspace vs internal, 1 thread vs all: bit-identical.
TEST(ScalarDecayScan, SavedStatesWorkspaceAndThreadCountGiveIdenticalBits) {
  Case c{
      .B = 2, .T = 100, .H = 4, .Hk = 1, .K = 16, .V = 8, .C = 32, .init = true, .docs = {{100}, {50, 50}}, .seed = 37};
  Data d(c);
  auto dout = rand_vec(d.o_size(), 61), dfin = rand_vec(d.state_size(), 62);
  ScanRun<float> a(d), b(d), e(d);
  a.forward(d, true);
  a.backward(d, true, dout, dfin);
  b.forward(d, true, /*save_states=*/false);
  b.backward(d, true, dout, dfin, /*use_states=*/false);
  e.forward(d, true);
  std::vector<float> ws(scalar_decay_backward_workspace_numel(e.a), std::nanf(""));
  e.backward(d, true, dout, dfin, true, ws.data());
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.fin, b.fin);
  EXPECT_EQ(a.o, e.o);
  for (auto* r : {&b, &e}) {
    EXPECT_EQ(a.dq, r->dq);
    EXPECT_EQ(a.dk, r->dk);
    EXPECT_EQ(a.dv, r->dv);
    EXPECT_EQ(a.dg, r->dg);
    EXPECT_EQ(a.dinit, r->dinit);
  }
  // With saved states the backward does not need a.initial_state again (slot 0 holds it).
  ScanRun<float> noinit(d);
  noinit.a.initial_state = nullptr;
  noinit.states = a.states;
  noinit.backward(d, true, dout, dfin);
  EXPECT_EQ(a.dq, noinit.dq);
  EXPECT_EQ(a.dg, noinit.dg);
  EXPECT_EQ(a.dinit, noinit.dinit);
  // One thread gives the same bits (no task reduces into another's output).
  const int nt = omp_get_max_threads();
  omp_set_num_threads(1);
  ScanRun<float> one(d);
  one.forward(d, true);
  one.backward(d, true, dout, dfin);
  omp_set_num_threads(nt);
  EXPECT_EQ(a.o, one.o);
  EXPECT_EQ(a.fin, one.fin);
  EXPECT_EQ(a.dq, one.dq);
  EXPECT_EQ(a.dk, one.dk);
  EXPECT_EQ(a.dv, one.dv);
  EXPECT_EQ(a.dg, one.dg);
  EXPECT_EQ(a.dinit, one.dinit);
  // Saved states are the states entering each chunk: slot 0 is the initial state.
  const i64 KV = c.K * c.V, NC = scalar_decay_num_chunks(a.a);
  for (i64 bh = 0; bh < c.B * c.H; ++bh)
    for (i64 r = 0; r < KV; ++r) ASSERT_EQ(a.states[bh * NC * KV + r], a.init[bh * KV + r]);
}

TEST(ScalarDecayScan, BadArgumentsThrow) {
  Case c{.B = 1, .T = 8, .H = 4, .Hk = 2, .K = 4, .V = 4, .C = 4};
  Data d(c);
  ScanRun<float> r(d);
  std::vector<float> o(d.o_size()), fin(d.state_size());
  auto expect_throw = [&](ScalarDecayArgs<float> a) {
    EXPECT_THROW(scalar_decay_chunked_forward(a, o.data(), fin.data(), nullptr), Error);
    EXPECT_THROW(scalar_decay_recurrent_forward(a, o.data(), fin.data()), Error);
  };
  ScalarDecayArgs<float> a = r.a;
  a.Hk = 3;  // H not a multiple of Hk
  expect_throw(a);
  a = r.a, a.chunk = 0;
  expect_throw(a);
  a = r.a, a.q_stride = 5;  // rows overlap
  expect_throw(a);
  a = r.a, a.v_head_stride = 2;  // heads overlap
  expect_throw(a);
  a = r.a, a.g = nullptr;
  expect_throw(a);
  std::vector<int32_t> ds = {0, 0, 2, 2, 3, 4, 4, 4};  // token 4 points at 3, which starts no document
  a = r.a, a.doc_start = ds.data();
  expect_throw(a);
  try {
    a = r.a, a.Hk = 3;
    scalar_decay_chunked_forward(a, o.data(), fin.data(), nullptr);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scalar_decay_chunked_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("H=4"), std::string::npos) << e.what();
  }
  a = r.a;  // step needs T == 1
  std::vector<float> st(d.state_size());
  EXPECT_THROW(scalar_decay_step(a, st.data(), o.data()), Error);
}

// Under --precision bf16 (CPUs with AVX512_BF16) the chunked kernel's products take bf16 operands (ops/kernel_blas.h,
// ops/bf16_pairs.h) with fp32 accumulation. Bound (docs/precision.md): 4 u_bf sqrt(N), N the bf16 roundings along an
// output's chain: per chunk q, k, v, the state and the masked q k^T as operands (6 with margin), the chunks carried
// in the state; gradients the forward's and the backward's chains.
TEST(ScalarDecayScanBf16, ChunkedFollowsTheDoubleReferenceWithinTheBf16Bound) {
  SKIP_UNLESS_BF16_KERNELS();
  for_each_bf16_product_path([&] {
    for (const Case& c : shape_cases()) {
      SCOPED_TRACE(name(c));
      const double depth = 6.0 * static_cast<double>((c.T + c.C - 1) / c.C);
      Data d(c);
      std::vector<double> o, fin;
      reference_forward(d, o, fin);
      auto dout = rand_vec(d.o_size(), 300 + c.seed), dfin = rand_vec(d.state_size(), 400 + c.seed);
      ScanRun<double> rec(d);
      rec.backward(d, false, dout, dfin);
      ScanRun<float> f32(d);
      f32.forward(d, true);
      const PrecisionScope bf(Precision::bf16, /*allow_emulated=*/true);
      ScanRun<float> got(d);
      got.forward(d, true);
      expect_forward(got, o, fin, bf16_tol(depth), "chunked<float> bf16");
      got.backward(d, true, dout, dfin);
      EXPECT_TRUE(got.paddings(d));
      expect_grads(got.grads(d), rec.grads(d), bf16_tol(2 * depth), "chunked<float> bf16");
      // bf16 really ran: the output differs from the fp32 kernel's by more than a tenth of u_bf.
      EXPECT_GT(rel_rms_diff(got.o, f32.o), 0.1 * kBf16UnitRoundoff);
    }
  });
}
