// Causal softmax attention (ops/attention.h) against a naive double-precision masked reference:
// outputs, lse and all gradients over many shapes (GQA, windows, lengths that are not tile multiples),
// packed documents vs separate runs, central finite differences, determinism, argument checks.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/bf16_pairs.h"
#include "ops/precision.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

// q, k, v live inside one fused row per token, as the mixer lays them out: [q (H*hd) | k | v | pad].
struct Case {
  i64 B, T, H, Hkv, hd, W;
  float scale = 0;
  std::string name() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " Hkv=" + std::to_string(Hkv) + " hd=" + std::to_string(hd) + " W=" + std::to_string(W);
  }
  ops::AttentionArgs shape() const {
    ops::AttentionArgs s;
    s.B = B, s.T = T, s.H = H, s.Hkv = Hkv, s.hd = hd, s.window = W, s.scale = scale;
    return s;
  }
  i64 stride() const { return (H + 2 * Hkv) * hd + 3; }  // odd padding: unaligned rows on purpose
  i64 qoff() const { return 0; }
  i64 koff() const { return H * hd; }
  i64 voff() const { return (H + Hkv) * hd; }
};

// Does token t (of row b) see key s?
bool visible(const Case& c, const std::vector<int32_t>* doc, i64 b, i64 t, i64 s) {
  if (s > t) return false;
  if (c.W > 0 && s <= t - c.W) return false;
  if (doc && s < (*doc)[b * c.T + t]) return false;
  return true;
}

struct Ref {
  std::vector<double> o, lse;  // [B, T, H, hd], [B, H, T]
  std::vector<double> dqkv;    // gradient in the fused layout [B*T, stride]
};

// Naive attention in double; with dout != nullptr also the analytic gradient of sum(o * dout).
Ref reference(const Case& c, const std::vector<double>& qkv, const std::vector<double>* dout,
              const std::vector<int32_t>* doc = nullptr) {
  const i64 B = c.B, T = c.T, H = c.H, hd = c.hd, st = c.stride(), hpg = c.H / c.Hkv;
  const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(hd));
  Ref r;
  r.o.assign(B * T * H * hd, 0.0);
  r.lse.assign(B * H * T, 0.0);
  if (dout) r.dqkv.assign(B * T * st, 0.0);
  std::vector<double> p(T), dp(T);
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h) {
      const i64 g = h / hpg;
      auto Q = [&](i64 t, i64 d) { return qkv[(b * T + t) * st + c.qoff() + h * hd + d]; };
      auto K = [&](i64 t, i64 d) { return qkv[(b * T + t) * st + c.koff() + g * hd + d]; };
      auto V = [&](i64 t, i64 d) { return qkv[(b * T + t) * st + c.voff() + g * hd + d]; };
      for (i64 t = 0; t < T; ++t) {
        double mx = -1e300;
        for (i64 s = 0; s < T; ++s) {
          if (!visible(c, doc, b, t, s)) continue;
          double d = 0;
          for (i64 e = 0; e < hd; ++e) d += Q(t, e) * K(s, e);
          p[s] = d * scale;
          mx = std::max(mx, p[s]);
        }
        double sum = 0;
        for (i64 s = 0; s < T; ++s)
          if (visible(c, doc, b, t, s)) sum += std::exp(p[s] - mx);
        r.lse[(b * H + h) * T + t] = mx + std::log(sum);
        for (i64 s = 0; s < T; ++s)
          if (visible(c, doc, b, t, s)) p[s] = std::exp(p[s] - mx) / sum;
        double* orow = &r.o[((b * T + t) * H + h) * hd];
        for (i64 s = 0; s < T; ++s)
          if (visible(c, doc, b, t, s))
            for (i64 e = 0; e < hd; ++e) orow[e] += p[s] * V(s, e);
        if (!dout) continue;
        const double* go = &(*dout)[((b * T + t) * H + h) * hd];
        double D = 0;
        for (i64 e = 0; e < hd; ++e) D += go[e] * orow[e];
        for (i64 s = 0; s < T; ++s) {
          if (!visible(c, doc, b, t, s)) continue;
          double dps = 0;
          for (i64 e = 0; e < hd; ++e) dps += go[e] * V(s, e);
          const double ds = p[s] * (dps - D) * scale;
          for (i64 e = 0; e < hd; ++e) {
            r.dqkv[(b * T + t) * st + c.qoff() + h * hd + e] += ds * K(s, e);
            r.dqkv[(b * T + s) * st + c.koff() + g * hd + e] += ds * Q(t, e);
            r.dqkv[(b * T + s) * st + c.voff() + g * hd + e] += p[s] * go[e];
          }
        }
      }
    }
  return r;
}

// The shape s with its inputs: q with row stride qs, k and v with row stride kvs.
ops::AttentionArgs with_inputs(ops::AttentionArgs s, const float* q, i64 qs, const float* k, const float* v, i64 kvs,
                               const int32_t* doc_start = nullptr) {
  s.q = q, s.q_stride = qs, s.k = k, s.v = v, s.kv_stride = kvs, s.doc_start = doc_start;
  return s;
}

struct KernelOut {
  std::vector<float> o, lse, dqkv;
};

// Runs the kernel; the gradient buffer is NaN in the q/k/v slots and 7 in the padding (must survive).
KernelOut run_kernel(const Case& c, const std::vector<float>& qkv, const std::vector<float>* dout,
                     const std::vector<int32_t>* doc = nullptr) {
  const i64 st = c.stride();
  const float* base = qkv.data();
  KernelOut r;
  r.o = nan_vec(c.B * c.T * c.H * c.hd);
  r.lse = nan_vec(c.B * c.H * c.T);
  const int32_t* ds = doc ? doc->data() : nullptr;
  const ops::AttentionArgs a = with_inputs(c.shape(), base + c.qoff(), st, base + c.koff(), base + c.voff(), st, ds);
  ops::attention_forward(a, r.o.data(), r.lse.data());
  if (dout) {
    r.dqkv = nan_vec(c.B * c.T * st);
    for (i64 n = 0; n < c.B * c.T; ++n)
      for (i64 j = (c.H + 2 * c.Hkv) * c.hd; j < st; ++j) r.dqkv[n * st + j] = 7.f;
    float* g = r.dqkv.data();
    ops::attention_backward(a, r.o.data(), r.lse.data(), dout->data(), {g + c.qoff(), g + c.koff(), g + c.voff()});
  }
  return r;
}

// Gradient slots only (the padding holds 7 in the kernel run and 0 in the reference).
template <typename V>
std::vector<double> slots(const Case& c, const V& full, int which) {
  const i64 off = which == 0 ? c.qoff() : which == 1 ? c.koff() : c.voff();
  return unpack_rows(full, c.B * c.T, c.stride(), off, (which == 0 ? c.H : c.Hkv) * c.hd);
}

void check_padding(const Case& c, const std::vector<float>& g) {
  const i64 st = c.stride();
  for (i64 n = 0; n < c.B * c.T; ++n)
    for (i64 j = (c.H + 2 * c.Hkv) * c.hd; j < st; ++j) ASSERT_EQ(g[n * st + j], 7.f) << c.name();
}

double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / std::max<size_t>(1, v.size()));
}

std::vector<Case> cases() {
  return {
      {1, 1, 1, 1, 16, 0},
      {2, 65, 4, 1, 32, 0},
      {2, 130, 4, 2, 16, 0},
      {1, 130, 2, 2, 64, 0},
      {2, 65, 4, 4, 16, 1},
      {1, 130, 2, 1, 32, 129},
      {1, 130, 2, 1, 32, 130},
      {1, 65, 2, 2, 16, 300},
      {1, 200, 4, 2, 64, 37},
      {3, 77, 2, 2, 32, 64},
      {1, 129, 2, 1, 16, 65},
      {1, 100, 2, 2, 24, 0},
      {2, 70, 3, 3, 8, 20},
      {1, 2, 1, 1, 16, 1},
      {1, 64, 4, 1, 64, 0},
      {1, 150, 1, 1, 80, 17},
      // Large enough for the parallel path (and, with B*Hkv small, the split backward).
      {2, 300, 4, 2, 32, 0},
      {1, 400, 2, 1, 64, 100},
  };
}

}  // namespace

TEST(Attention, ForwardMatchesDoubleReferenceOverShapesAndWindows) {
  for (const Case& c : cases()) {
    auto qkv = randn(c.B * c.T * c.stride(), 100 + c.T + c.W);
    auto ref = reference(c, to_double(qkv), nullptr);
    auto got = run_kernel(c, qkv, nullptr);
    EXPECT_TRUE(close_rel(got.o, ref.o, 2e-6, "o " + c.name()));
    EXPECT_TRUE(close_rel(got.lse, ref.lse, 1e-6, "lse " + c.name()));
  }
}

TEST(Attention, BackwardMatchesAnalyticDoubleReference) {
  for (const Case& c : cases()) {
    auto qkv = randn(c.B * c.T * c.stride(), 200 + c.T + c.W);
    auto dout = randn(c.B * c.T * c.H * c.hd, 300 + c.hd);
    auto dd = to_double(dout);
    auto ref = reference(c, to_double(qkv), &dd);
    auto got = run_kernel(c, qkv, &dout);
    for (int w = 0; w < 3; ++w) {
      const std::string what = std::string(w == 0 ? "dq " : w == 1 ? "dk " : "dv ") + c.name();
      auto g = slots(c, got.dqkv, w), want = slots(c, ref.dqkv, w);
      if (rms(want) == 0) {
        // W = 1: o = v exactly, so dq = dk = 0 and only fp32 rounding of dP - D remains; measure it
        // against the size of the gradient that does flow (dv = dout).
        EXPECT_LT(rms(g), 1e-6 * rms(slots(c, ref.dqkv, 2))) << what;
      } else {
        EXPECT_TRUE(close_rel(g, want, 1e-5, what));
      }
    }
    check_padding(c, got.dqkv);
  }
}

TEST(Attention, ExplicitScaleAndLargeScoresStayStable) {
  Case c{2, 90, 4, 2, 32, 0, 0.37f};
  auto qkv = randn(c.B * c.T * c.stride(), 7, 6.0);  // scores up to ~|100|: needs the running max
  auto dout = randn(c.B * c.T * c.H * c.hd, 8);
  auto dd = to_double(dout);
  auto ref = reference(c, to_double(qkv), &dd);
  auto got = run_kernel(c, qkv, &dout);
  EXPECT_TRUE(close_rel(got.o, ref.o, 2e-6, "o"));
  EXPECT_TRUE(close_rel(got.lse, ref.lse, 1e-6, "lse"));
  for (int w = 0; w < 3; ++w) EXPECT_TRUE(close_rel(slots(c, got.dqkv, w), slots(c, ref.dqkv, w), 1e-4, "grad"));
}

// The double reference's analytic gradient agrees with central differences of the double reference
// (so the tight kernel-vs-reference check above tests against a true gradient).
TEST(Attention, ReferenceGradientMatchesFiniteDifferencesInDouble) {
  for (Case c : {Case{1, 9, 2, 1, 8, 0}, Case{2, 11, 2, 2, 8, 3}}) {
    auto qkv = to_double(randn(c.B * c.T * c.stride(), 41));
    auto R = to_double(randn(c.B * c.T * c.H * c.hd, 42));
    auto ref = reference(c, qkv, &R);
    auto loss = [&]() {
      auto o = reference(c, qkv, nullptr).o;
      double s = 0;
      for (size_t i = 0; i < o.size(); ++i) s += o[i] * R[i];
      return s;
    };
    std::vector<double> fd(qkv.size(), 0.0);
    for (size_t i = 0; i < qkv.size(); ++i)
      if (static_cast<i64>(i % c.stride()) < (c.H + 2 * c.Hkv) * c.hd) fd[i] = fd_grad(qkv, i, loss, 1e-5);
    EXPECT_TRUE(close_rel(ref.dqkv, fd, 1e-7, "reference gradient " + c.name()));
  }
}

// Kernel gradient vs central differences of the kernel itself (fp32 forward, eps 1e-2).
TEST(Attention, KernelGradientMatchesFiniteDifferences) {
  for (Case c : {Case{1, 70, 2, 1, 16, 0}, Case{2, 33, 2, 2, 16, 5}}) {
    auto qkv = randn(c.B * c.T * c.stride(), 51);
    auto R = randn(c.B * c.T * c.H * c.hd, 52);
    auto got = run_kernel(c, qkv, &R);
    std::vector<double> Rd = to_double(R);
    auto loss = [&]() {
      auto o = run_kernel(c, qkv, nullptr).o;
      double s = 0;
      for (size_t i = 0; i < o.size(); ++i) s += o[i] * Rd[i];
      return s;
    };
    // A spread of entries of each of q, k, v (every 7th slot of the fused rows).
    std::vector<double> want, have;
    const i64 used = (c.H + 2 * c.Hkv) * c.hd;
    for (size_t i = 0; i < qkv.size(); i += 7) {
      if (static_cast<i64>(i % c.stride()) >= used) continue;
      want.push_back(fd_grad(qkv, i, loss, 1e-2));
      have.push_back(got.dqkv[i]);
    }
    // fp32 forward: rounding of the loss over 2*eps dominates (measured ~4e-5).
    EXPECT_TRUE(close_rel(have, want, 3e-4, "fd " + c.name()));
  }
}

namespace {
// Two rows of T = 150 tokens: row 0 packs documents of length 40, 1, 70, 39; row 1 is one document.
const std::vector<std::vector<i64>> kPackedDocs = {{40, 1, 70, 39}, {150}};

// The packed rows with window W, random q/k/v (seed + W) and dout (seed + 1), and the masked double reference.
struct PackedCase {
  Case c;
  std::vector<int32_t> ds;
  std::vector<float> qkv, dout;
  Ref ref;
};
PackedCase packed_case(i64 W, uint64_t seed) {
  PackedCase p{Case{2, 150, 4, 2, 32, W}, doc_start_from_lengths(150, kPackedDocs), {}, {}, {}};
  p.qkv = randn(p.c.B * p.c.T * p.c.stride(), seed + W);
  p.dout = randn(p.c.B * p.c.T * p.c.H * p.c.hd, seed + 1);
  const auto dd = to_double(p.dout);
  p.ref = reference(p.c, to_double(p.qkv), &dd, &p.ds);
  return p;
}
}  // namespace

TEST(Attention, PackedDocumentsEqualSeparateRuns) {
  for (i64 W : {i64{0}, i64{23}}) {
    const PackedCase p = packed_case(W, 61);
    const Case& c = p.c;
    const i64 T = c.T;
    const auto &qkv = p.qkv, &dout = p.dout;
    const auto& docs = kPackedDocs;
    const Ref& ref = p.ref;
    auto packed = run_kernel(c, qkv, &dout, &p.ds);
    // The packed run also matches the masked reference.
    EXPECT_TRUE(close_rel(packed.o, ref.o, 2e-6, "packed o"));
    for (int w = 0; w < 3; ++w)
      EXPECT_TRUE(close_rel(slots(c, packed.dqkv, w), slots(c, ref.dqkv, w), 1e-5, "packed grad"));

    for (i64 b = 0; b < 2; ++b) {
      i64 t0 = 0;
      for (i64 len : docs[b]) {
        Case one{1, len, c.H, c.Hkv, c.hd, W};
        const i64 st = c.stride();
        std::vector<float> q1(qkv.begin() + (b * T + t0) * st, qkv.begin() + (b * T + t0 + len) * st);
        std::vector<float> d1(dout.begin() + (b * T + t0) * c.H * c.hd, dout.begin() + (b * T + t0 + len) * c.H * c.hd);
        auto alone = run_kernel(one, q1, &d1);
        std::vector<float> o_p(packed.o.begin() + (b * T + t0) * c.H * c.hd,
                               packed.o.begin() + (b * T + t0 + len) * c.H * c.hd);
        std::vector<float> g_p(packed.dqkv.begin() + (b * T + t0) * st, packed.dqkv.begin() + (b * T + t0 + len) * st);
        std::vector<float> lse_p;
        for (i64 h = 0; h < c.H; ++h)
          for (i64 t = 0; t < len; ++t) lse_p.push_back(packed.lse[(b * c.H + h) * T + t0 + t]);
        const std::string what = "doc b=" + std::to_string(b) + " t0=" + std::to_string(t0) + " W=" + std::to_string(W);
        EXPECT_TRUE(close_rel(o_p, alone.o, 1e-6, what + " o"));
        EXPECT_TRUE(close_rel(lse_p, alone.lse, 1e-6, what + " lse"));
        for (int w = 0; w < 3; ++w)
          EXPECT_TRUE(close_rel(slots(one, g_p, w), slots(one, alone.dqkv, w), 1e-6, what + " grad"));
        t0 += len;
      }
    }
  }
}

namespace {
// Forward and backward with 1, 3 and the default number of threads give the same bits.
void expect_bitwise_equal_across_thread_counts() {
  // B*Hkv = 1 splits the backward into key-tile segments; B*Hkv = 32 does not.
  for (Case c : {Case{1, 300, 2, 1, 32, 0}, Case{8, 70, 4, 4, 16, 50}}) {
    auto qkv = randn(c.B * c.T * c.stride(), 71);
    auto dout = randn(c.B * c.T * c.H * c.hd, 72);
    const int old = omp_get_max_threads();
    omp_set_num_threads(1);
    auto a = run_kernel(c, qkv, &dout);
    omp_set_num_threads(3);
    auto b = run_kernel(c, qkv, &dout);
    omp_set_num_threads(old);
    auto c2 = run_kernel(c, qkv, &dout);
    for (const KernelOut* r : {&b, &c2}) {
      EXPECT_EQ(0, std::memcmp(a.o.data(), r->o.data(), a.o.size() * 4)) << c.name();
      EXPECT_EQ(0, std::memcmp(a.lse.data(), r->lse.data(), a.lse.size() * 4)) << c.name();
      EXPECT_EQ(0, std::memcmp(a.dqkv.data(), r->dqkv.data(), a.dqkv.size() * 4)) << c.name();
    }
  }
}
}  // namespace

TEST(Attention, BitwiseEqualAcrossThreadCounts) { expect_bitwise_equal_across_thread_counts(); }

TEST(Attention, BadArgumentsThrowWithOpName) {
  std::vector<float> buf(4096, 0.f);
  float* p = buf.data();
  auto expect_msg = [](auto fn, const std::string& prefix) {
    try {
      fn();
      ADD_FAILURE() << "no throw, wanted " << prefix;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
    }
  };
  ops::AttentionArgs s;
  s.B = 1, s.T = 4, s.H = 3, s.Hkv = 2, s.hd = 8;  // H not a multiple of Hkv
  expect_msg([&] { ops::attention_forward(with_inputs(s, p, 64, p, p, 64), p, p); }, "attention_forward:");
  s.H = 4;
  expect_msg([&] { ops::attention_forward(with_inputs(s, p, 16, p, p, 64), p, p); }, "attention_forward: q_stride");
  expect_msg([&] { ops::attention_backward(with_inputs(s, p, 64, p, p, 8), p, p, p, {p, p, p}); },
             "attention_backward: kv_stride");
  s.window = -1;
  expect_msg([&] { ops::attention_forward(with_inputs(s, p, 64, p, p, 64), p, p); },
             "attention_forward: negative window");
  s.window = 0;
  // doc_start must describe contiguous documents: 0 0 2 2 is fine, 0 0 2 1 is not.
  std::vector<int32_t> good = {0, 0, 2, 2}, bad = {0, 0, 2, 1};
  ops::attention_forward(with_inputs(s, p, 64, p, p, 64, good.data()), p + 2048, p + 3072);
  expect_msg([&] { ops::attention_forward(with_inputs(s, p, 64, p, p, 64, bad.data()), p + 2048, p + 3072); },
             "attention_forward: doc_start");
}

// ---- key offset (Tk > T): a prefill chunk of T queries after Tk - T cached keys -----------------------
namespace {

struct OffCase {
  i64 B, T, Tk, H, Hkv, hd, W;
  std::string name() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " Tk=" + std::to_string(Tk) +
           " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) + " hd=" + std::to_string(hd) +
           " W=" + std::to_string(W);
  }
};

// Naive masked attention in double: query t of row b is position p = t + Tk - T and sees keys
// j <= p with j > p - W (W > 0). q: [B, T, H, hd]; k, v: [B, Tk, Hkv, hd] (kv row stride ks).
void offset_reference(const OffCase& c, const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& v, i64 ks, std::vector<double>& o, std::vector<double>& lse) {
  const i64 hpg = c.H / c.Hkv, off = c.Tk - c.T;
  const double scale = 1.0 / std::sqrt(double(c.hd));
  o.assign(c.B * c.T * c.H * c.hd, 0.0);
  lse.assign(c.B * c.H * c.T, 0.0);
  std::vector<double> s(c.Tk);
  for (i64 b = 0; b < c.B; ++b)
    for (i64 h = 0; h < c.H; ++h)
      for (i64 t = 0; t < c.T; ++t) {
        const i64 p = t + off, g = h / hpg;
        const i64 j0 = c.W > 0 ? std::max<i64>(0, p - c.W + 1) : 0;
        double mx = -1e300;
        for (i64 j = j0; j <= p; ++j) {
          double d = 0;
          for (i64 e = 0; e < c.hd; ++e)
            d += double(q[((b * c.T + t) * c.H + h) * c.hd + e]) * k[(b * c.Tk + j) * ks + g * c.hd + e];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (i64 j = j0; j <= p; ++j) sum += std::exp(s[j] - mx);
        lse[(b * c.H + h) * c.T + t] = mx + std::log(sum);
        for (i64 j = j0; j <= p; ++j)
          for (i64 e = 0; e < c.hd; ++e)
            o[((b * c.T + t) * c.H + h) * c.hd + e] += std::exp(s[j] - mx) / sum * v[(b * c.Tk + j) * ks + g * c.hd + e];
      }
}

// One key-offset case: random q, k, v (padded key rows, so the stride is honoured; seeds from `seed`), the
// kernel's forward (o, lse) and the double reference (ro, rl).
struct OffsetRun {
  std::vector<float> o, lse;
  std::vector<double> ro, rl;
};
OffsetRun run_offset_case(const OffCase& c, uint64_t seed) {
  const i64 ks = c.Hkv * c.hd + 5;
  auto q = randn(c.B * c.T * c.H * c.hd, seed + c.T);
  auto k = randn(c.B * c.Tk * ks, seed + 1 + c.Tk), v = randn(c.B * c.Tk * ks, seed + 2 + c.W);
  OffsetRun r;
  offset_reference(c, q, k, v, ks, r.ro, r.rl);
  r.o = nan_vec(c.B * c.T * c.H * c.hd), r.lse = nan_vec(c.B * c.H * c.T);
  ops::AttentionArgs s;
  s.B = c.B, s.T = c.T, s.Tk = c.Tk, s.H = c.H, s.Hkv = c.Hkv, s.hd = c.hd, s.window = c.W;
  ops::attention_forward(with_inputs(s, q.data(), c.H * c.hd, k.data(), v.data(), ks), r.o.data(), r.lse.data());
  return r;
}

}  // namespace

TEST(Attention, KeyOffsetForwardMatchesDoubleReference) {
  // Offsets that are and are not tile multiples, chunks shorter and longer than the window, one query,
  // windows of 1, GQA, T = Tk (no offset) through the same path.
  const std::vector<OffCase> cs = {
      {1, 1, 1, 1, 1, 16, 0},     {1, 1, 200, 2, 1, 32, 0},   {1, 1, 200, 2, 1, 32, 5},
      {2, 7, 70, 4, 2, 16, 0},    {2, 7, 70, 4, 2, 16, 20},   {1, 64, 128, 2, 2, 64, 0},
      {1, 65, 190, 4, 1, 32, 64}, {1, 100, 163, 2, 1, 16, 1}, {3, 33, 96, 2, 2, 24, 127},
      {1, 130, 130, 2, 1, 32, 0}, {1, 130, 131, 2, 1, 32, 50}, {1, 3, 300, 4, 4, 16, 300},
      {2, 90, 400, 4, 2, 32, 0},  {1, 200, 327, 4, 2, 64, 128}, {1, 40, 167, 4, 2, 64, 128},
  };
  for (const OffCase& c : cs) {
    const OffsetRun r = run_offset_case(c, 900);
    EXPECT_TRUE(close_rel(r.o, r.ro, 2e-6, "o " + c.name()));
    EXPECT_TRUE(close_rel(r.lse, r.rl, 1e-6, "lse " + c.name()));
  }
}

// With a key offset the number of work items follows the thread count (each item copies the keys it reads);
// the output must not: bitwise equal for 1, 2 and 3 threads, with and without a window.
TEST(Attention, KeyOffsetBitwiseEqualAcrossThreadCounts) {
  for (const OffCase& c : {OffCase{1, 200, 1400, 4, 2, 64, 0}, OffCase{2, 130, 900, 4, 1, 32, 300}}) {
    auto q = randn(c.B * c.T * c.H * c.hd, 940), k = randn(c.B * c.Tk * c.Hkv * c.hd, 941),
         v = randn(c.B * c.Tk * c.Hkv * c.hd, 942);
    ops::AttentionArgs s;
    s.B = c.B, s.T = c.T, s.Tk = c.Tk, s.H = c.H, s.Hkv = c.Hkv, s.hd = c.hd, s.window = c.W;
    std::vector<std::vector<float>> o, lse;
    const int old = omp_get_max_threads();
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      o.push_back(nan_vec(c.B * c.T * c.H * c.hd));
      lse.push_back(nan_vec(c.B * c.H * c.T));
      ops::attention_forward(with_inputs(s, q.data(), c.H * c.hd, k.data(), v.data(), c.Hkv * c.hd), o.back().data(),
                             lse.back().data());
    }
    omp_set_num_threads(old);
    for (int i : {1, 2}) {
      EXPECT_EQ(0, std::memcmp(o[0].data(), o[i].data(), o[0].size() * 4)) << c.name() << " threads " << i + 1;
      EXPECT_EQ(0, std::memcmp(lse[0].data(), lse[i].data(), lse[0].size() * 4)) << c.name() << " threads " << i + 1;
    }
  }
}

// Chunks over a sequence with keys [0, end) give the whole-sequence forward's rows (the prefill identity).
TEST(Attention, KeyOffsetChunksEqualTheWholeForward) {
  for (i64 W : {i64{0}, i64{37}}) {
    Case c{1, 150, 4, 2, 32, W};
    auto qkv = randn(c.T * c.stride(), 77 + W);
    auto whole = run_kernel(c, qkv, nullptr);
    std::vector<float> got = nan_vec(whole.o.size());
    const i64 st = c.stride();
    const i64 sizes[4] = {70, 3, 1, 64};  // shorter and longer than the window and the tile
    for (i64 t0 = 0, i = 0; t0 < c.T; ++i) {
      const i64 n = std::min<i64>(c.T - t0, sizes[i % 4]);
      ops::AttentionArgs s = c.shape();
      s.T = n, s.Tk = t0 + n;
      std::vector<float> lse = nan_vec(c.H * n);
      ops::attention_forward(with_inputs(s, qkv.data() + t0 * st, st, qkv.data() + c.koff(), qkv.data() + c.voff(), st),
                             got.data() + t0 * c.H * c.hd, lse.data());
      for (i64 h = 0; h < c.H; ++h)
        for (i64 t = 0; t < n; ++t) ASSERT_FLOAT_EQ(lse[h * n + t], whole.lse[h * c.T + t0 + t]) << t0;
      t0 += n;
    }
    EXPECT_TRUE(close_rel(got, whole.o, 1e-6, "chunked W=" + std::to_string(W)));
  }
}

TEST(Attention, KeyOffsetBadArgumentsThrow) {
  std::vector<float> buf(4096, 0.f);
  float* p = buf.data();
  ops::AttentionArgs s, s6;
  s.B = 1, s.T = 4, s.Tk = 3, s.H = 2, s.Hkv = 1, s.hd = 8;
  s6 = s;
  s6.Tk = 6;
  std::vector<int32_t> ds = {0, 0, 0, 0};
  const std::vector<std::pair<std::function<void()>, std::string>> bad = {
      {[&] { ops::attention_forward(with_inputs(s, p, 16, p, p, 8), p + 1024, p + 2048); }, "attention_forward: Tk=3"},
      {[&] { ops::attention_forward(with_inputs(s6, p, 16, p, p, 8, ds.data()), p + 1024, p + 2048); },
       "attention_forward: doc_start needs Tk == T"},
      {[&] { ops::attention_backward(with_inputs(s6, p, 16, p, p, 8), p, p, p, {p, p, p}); },
       "attention_backward: needs Tk == T"},
  };
  for (const auto& [fn, prefix] : bad) {
    std::string msg = "(no throw)";
    try {
      fn();
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg << " wanted " << prefix;
  }
}

// ---- bf16 products (--precision bf16, ops/bf16_pairs.h) -----------------------------------------------------
// The same kernels with their seven products in bf16 (fp32 accumulation) against the double reference on the fp32
// inputs. Bound (docs/precision.md): rel RMS <= 4 u_bf sqrt(N), N the bf16 roundings along an output's chain:
// o: q, k (the scores), P and v: 4; lse: q, k: 2; dv: q, k, P, dO: 4; dq, dk: q, k, dO, v (P and dP), dS and the
// other operand: 6.

TEST(AttentionBf16, ForwardAndBackwardFollowTheDoubleReferenceWithinTheBf16Bound) {
  SKIP_UNLESS_BF16_KERNELS();
  for_each_bf16_product_path([&] {
    std::vector<Case> cs = cases();
    cs.push_back({2, 90, 4, 2, 32, 0, 0.37f});  // an explicit scale
    for (const Case& c : cs) {
      auto qkv = randn(c.B * c.T * c.stride(), 500 + c.T + c.W);
      auto dout = randn(c.B * c.T * c.H * c.hd, 600 + c.hd);
      auto dd = to_double(dout);
      auto ref = reference(c, to_double(qkv), &dd);
      const KernelOut fp32 = run_kernel(c, qkv, &dout);
      KernelOut got;
      {
        const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
        got = run_kernel(c, qkv, &dout);
      }
      EXPECT_TRUE(close_rel(got.o, ref.o, bf16_tol(4), "o " + c.name()));
      EXPECT_TRUE(close_rel(got.lse, ref.lse, bf16_tol(2), "lse " + c.name()));
      // bf16 really ran: o differs from the fp32 kernel's by more than a tenth of u_bf (fp32 alone: ~1e-7).
      EXPECT_GT(rel_rms_diff(got.o, fp32.o), 0.1 * kBf16UnitRoundoff) << c.name();
      const double dv_rms = rms(slots(c, ref.dqkv, 2));
      for (int w = 0; w < 3; ++w) {
        const std::string what = std::string(w == 0 ? "dq " : w == 1 ? "dk " : "dv ") + c.name();
        const double tol = bf16_tol(w == 2 ? 4 : 6);
        auto g = slots(c, got.dqkv, w), want = slots(c, ref.dqkv, w);
        if (rms(want) == 0)  // W = 1: dq = dk = 0 exactly; what remains is rounding, measured against dv
          EXPECT_LT(rms(g), tol * dv_rms) << what;
        else
          EXPECT_TRUE(close_rel(g, want, tol, what));
      }
      check_padding(c, got.dqkv);
    }
  });
}

TEST(AttentionBf16, PackedDocumentsFollowTheMaskedReference) {
  SKIP_UNLESS_BF16_KERNELS();
  for_each_bf16_product_path([&] {
    for (i64 W : {i64{0}, i64{23}}) {
      const PackedCase p = packed_case(W, 71);
      const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
      auto got = run_kernel(p.c, p.qkv, &p.dout, &p.ds);
      EXPECT_TRUE(close_rel(got.o, p.ref.o, bf16_tol(4), "o W=" + std::to_string(W)));
      for (int w = 0; w < 3; ++w)
        EXPECT_TRUE(close_rel(slots(p.c, got.dqkv, w), slots(p.c, p.ref.dqkv, w), bf16_tol(w == 2 ? 4 : 6),
                              "grad " + std::to_string(w) + " W=" + std::to_string(W)));
    }
  });
}

TEST(AttentionBf16, KeyOffsetForwardFollowsTheDoubleReference) {
  SKIP_UNLESS_BF16_KERNELS();
  for_each_bf16_product_path([&] {
    for (const OffCase& c : {OffCase{1, 1, 200, 2, 1, 32, 0}, OffCase{2, 7, 70, 4, 2, 16, 20},
                             OffCase{1, 65, 190, 4, 1, 32, 64}, OffCase{1, 40, 167, 4, 2, 64, 128},
                             OffCase{3, 33, 96, 2, 2, 24, 127}}) {
      const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
      const OffsetRun r = run_offset_case(c, 950);
      EXPECT_TRUE(close_rel(r.o, r.ro, bf16_tol(4), "o " + c.name()));
      EXPECT_TRUE(close_rel(r.lse, r.rl, bf16_tol(2), "lse " + c.name()));
    }
  });
}

TEST(AttentionBf16, BitwiseEqualAcrossThreadCounts) {
  SKIP_UNLESS_BF16_KERNELS();
  for_each_bf16_product_path([&] {
    const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
    expect_bitwise_equal_across_thread_counts();
  });
}

// An odd head dimension cannot be paired: the kernels keep fp32 products there, bit for bit.
TEST(AttentionBf16, OddHeadDimKeepsFp32Products) {
  SKIP_UNLESS_BF16_KERNELS();
  Case c{1, 70, 2, 1, 15, 0};
  auto qkv = randn(c.B * c.T * c.stride(), 81);
  auto dout = randn(c.B * c.T * c.H * c.hd, 82);
  const KernelOut fp32 = run_kernel(c, qkv, &dout);
  const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
  const KernelOut got = run_kernel(c, qkv, &dout);
  EXPECT_EQ(0, std::memcmp(got.o.data(), fp32.o.data(), got.o.size() * 4));
  EXPECT_EQ(0, std::memcmp(got.dqkv.data(), fp32.dqkv.data(), got.dqkv.size() * 4));
}
