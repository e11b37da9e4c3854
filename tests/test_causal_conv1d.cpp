// Depthwise causal conv1d (+ fused SiLU): forward against a plain double reference, backward against central
// finite differences in double (u, w, bias, initial conv state), packed documents == separate runs, chained
// prefills through the conv state and decode steps == one full forward.
// Tolerances (relative RMS): double 1e-13, float 1e-6 (forward) / 1e-5 (backward vs double).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "ops/causal_conv1d.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::ops;
using namespace hlm::testing;

namespace {

struct ConvCase {
  i64 B = 1, T = 1, C = 1, W = 4;
  bool silu = false, bias = false, init = false, strided = false;
  std::vector<std::vector<i64>> docs{};
  uint64_t seed = 1;
};

std::string name(const ConvCase& c) {
  return fmt::format("B={} T={} C={} W={} silu={} bias={} init={} strided={} docs={}", c.B, c.T, c.C, c.W, c.silu,
                     c.bias, c.init, c.strided, !c.docs.empty());
}

struct ConvData {
  ConvCase cs;
  i64 ur;
  std::vector<double> u, w, bias, init;
  std::vector<int32_t> ds;
  explicit ConvData(const ConvCase& c) : cs(c), ur(c.strided ? c.C + 3 : c.C) {
    Rng r(c.seed);
    u.assign(c.B * c.T * ur, 123.0);
    for (i64 i = 0; i < c.B * c.T; ++i)
      for (i64 ch = 0; ch < c.C; ++ch) u[i * ur + ch] = r.normal();
    w.resize(c.C * c.W);
    for (auto& x : w) x = r.normal() * 0.7;
    if (c.bias) {
      bias.resize(c.C);
      for (auto& x : bias) x = r.normal() * 0.3;
    }
    if (c.init) {
      init.resize(c.B * (c.W - 1) * c.C);
      for (auto& x : init) x = r.normal();
    }
    if (!c.docs.empty()) ds = doc_start_from_lengths(c.T, c.docs);
  }
};

std::vector<double> reference(const ConvData& d) {
  const ConvCase& c = d.cs;
  std::vector<double> y(c.B * c.T * c.C);
  for (i64 b = 0; b < c.B; ++b)
    for (i64 t = 0; t < c.T; ++t) {
      const i64 lo = d.ds.empty() ? 0 : d.ds[b * c.T + t];
      for (i64 ch = 0; ch < c.C; ++ch) {
        double p = c.bias ? d.bias[ch] : 0.0;
        for (i64 j = 0; j < c.W; ++j) {
          const i64 s = t - c.W + 1 + j;
          double x = 0;
          if (s >= 0 && s >= lo) x = d.u[(b * c.T + s) * d.ur + ch];
          if (s < 0 && lo == 0 && c.init) x = d.init[(b * (c.W - 1) + s + c.W - 1) * c.C + ch];
          p += d.w[ch * c.W + j] * x;
        }
        y[(b * c.T + t) * c.C + ch] = c.silu ? p / (1 + std::exp(-p)) : p;
      }
    }
  return y;
}

template <typename R>
struct ConvRun {
  std::vector<R> u, w, bias, init, y, fin, du, dw, dbias, dinit;
  CausalConv1dArgs<R> a;
  explicit ConvRun(const ConvData& d)
      : u(d.u.begin(), d.u.end()),
        w(d.w.begin(), d.w.end()),
        bias(d.bias.begin(), d.bias.end()),
        init(d.init.begin(), d.init.end()) {
    const ConvCase& c = d.cs;
    a.B = c.B, a.T = c.T, a.C = c.C, a.W = c.W, a.u_stride = d.ur, a.silu = c.silu;
    a.u = u.data(), a.w = w.data(), a.bias = c.bias ? bias.data() : nullptr;
    a.initial_state = c.init ? init.data() : nullptr;
    a.doc_start = d.ds.empty() ? nullptr : d.ds.data();
  }
  void forward() {
    const R nan = std::numeric_limits<R>::quiet_NaN();
    y.assign(a.B * a.T * a.C, nan);
    fin.assign(a.B * (a.W - 1) * a.C, nan);
    causal_conv1d_forward(a, y.data(), fin.data());
  }
  // dw and dbias start at 0.5 to check that they accumulate.
  void backward(const std::vector<double>& dy) {
    const R nan = std::numeric_limits<R>::quiet_NaN();
    std::vector<R> dyr(dy.begin(), dy.end());
    du.assign(u.size(), R(123));
    for (i64 i = 0; i < a.B * a.T; ++i)
      for (i64 ch = 0; ch < a.C; ++ch) du[i * a.u_stride + ch] = nan;
    dw.assign(w.size(), R(0.5));
    dbias.assign(a.C, R(0.5));
    dinit.assign(a.B * (a.W - 1) * a.C, nan);
    causal_conv1d_backward(a, dyr.data(), {du.data(), dw.data(), dbias.data(), dinit.data()});
  }
  std::vector<double> du_dense() const { return unpack_rows(du, a.B * a.T, a.u_stride, 0, a.C); }
};

std::vector<ConvCase> cases() {
  return {
      {.B = 1, .T = 1, .C = 3, .W = 4, .bias = true},
      {.B = 2, .T = 2, .C = 5, .W = 4, .silu = true, .bias = true, .init = true},  // T < W-1
      {.B = 2, .T = 37, .C = 70, .W = 4, .silu = true, .bias = true, .init = true, .strided = true, .seed = 3},
      {.B = 3, .T = 20, .C = 9, .W = 1, .silu = true, .seed = 4},  // W = 1
      {.B = 1, .T = 25, .C = 130, .W = 7, .init = true, .strided = true, .docs = {{2, 9, 1, 13}}, .seed = 5},
      {.B = 2,
       .T = 16,
       .C = 6,
       .W = 3,
       .silu = true,
       .bias = true,
       .init = true,
       .docs = {{16}, {1, 4, 11}},
       .seed = 6},
      // Several channel blocks and token tiles of the backward, a partial vector group, documents across tiles.
      {.B = 2,
       .T = 70,
       .C = 300,
       .W = 4,
       .silu = true,
       .bias = true,
       .init = true,
       .strided = true,
       .docs = {{70}, {5, 40, 25}},
       .seed = 9},
  };
}

// Small shapes for the finite-difference checks (every input element is perturbed).
std::vector<ConvCase> fd_cases() {
  return {
      {.B = 1, .T = 1, .C = 3, .W = 4, .bias = true},
      {.B = 2, .T = 2, .C = 5, .W = 4, .silu = true, .bias = true, .init = true},
      {.B = 2, .T = 9, .C = 4, .W = 4, .silu = true, .bias = true, .init = true, .strided = true, .seed = 3},
      {.B = 3, .T = 6, .C = 3, .W = 1, .silu = true, .seed = 4},
      {.B = 1, .T = 25, .C = 2, .W = 7, .init = true, .strided = true, .docs = {{2, 9, 1, 13}}, .seed = 5},
      {.B = 2,
       .T = 16,
       .C = 3,
       .W = 3,
       .silu = true,
       .bias = true,
       .init = true,
       .docs = {{16}, {1, 4, 11}},
       .seed = 6},
  };
}

std::vector<double> rand_vec(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<double> x(n);
  for (auto& e : x) e = r.normal();
  return x;
}

}  // namespace

TEST(CausalConv1d, ForwardMatchesReference) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(name(c));
    ConvData d(c);
    const auto want = reference(d);
    ConvRun<double> rd(d);
    rd.forward();
    EXPECT_TRUE(close_rel(rd.y, want, 1e-13, "double y"));
    ConvRun<float> rf(d);
    rf.forward();
    EXPECT_TRUE(close_rel(rf.y, want, 1e-6, "float y"));
  }
}

TEST(CausalConv1d, BackwardMatchesFiniteDifferences) {
  for (const auto& c : fd_cases()) {
    SCOPED_TRACE(name(c));
    ConvData d(c);
    const auto wy = rand_vec(c.B * c.T * c.C, 77);
    auto loss = [&]() {
      ConvRun<double> r(d);
      r.forward();
      double l = 0;
      for (size_t i = 0; i < wy.size(); ++i) l += wy[i] * r.y[i];
      return l;
    };
    ConvRun<double> r(d);
    r.backward(wy);
    std::vector<double> fu, fw, fb, fi;
    for (i64 i = 0; i < c.B * c.T; ++i)
      for (i64 ch = 0; ch < c.C; ++ch) fu.push_back(fd_grad(d.u, i * d.ur + ch, loss, 1e-6));
    for (size_t i = 0; i < d.w.size(); ++i) fw.push_back(fd_grad(d.w, i, loss, 1e-6) + 0.5);
    for (size_t i = 0; i < d.bias.size(); ++i) fb.push_back(fd_grad(d.bias, i, loss, 1e-6) + 0.5);
    for (size_t i = 0; i < d.init.size(); ++i) fi.push_back(fd_grad(d.init, i, loss, 1e-6));
    EXPECT_TRUE(close_rel(r.du_dense(), fu, 1e-8, "du"));
    EXPECT_TRUE(close_rel(r.dw, fw, 1e-8, "dw (accumulated onto 0.5)"));
    if (c.bias) {
      EXPECT_TRUE(close_rel(r.dbias, fb, 1e-8, "dbias (accumulated onto 0.5)"));
    }
    if (c.init) {
      EXPECT_TRUE(close_rel(r.dinit, fi, 1e-8, "d_initial_state"));
    }
    for (i64 i = 0; i < c.B * c.T; ++i)
      for (i64 ch = c.C; ch < d.ur; ++ch) ASSERT_EQ(r.du[i * d.ur + ch], 123.0) << "du padding overwritten";
  }
}

TEST(CausalConv1d, FloatBackwardMatchesDouble) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(name(c));
    ConvData d(c);
    const auto wy = rand_vec(c.B * c.T * c.C, 78);
    ConvRun<double> r(d);
    r.backward(wy);
    ConvRun<float> rf(d);
    rf.backward(wy);
    EXPECT_TRUE(close_rel(rf.du_dense(), r.du_dense(), 1e-5, "float du"));
    EXPECT_TRUE(close_rel(rf.dw, r.dw, 1e-5, "float dw"));
    EXPECT_TRUE(close_rel(rf.dbias, r.dbias, 1e-5, "float dbias"));
    if (c.init) {
      EXPECT_TRUE(close_rel(rf.dinit, r.dinit, 1e-5, "float dinit"));
    }
  }
}

TEST(CausalConv1d, PackedDocumentsEqualSeparateRuns) {
  const std::vector<i64> lens = {2, 9, 1, 13};
  ConvCase pc{.B = 1, .T = 25, .C = 11, .W = 4, .silu = true, .bias = true, .init = true, .docs = {lens}, .seed = 8};
  ConvData dp(pc);
  const auto dy = rand_vec(pc.T * pc.C, 81);
  ConvRun<double> rp(dp);
  rp.forward();
  rp.backward(dy);
  std::vector<double> y, du, dw(pc.C * pc.W, 0.5), db(pc.C, 0.5), dinit;
  i64 t0 = 0;
  for (size_t di = 0; di < lens.size(); ++di) {
    ConvCase c = pc;
    c.T = lens[di];
    c.docs.clear();
    c.init = di == 0;
    ConvData d(c);
    std::copy(dp.u.begin() + t0 * pc.C, dp.u.begin() + (t0 + c.T) * pc.C, d.u.begin());
    d.w = dp.w, d.bias = dp.bias;
    if (di == 0) d.init = dp.init;
    ConvRun<double> r(d);
    r.forward();
    r.backward({dy.begin() + t0 * pc.C, dy.begin() + (t0 + c.T) * pc.C});
    y.insert(y.end(), r.y.begin(), r.y.end());
    du.insert(du.end(), r.du.begin(), r.du.end());
    for (size_t i = 0; i < dw.size(); ++i) dw[i] += r.dw[i] - 0.5;
    for (size_t i = 0; i < db.size(); ++i) db[i] += r.dbias[i] - 0.5;
    if (di == 0) dinit = {r.dinit.begin(), r.dinit.end()};
    if (di + 1 == lens.size()) {
      EXPECT_TRUE(close_rel(rp.fin, r.fin, 1e-15, "final state = last document's"));
    }
    t0 += c.T;
  }
  EXPECT_TRUE(close_rel(rp.y, y, 1e-14, "y"));
  EXPECT_TRUE(close_rel(rp.du, du, 1e-14, "du"));
  EXPECT_TRUE(close_rel(rp.dw, dw, 1e-13, "dw"));
  EXPECT_TRUE(close_rel(rp.dbias, db, 1e-13, "dbias"));
  EXPECT_TRUE(close_rel(rp.dinit, dinit, 1e-14, "dinit"));
}

// Prefill in pieces (each piece starts from the previous piece's final state, written in place), then decode
// steps: the same outputs as one forward over the whole row.
TEST(CausalConv1d, ChainedPrefillAndStepsMatchFullForward) {
  for (i64 W : {1, 4, 6}) {
    ConvCase fc{.B = 2, .T = 30, .C = 19, .W = W, .silu = true, .bias = true, .init = true, .strided = true, .seed = 9};
    SCOPED_TRACE(name(fc));
    ConvData d(fc);
    ConvRun<float> full(d);
    full.forward();
    std::vector<float> state(full.init.begin(), full.init.end());
    state.resize(fc.B * (W - 1) * fc.C);
    const std::vector<i64> pieces = {1, 2, 10};  // 13 tokens of prefill (pieces shorter than W-1 included)
    i64 t0 = 0;
    for (i64 len : pieces) {
      std::vector<float> u(fc.B * len * d.ur);
      for (i64 b = 0; b < fc.B; ++b)
        std::copy(full.u.begin() + (b * fc.T + t0) * d.ur, full.u.begin() + (b * fc.T + t0 + len) * d.ur,
                  u.begin() + b * len * d.ur);
      CausalConv1dArgs<float> a = full.a;
      a.T = len, a.u = u.data(), a.initial_state = W > 1 ? state.data() : nullptr;
      std::vector<float> y(fc.B * len * fc.C, std::nanf(""));
      causal_conv1d_forward(a, y.data(), W > 1 ? state.data() : nullptr);
      for (i64 b = 0; b < fc.B; ++b)
        for (i64 i = 0; i < len * fc.C; ++i)
          ASSERT_EQ(y[b * len * fc.C + i], full.y[(b * fc.T + t0) * fc.C + i]) << "piece at " << t0;
      t0 += len;
    }
    for (; t0 < fc.T; ++t0) {
      std::vector<float> u(fc.B * d.ur);
      for (i64 b = 0; b < fc.B; ++b)
        std::copy(full.u.begin() + (b * fc.T + t0) * d.ur, full.u.begin() + (b * fc.T + t0 + 1) * d.ur,
                  u.begin() + b * d.ur);
      CausalConv1dArgs<float> a = full.a;
      a.T = 1, a.u = u.data(), a.initial_state = nullptr;
      std::vector<float> y(fc.B * fc.C, std::nanf(""));
      causal_conv1d_step(a, state.data(), y.data());
      for (i64 b = 0; b < fc.B; ++b)
        for (i64 ch = 0; ch < fc.C; ++ch)
          ASSERT_EQ(y[b * fc.C + ch], full.y[(b * fc.T + t0) * fc.C + ch]) << "step at " << t0;
    }
    EXPECT_EQ(state, full.fin);
  }
}

TEST(CausalConv1d, BadArgumentsThrow) {
  ConvCase c{.B = 1, .T = 4, .C = 3, .W = 4};
  ConvData d(c);
  ConvRun<float> r(d);
  std::vector<float> y(12);
  CausalConv1dArgs<float> a = r.a;
  a.u_stride = 2;
  EXPECT_THROW(causal_conv1d_forward(a, y.data(), nullptr), Error);
  a = r.a, a.W = 0;
  EXPECT_THROW(causal_conv1d_forward(a, y.data(), nullptr), Error);
  a = r.a, a.w = nullptr;
  EXPECT_THROW(causal_conv1d_forward(a, y.data(), nullptr), Error);
  std::vector<int32_t> ds = {0, 1, 0, 3};
  a = r.a, a.doc_start = ds.data();
  EXPECT_THROW(causal_conv1d_forward(a, y.data(), nullptr), Error);
  std::vector<float> st(9);
  EXPECT_THROW(causal_conv1d_step(r.a, st.data(), y.data()), Error);  // T != 1
  try {
    a = r.a, a.u_stride = 2;
    causal_conv1d_forward(a, y.data(), nullptr);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("causal_conv1d_forward"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("C=3"), std::string::npos);
  }
}
