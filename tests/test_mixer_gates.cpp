// The linear mixers' elementwise gates (ops/mixer_gates.h) against plain double references, and their backwards
// against central finite differences of those references. Odd head counts and widths exercise the masked tails.
// The ctest entry simd_fallback_kernels runs them again on the portable target.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/mixer_gates.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

double softplus_ref(double z) { return z > 20 ? z : std::log1p(std::exp(z)); }
double silu_ref(double z) { return z / (1 + std::exp(-z)); }

double dot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The rows [rows, width] at `stride` of a strided buffer, as doubles.
template <typename V>
std::vector<double> rows(const V& x, i64 n, i64 width, i64 stride, i64 offset = 0) {
  return unpack_rows(x, n, stride, offset, width);
}

// Mamba-2's dt and value rows in double (mamba2_dt_forward).
struct DtRef {
  std::vector<double> dt, g, v;
};
DtRef dt_ref(const std::vector<double>& raw, i64 rs, const std::vector<double>& bias, const std::vector<double>& A,
             const std::vector<double>& x, i64 xs, i64 N, i64 H, i64 P) {
  DtRef r{std::vector<double>(N * H), std::vector<double>(N * H), std::vector<double>(N * H * P)};
  for (i64 n = 0; n < N; ++n)
    for (i64 h = 0; h < H; ++h) {
      const double dt = softplus_ref(raw[n * rs + h] + bias[h]);
      r.dt[n * H + h] = dt;
      r.g[n * H + h] = A[h] * dt;
      for (i64 p = 0; p < P; ++p) r.v[(n * H + h) * P + p] = dt * x[n * xs + h * P + p];
    }
  return r;
}

}  // namespace

TEST(MixerGates, Mamba2DtForwardMatchesReference) {
  const i64 N = 11, H = 3, P = 13, rs = H + 5, xs = H * P + 3;
  auto raw = randn(N * rs, 1, 3.0);
  raw[0] = 25.f, raw[1] = -30.f, raw[rs] = 19.9f, raw[rs + 1] = -7.f;  // threshold, underflow, tiny dt
  auto bias = randn(H, 2), x = randn(N * xs, 3);
  std::vector<float> A = {-1.f, -4.5f, -16.f};
  auto dt = nan_vec(N * H), g = nan_vec(N * H), v = nan_vec(N * H * P);
  ops::mamba2_dt_forward(raw.data(), rs, bias.data(), A.data(), x.data(), xs, dt.data(), g.data(), v.data(), N, H, P);
  const DtRef r = dt_ref(to_double(raw), rs, to_double(bias), to_double(A), to_double(x), xs, N, H, P);
  EXPECT_TRUE(close_rel(dt, r.dt, 1e-6, "dt"));
  EXPECT_TRUE(close_rel(g, r.g, 1e-6, "g"));
  EXPECT_TRUE(close_rel(v, r.v, 1e-6, "v"));
  // Per element too, from the kernel's own float input raw + bias (its rounding alone moves e^z by |z| u): exp and
  // log1p are ~2 ulp each, so 4 ulp = 2^-21 relative bounds the composition.
  for (i64 n = 0; n < N; ++n)
    for (i64 h = 0; h < H; ++h) {
      const double want = softplus_ref(static_cast<float>(raw[n * rs + h] + bias[h]));
      EXPECT_NEAR(dt[n * H + h], want, want * 0x1p-21) << "n " << n << " h " << h;
    }
  EXPECT_THROW(ops::mamba2_dt_forward(raw.data(), H - 1, bias.data(), A.data(), x.data(), xs, dt.data(), g.data(),
                                      v.data(), N, H, P),
               Error);
  // The backward's recompute of v from dt and x gives the forward's bits (Mamba-2 does not keep v).
  auto v2 = nan_vec(N * H * P);
  ops::mamba2_dt_scale_x(dt.data(), x.data(), xs, v2.data(), N, H, P);
  for (i64 i = 0; i < N * H * P; ++i) ASSERT_EQ(v2[i], v[i]) << "index " << i;
  EXPECT_THROW(ops::mamba2_dt_scale_x(dt.data(), x.data(), H * P - 1, v2.data(), N, H, P), Error);
}

TEST(MixerGates, Mamba2DtBackwardMatchesFiniteDifferences) {
  // loss = <wv, v> + <wy, D x> + <wg, g> with v, g from mamba2_dt_forward: then dv = wv, dys = wy, dg = wg.
  const i64 N = 7, H = 3, P = 11, rs = H + 2, xs = H * P + 5;
  auto raw = randn(N * rs, 11, 2.0);
  raw[0] = -7.f;  // dt ~ 1e-3: 1 - e^-dt must not cancel
  auto bias = randn(H, 12), x = randn(N * xs, 13), wv = randn(N * H * P, 14), wy = randn(N * H * P, 15),
       wg = randn(N * H, 16);
  std::vector<float> A = {-1.f, -4.5f, -16.f}, D = {0.5f, 1.f, -2.f};
  std::vector<double> rawd = to_double(raw), bd = to_double(bias), xd = to_double(x), Ad = to_double(A),
                      Dd = to_double(D);
  auto loss = [&]() {
    const DtRef r = dt_ref(rawd, rs, bd, Ad, xd, xs, N, H, P);
    double l = dot(r.v, wv) + dot(r.g, wg);
    for (i64 n = 0; n < N; ++n)
      for (i64 i = 0; i < H * P; ++i) l += wy[n * H * P + i] * Dd[i / P] * xd[n * xs + i];
    return l;
  };
  auto dt = nan_vec(N * H), g = nan_vec(N * H), v = nan_vec(N * H * P);
  ops::mamba2_dt_forward(raw.data(), rs, bias.data(), A.data(), x.data(), xs, dt.data(), g.data(), v.data(), N, H, P);
  const i64 dxs = xs + 1, drs = rs + 3;
  auto dx = nan_vec(N * dxs), draw = nan_vec(N * drs), part = nan_vec(3 * N * H);
  ops::mamba2_dt_backward(x.data(), xs, wv.data(), wy.data(), dt.data(), D.data(), A.data(), wg.data(), dx.data(), dxs,
                          draw.data(), drs, part.data(), N, H, P);

  std::vector<double> fx, fraw;
  for (i64 n = 0; n < N; ++n) {
    for (i64 i = 0; i < H * P; ++i) fx.push_back(fd_grad(xd, n * xs + i, loss, 1e-5));
    for (i64 h = 0; h < H; ++h) fraw.push_back(fd_grad(rawd, n * rs + h, loss, 1e-5));
  }
  EXPECT_TRUE(close_rel(rows(dx, N, H * P, dxs), fx, 1e-5, "dx"));
  EXPECT_TRUE(close_rel(rows(draw, N, H, drs), fraw, 1e-5, "d raw dt"));
  // The per-token terms summed over tokens are the per-head parameter gradients.
  std::vector<double> sD(H, 0), sA(H, 0), sB(H, 0), fD, fA, fB;
  for (i64 n = 0; n < N; ++n)
    for (i64 h = 0; h < H; ++h) {
      sD[h] += part[n * H + h];
      sA[h] += part[(N + n) * H + h];
      sB[h] += part[(2 * N + n) * H + h];
    }
  for (i64 h = 0; h < H; ++h) {
    fD.push_back(fd_grad(Dd, h, loss, 1e-5));
    fA.push_back(fd_grad(Ad, h, loss, 1e-5));
    fB.push_back(fd_grad(bd, h, loss, 1e-5));
  }
  EXPECT_TRUE(close_rel(sD, fD, 1e-5, "dD"));
  EXPECT_TRUE(close_rel(sA, fA, 1e-5, "dA"));
  EXPECT_TRUE(close_rel(sB, fB, 1e-5, "d dt_bias"));
  // The tiny-dt entry alone (relative, not drowned by the others): softplus' = 1 - e^-dt ~ dt.
  EXPECT_NEAR(draw[0], fraw[0], 1e-5 * std::fabs(fraw[0]) + 1e-9);
}

TEST(MixerGates, Mamba2SkipGateForwardMatchesReferenceAndMayWriteInPlace) {
  const i64 N = 9, H = 3, P = 13, F = H * P, xs = F + 4, zs = F + 7;
  auto y = randn(N * F, 21), x = randn(N * xs, 22), z = randn(N * zs, 23, 3.0);
  z[0] = 95.f, z[1] = -95.f;  // saturated gates stay finite
  std::vector<float> D = {0.5f, 1.f, -2.f};
  std::vector<double> ys(N * F), out(N * F);
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < F; ++i) {
      ys[n * F + i] = double(y[n * F + i]) + double(D[i / P]) * x[n * xs + i];
      out[n * F + i] = ys[n * F + i] * silu_ref(z[n * zs + i]);
    }
  auto y1 = y, o1 = nan_vec(N * F);
  ops::mamba2_skip_gate_forward(y1.data(), x.data(), xs, D.data(), z.data(), zs, o1.data(), N, H, P);
  EXPECT_TRUE(close_rel(y1, ys, 1e-6, "y + D x"));
  EXPECT_TRUE(close_rel(o1, out, 1e-6, "gated"));
  auto y2 = y;  // in place, as decoding uses it
  ops::mamba2_skip_gate_forward(y2.data(), x.data(), xs, D.data(), z.data(), zs, y2.data(), N, H, P);
  EXPECT_EQ(y2, o1);
}

TEST(MixerGates, SiluGateRecomputeMatchesReferenceAndBackwardMatchesFiniteDifferences) {
  const i64 N = 8, F = 21, zs = F + 3, dzs = F + 5;
  auto y = randn(N * F, 31), z = randn(N * zs, 32, 3.0), w = randn(F, 33), rstd = randn(N, 34), dout = randn(N * F, 35);
  z[2] = 95.f, z[3] = -95.f;
  std::vector<double> yd = to_double(y), zd = to_double(z), yg(N * F), yn(N * F);
  auto gated = [&]() {
    std::vector<double> o(N * F);
    for (i64 n = 0; n < N; ++n)
      for (i64 i = 0; i < F; ++i) o[n * F + i] = yd[n * F + i] * silu_ref(zd[n * zs + i]);
    return o;
  };
  yg = gated();
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < F; ++i) yn[n * F + i] = yg[n * F + i] * rstd[n] * w[i];
  auto g1 = nan_vec(N * F), n1 = nan_vec(N * F);
  ops::silu_gate_norm_recompute(y.data(), z.data(), zs, rstd.data(), w.data(), g1.data(), n1.data(), N, F);
  EXPECT_TRUE(close_rel(g1, yg, 1e-6, "yg"));
  EXPECT_TRUE(close_rel(n1, yn, 1e-6, "yn"));

  auto dy = nan_vec(N * F), dz = nan_vec(N * dzs);
  ops::silu_gate_backward(y.data(), z.data(), zs, dout.data(), dy.data(), dz.data(), dzs, N, F);
  auto loss = [&]() { return dot(gated(), dout); };
  std::vector<double> fy, fz;
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < F; ++i) {
      fy.push_back(fd_grad(yd, n * F + i, loss, 1e-5));
      fz.push_back(fd_grad(zd, n * zs + i, loss, 1e-5));
    }
  EXPECT_TRUE(close_rel(dy, fy, 1e-5, "dy"));
  EXPECT_TRUE(close_rel(rows(dz, N, F, dzs), fz, 1e-5, "dz"));
}

TEST(MixerGates, NormSiluGateMatchesReferenceAndBackwardMatchesFiniteDifferences) {
  const i64 N = 6, H = 3, K = 13, gs = 2 * H * K + 5;
  const float eps = 1e-6f;
  auto o = randn(N * H * K, 41), gp = randn(N * gs, 42, 3.0), w = randn(K, 43, 0.5), dz = randn(N * H * K, 44);
  for (auto& v : w) v += 1.f;
  gp[0] = 95.f, gp[1] = -95.f;
  std::vector<double> od = to_double(o), gd = to_double(gp), wd = to_double(w);
  std::vector<double> rref(N * H);
  auto ref = [&]() {
    std::vector<double> z(N * H * K);
    for (i64 r = 0; r < N * H; ++r) {
      const i64 n = r / H, h = r % H;
      double ss = 0;
      for (i64 i = 0; i < K; ++i) ss += od[r * K + i] * od[r * K + i];
      rref[r] = 1 / std::sqrt(ss / K + eps);
      for (i64 i = 0; i < K; ++i) z[r * K + i] = od[r * K + i] * rref[r] * wd[i] * silu_ref(gd[n * gs + h * K + i]);
    }
    return z;
  };
  const auto zref = ref();
  auto rstd = nan_vec(N * H), z = nan_vec(N * H * K);
  ops::norm_silu_gate_forward(o.data(), gp.data(), gs, w.data(), rstd.data(), true, z.data(), N, H, K, eps);
  EXPECT_TRUE(close_rel(z, zref, 1e-6, "z"));
  EXPECT_TRUE(close_rel(rstd, rref, 1e-6, "rstd"));
  auto z2 = nan_vec(N * H * K);  // the backward's recompute from the saved rstd: the same bits
  ops::norm_silu_gate_forward(o.data(), gp.data(), gs, w.data(), rstd.data(), false, z2.data(), N, H, K, eps);
  EXPECT_EQ(z2, z);

  auto d_o = nan_vec(N * H * K), d_gp = nan_vec(N * gs), dw0 = randn(K, 45), dw = dw0;
  ops::norm_silu_gate_backward(o.data(), gp.data(), gs, w.data(), rstd.data(), dz.data(), d_o.data(), d_gp.data(),
                               dw.data(), N, H, K);
  auto loss = [&]() { return dot(ref(), dz); };
  std::vector<double> fo, fg, fw;
  for (i64 i = 0; i < N * H * K; ++i) fo.push_back(fd_grad(od, i, loss, 1e-5));
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < H * K; ++i) fg.push_back(fd_grad(gd, n * gs + i, loss, 1e-5));
  for (i64 i = 0; i < K; ++i) fw.push_back(dw0[i] + fd_grad(wd, i, loss, 1e-5));
  EXPECT_TRUE(close_rel(d_o, fo, 1e-5, "d_o"));
  EXPECT_TRUE(close_rel(rows(d_gp, N, H * K, gs), fg, 1e-5, "d_gp"));
  EXPECT_TRUE(close_rel(dw, fw, 1e-5, "dw (accumulated)"));
  EXPECT_THROW(ops::norm_silu_gate_forward(o.data(), gp.data(), H * K - 1, w.data(), rstd.data(), true, z.data(), N,
                                           H, K, eps),
               Error);
}

// Lightning's activations (silu on q | k | v, sigmoid on the gate), the gate and its recompute against double
// references; the gate's and silu's backwards against central finite differences.
TEST(MixerGates, LightningGatesMatchReferencesAndBackwardsMatchFiniteDifferences) {
  const i64 N = 7, F = 19, W4 = 4 * F;
  auto pre = randn(N * W4, 51, 3.0), o = randn(N * F, 52), w = randn(F, 53), rstd = randn(N, 54);
  pre[1] = 95.f, pre[2] = -95.f, pre[3 * F] = 95.f, pre[3 * F + 1] = -95.f;  // saturated silu and sigmoid
  auto act = nan_vec(N * W4);
  ops::lightning_activate(pre.data(), act.data(), W4, act.data() + 3 * F, W4, N, F);
  std::vector<double> want(N * W4);
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < W4; ++i) {
      const double x = pre[n * W4 + i];
      want[n * W4 + i] = i < 3 * F ? silu_ref(x) : 1 / (1 + std::exp(-x));
    }
  EXPECT_TRUE(close_rel(act, want, 1e-6, "act"));
  {  // The backward's layout: q | k | v dense [N, 3F], the gate in place over pre's gate columns. The same bits.
    auto pre2 = pre, qkv = nan_vec(N * 3 * F);
    ops::lightning_activate(pre2.data(), qkv.data(), 3 * F, pre2.data() + 3 * F, W4, N, F);
    EXPECT_EQ(rows(qkv, N, 3 * F, 3 * F), rows(act, N, 3 * F, W4));
    EXPECT_EQ(rows(pre2, N, F, W4, 3 * F), rows(act, N, F, W4, 3 * F));
    EXPECT_EQ(rows(pre2, N, 3 * F, W4), rows(pre, N, 3 * F, W4));  // q | k | v columns of pre untouched
  }

  // u = (o rstd w) * g, g = the activations' gate columns; the forward's gate_multiply gives the same bits.
  const float* g = act.data() + 3 * F;
  auto nrm = nan_vec(N * F), u = nan_vec(N * F);
  ops::norm_gate_recompute(o.data(), rstd.data(), w.data(), g, W4, nrm.data(), u.data(), N, F);
  std::vector<double> wn(N * F), wu(N * F);
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < F; ++i) {
      wn[n * F + i] = double(o[n * F + i]) * rstd[n] * w[i];
      wu[n * F + i] = wn[n * F + i] * g[n * W4 + i];
    }
  EXPECT_TRUE(close_rel(nrm, wn, 1e-6, "nrm"));
  EXPECT_TRUE(close_rel(u, wu, 1e-6, "u"));
  auto u2 = nrm;
  ops::gate_multiply(u2.data(), g, W4, N, F);
  EXPECT_EQ(u2, u);

  // Backward of u = nrm sigmoid(z) in nrm and z, and of silu(x) in x.
  std::vector<double> nd = to_double(nrm), zd(N * F), xd(N * F);
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < F; ++i) zd[n * F + i] = pre[n * W4 + 3 * F + i], xd[n * F + i] = pre[n * W4 + i];
  const auto du0 = randn(N * F, 55);
  auto du = du0, dgate = nan_vec(N * W4);
  ops::sigmoid_gate_backward(nrm.data(), g, W4, du.data(), dgate.data() + 3 * F, W4, N, F);
  auto gate_loss = [&]() {
    double l = 0;
    for (i64 r = 0; r < N * F; ++r) l += du0[r] * nd[r] / (1 + std::exp(-zd[r]));
    return l;
  };
  std::vector<double> fn, fz;
  for (i64 r = 0; r < N * F; ++r) {
    fn.push_back(fd_grad(nd, r, gate_loss, 1e-5));
    fz.push_back(fd_grad(zd, r, gate_loss, 1e-5));
  }
  EXPECT_TRUE(close_rel(du, fn, 1e-5, "d nrm"));
  EXPECT_TRUE(close_rel(rows(dgate, N, F, W4, 3 * F), fz, 1e-5, "d gate"));
  {  // In place over the gate's own rows (Lightning's backward): the same bits.
    auto gi = act, dui = du0;
    ops::sigmoid_gate_backward(nrm.data(), gi.data() + 3 * F, W4, dui.data(), gi.data() + 3 * F, W4, N, F);
    EXPECT_EQ(rows(gi, N, F, W4, 3 * F), rows(dgate, N, F, W4, 3 * F));
    EXPECT_EQ(dui, du);
  }

  const auto dq0 = randn(N * W4, 56);
  auto dq = dq0;
  ops::silu_backward(pre.data(), W4, dq.data(), W4, dq.data(), W4, N, F);
  auto silu_loss = [&]() {
    double l = 0;
    for (i64 n = 0; n < N; ++n)
      for (i64 i = 0; i < F; ++i) l += dq0[n * W4 + i] * silu_ref(xd[n * F + i]);
    return l;
  };
  std::vector<double> fx;
  for (i64 r = 0; r < N * F; ++r) fx.push_back(fd_grad(xd, r, silu_loss, 1e-5));
  EXPECT_TRUE(close_rel(rows(dq, N, F, W4), fx, 1e-5, "d silu"));
  for (i64 n = 0; n < N; ++n)
    for (i64 i = F; i < W4; ++i) ASSERT_EQ(dq[n * W4 + i], dq0[n * W4 + i]) << "past the F columns: " << n << ", " << i;
  {  // Written over pre (Lightning's backward), from a gradient of another row stride: the same bits.
    auto pre3 = pre;
    std::vector<float> dense(N * F);
    for (i64 n = 0; n < N; ++n) std::copy_n(dq0.data() + n * W4, F, dense.data() + n * F);
    ops::silu_backward(pre3.data(), W4, dense.data(), F, pre3.data(), W4, N, F);
    EXPECT_EQ(rows(pre3, N, F, W4), rows(dq, N, F, W4));
  }
  EXPECT_THROW(ops::gate_multiply(u2.data(), g, F - 1, N, F), Error);
}
