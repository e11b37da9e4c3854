#pragma once
// A single mixer outside a model, for the per-mixer tests (tests/test_mixer_*.cpp): its own registry,
// parameter/gradient buffers and an arena sized from the mixer's saved/scratch bounds, plus helpers to
// run forward/backward/step/prefill on plain vectors. Parameters are initialised like Model::init
// (then the mixer's init_custom), optionally with every Normal tensor scaled up so all paths carry signal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/params.h"
#include "core/rng.h"
#include "mixers/mixer.h"
#include "model/config.h"
#include "model/model.h"
#include "testing.h"

namespace hlm::testing {

struct MixerRig {
  ModelConfig cfg;
  ParamRegistry reg;
  ParamStore store;
  std::unique_ptr<Mixer> m;
  Arena arena;
  i64 D = 0;

  MixerRig(const ModelConfig& c, i64 layer) : cfg(c), D(c.d_model) {
    m = make_mixer(cfg, layer, reg);
    store.allocate(reg.total_floats());
    m->bind(store.data.data(), store.grad.data(), D);
  }

  // Model::init's rules; Normal tensors get std * normal_scale.
  void init(std::uint64_t seed, double normal_scale = 1.0) {
    Rng rng(seed);
    for (const auto& p : reg.all()) {
      float* w = store.data.data() + p.offset;
      const i64 n = p.shape.numel();
      for (i64 i = 0; i < n; ++i) {
        switch (p.init) {
          case Init::Normal: w[i] = static_cast<float>(rng.normal() * p.init_a * normal_scale); break;
          case Init::Ones: w[i] = 1.f; break;
          case Init::Zeros: w[i] = 0.f; break;
          case Init::Uniform: w[i] = static_cast<float>(rng.uniform(p.init_a, p.init_b)); break;
          case Init::Custom: break;
        }
      }
    }
    m->init_custom(rng);
  }

  const ParamInfo& info(const std::string& suffix) const {
    for (const auto& p : reg.all())
      if (p.name.size() >= suffix.size() && p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0)
        return p;
    throw std::runtime_error("no parameter ending in " + suffix);
  }
  float* param(const std::string& suffix) { return store.data.data() + info(suffix).offset; }

  void plan(i64 B, i64 T) {
    const std::size_t need = static_cast<std::size_t>(m->saved_floats(B, T) + m->scratch_floats(B, T)) * sizeof(float);
    if (arena.capacity() < need) arena.reserve(need);
  }

  // y [B, T, D]. Leaves the saved state in the arena for backward().
  std::vector<float> forward(const std::vector<float>& x, i64 B, i64 T, const int32_t* doc_start = nullptr) {
    plan(B, T);
    arena.reset();
    std::vector<float> y = nan_vec(static_cast<size_t>(B * T * D));
    SeqInfo s{B, T, doc_start};
    m->forward(x.data(), y.data(), s, arena);
    EXPECT_LE(arena.high_water(), arena.capacity());
    return y;
  }

  // dx after the forward() just run; parameter gradients accumulate into store.grad.
  std::vector<float> backward(const std::vector<float>& x, const std::vector<float>& dy, i64 B, i64 T,
                              const int32_t* doc_start = nullptr) {
    std::vector<float> dx = nan_vec(static_cast<size_t>(B * T * D));
    SeqInfo s{B, T, doc_start};
    m->backward(x.data(), dy.data(), dx.data(), s, arena);
    return dx;
  }

  void zero_grad() { std::fill(store.grad.begin(), store.grad.end(), 0.f); }
  std::vector<double> params_d() const { return {store.data.begin(), store.data.end()}; }
  std::vector<float> grads() const { return {store.grad.begin(), store.grad.end()}; }

  // Token-by-token decoding of x [B, T, D] from a fresh state (or `st` when given).
  std::vector<float> decode(const std::vector<float>& x, i64 B, i64 T, MixerState* st = nullptr, i64 t0 = 0,
                            i64 t1 = -1) {
    std::unique_ptr<MixerState> own;
    if (!st) {
      own = m->new_state(B, T);
      st = own.get();
    }
    if (t1 < 0) t1 = T;
    std::vector<float> y = nan_vec(static_cast<size_t>(B * T * D));
    std::vector<float> xt(static_cast<size_t>(B * D)), yt(static_cast<size_t>(B * D));
    for (i64 t = t0; t < t1; ++t) {
      for (i64 b = 0; b < B; ++b)
        std::copy(x.begin() + (b * T + t) * D, x.begin() + (b * T + t + 1) * D, xt.begin() + b * D);
      m->step(xt.data(), yt.data(), *st, B);
      for (i64 b = 0; b < B; ++b) std::copy(yt.begin() + b * D, yt.begin() + (b + 1) * D, y.begin() + (b * T + t) * D);
    }
    return y;
  }

  // Prefill tokens [t0, t1) of x [B, T, D] into `st`, writing those rows of `y`.
  void prefill(const std::vector<float>& x, std::vector<float>& y, i64 B, i64 T, MixerState& st, i64 t0, i64 t1) {
    const i64 n = t1 - t0;
    std::vector<float> xs(static_cast<size_t>(B * n * D)), ys = nan_vec(static_cast<size_t>(B * n * D));
    for (i64 b = 0; b < B; ++b)
      std::copy(x.begin() + (b * T + t0) * D, x.begin() + (b * T + t1) * D, xs.begin() + b * n * D);
    Arena a(static_cast<std::size_t>(m->saved_floats(B, n) + m->scratch_floats(B, n)) * sizeof(float));
    m->prefill(xs.data(), ys.data(), B, n, st, a);
    for (i64 b = 0; b < B; ++b)
      std::copy(ys.begin() + b * n * D, ys.begin() + (b + 1) * n * D, y.begin() + (b * T + t0) * D);
  }
};

// Rows [b] of a [B, T, D] tensor, tokens [t0, t1), as a [1, t1 - t0, D] tensor.
inline std::vector<float> slice_tokens(const std::vector<float>& v, i64 T, i64 D, i64 b, i64 t0, i64 t1) {
  return std::vector<float>(v.begin() + (b * T + t0) * D, v.begin() + (b * T + t1) * D);
}

// Packed rows == each document run alone: outputs, input gradients and the accumulated parameter gradients
// within relative `tol`. Returns the packed forward output.
inline std::vector<float> expect_packed_equals_separate(MixerRig& rig, const std::vector<float>& x,
                                                        const std::vector<float>& dy, i64 B, i64 T, i64 D,
                                                        const std::vector<std::vector<i64>>& starts, double tol) {
  const auto ds = packed_doc_start(T, starts);
  rig.zero_grad();
  const auto y = rig.forward(x, B, T, ds.data());
  const auto dx = rig.backward(x, dy, B, T, ds.data());
  const std::vector<float> g_packed = rig.grads();
  rig.zero_grad();
  for (i64 b = 0; b < B; ++b)
    for (size_t k = 0; k < starts[b].size(); ++k) {
      const i64 t0 = starts[b][k], t1 = k + 1 < starts[b].size() ? starts[b][k + 1] : T;
      const auto xs = slice_tokens(x, T, D, b, t0, t1);
      const auto ys = rig.forward(xs, 1, t1 - t0);
      const auto dxs = rig.backward(xs, slice_tokens(dy, T, D, b, t0, t1), 1, t1 - t0);
      EXPECT_TRUE(close_rel(ys, slice_tokens(y, T, D, b, t0, t1), tol, "y doc"));
      EXPECT_TRUE(close_rel(dxs, slice_tokens(dx, T, D, b, t0, t1), tol, "dx doc"));
    }
  EXPECT_TRUE(close_rel(rig.grads(), g_packed, tol, "parameter grads"));
  return y;
}

// Token-by-token decoding and prefill in pieces (ending at each of `cuts`, then T) reproduce the forward
// output y (within relative `tol`); used with a max span set, so pieces start on and off span boundaries.
inline void expect_decode_and_pieces_equal_forward(MixerRig& rig, const std::vector<float>& x, i64 B, i64 T,
                                                   const std::vector<float>& y, const std::vector<i64>& cuts,
                                                   double tol) {
  EXPECT_TRUE(close_rel(rig.decode(x, B, T), y, tol, "span decode"));
  auto st = rig.m->new_state(B, T);
  std::vector<float> out = nan_vec(x.size());
  i64 t0 = 0;
  for (i64 t1 : cuts) rig.prefill(x, out, B, T, *st, t0, t1), t0 = t1;
  rig.prefill(x, out, B, T, *st, t0, T);
  EXPECT_TRUE(close_rel(out, y, tol, "span prefill"));
}

// The stated arena sizes (Mixer::arena_use, counted from the mixer's own buffer lists) are exactly what each
// phase uses on a fresh Arena: forward leaves `saved` and peaks at saved + forward_scratch, backward adds
// `backward` and releases it, prefill in `prefill_calls` chunks of T tokens peaks at `prefill` (a windowed
// layer once a full window is cached, so enough calls to pass it). The sizes are the worst case of what the
// shape leaves open, so the check sets a max span of T on a recurrent mixer (which changes no output) for the
// probe's doc_start copy (attention makes no copy: a span is a window to it), and doc_start must let gdn keep
// its chunk states (nullptr does).
inline void expect_arena_use_exact(MixerRig& rig, const std::vector<float>& x, i64 B, i64 T,
                                   const int32_t* doc_start = nullptr, int prefill_calls = 2) {
  Mixer& m = *rig.m;
  const i64 span0 = m.max_span();
  if (m.letter() != 'F' && m.letter() != 'S') m.set_max_span(T);
  const ArenaUse u = m.arena_use(B, T);
  auto bytes = [](i64 floats) { return static_cast<std::size_t>(floats) * sizeof(float); };
  // Arenas sized as the model sizes them (saved + scratch): any overflow would throw.
  const std::size_t capacity = bytes(m.saved_floats(B, T) + m.scratch_floats(B, T));
  Arena arena(capacity);
  std::vector<float> y = nan_vec(x.size()), dx = nan_vec(x.size());
  const SeqInfo s{B, T, doc_start};
  m.forward(x.data(), y.data(), s, arena);
  EXPECT_EQ(arena.used(), bytes(u.saved));
  EXPECT_EQ(arena.high_water(), bytes(u.saved + u.forward_scratch));
  m.backward(x.data(), x.data(), dx.data(), s, arena);
  EXPECT_EQ(arena.used(), bytes(u.saved));
  EXPECT_EQ(arena.high_water(), bytes(u.saved + std::max(u.forward_scratch, u.backward)));
  auto st = m.new_state(B, prefill_calls * T);
  std::size_t peak = 0;
  for (int k = 0; k < prefill_calls; ++k) {
    Arena a(capacity);
    m.prefill(x.data(), y.data(), B, T, *st, a);
    EXPECT_LE(a.high_water(), bytes(u.prefill)) << "prefill call " << k;
    peak = std::max(peak, a.high_water());
  }
  EXPECT_EQ(peak, bytes(u.prefill));
  m.set_max_span(span0);
}

// Below the worst case (e.g. documents that make gdn recompute its chunk states instead of keeping them):
// forward keeps at most saved_floats in the arena; forward + backward peak at most saved + scratch.
inline void expect_arena_within_bounds(MixerRig& rig, const std::vector<float>& x, i64 B, i64 T,
                                       const int32_t* doc_start = nullptr) {
  const std::size_t saved = static_cast<std::size_t>(rig.m->saved_floats(B, T)) * sizeof(float);
  const std::size_t scratch = static_cast<std::size_t>(rig.m->scratch_floats(B, T)) * sizeof(float);
  rig.forward(x, B, T, doc_start);
  EXPECT_LE(rig.arena.used(), saved);
  rig.backward(x, x, B, T, doc_start);
  EXPECT_LE(rig.arena.high_water(), saved + scratch);
}

// Richardson-extrapolated central difference of a float function: O(h^4) truncation, fp32 round-off
// dominates (the pattern of tests/test_model.cpp).
inline double richardson(float& w, const std::function<double()>& loss, float h) {
  const float old = w;
  auto central = [&](float e) {
    w = old + e;
    const double lp = loss();
    w = old - e;
    const double lm = loss();
    w = old;
    return (lp - lm) / (2.0 * static_cast<double>(e));
  };
  return (4.0 * central(h / 2) - central(h)) / 3.0;
}

// Exact reference gradients by complex-step differentiation: d/dp sum(ref(P + i h e_p, x) .* r) =
// Im(...) / h with h = 1e-30, free of the cancellation that limits central differences (their round-off,
// ~1e-16 |loss| / eps, swamps the ~1e-9 A_log gradients at decay extremes). `ref` is a plain reference of
// the whole mixer, written once as a template and run here on std::complex<double>; it reads parameters
// from the flat registry layout. Every parameter entry and every input entry is compared with the
// mixer's fp32 backward, per tensor (relative RMS error <= tol); the worst relative error seen is returned.
using cplx = std::complex<double>;
using MixerRefC = std::function<std::vector<cplx>(const std::vector<cplx>& P, const std::vector<cplx>& x)>;

inline double rel_rms(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

inline double check_grads_vs_reference(MixerRig& rig, const std::vector<float>& x, i64 B, i64 T,
                                     const int32_t* doc_start, const MixerRefC& ref, double tol,
                                     const std::string& what) {
  const std::vector<float> r = randn(x.size(), 4242);
  rig.zero_grad();
  rig.forward(x, B, T, doc_start);
  const std::vector<float> dx = rig.backward(x, r, B, T, doc_start);
  std::vector<cplx> Pc(rig.store.data.begin(), rig.store.data.end()), xc(x.begin(), x.end());
  constexpr double h = 1e-30;
  auto dloss = [&](std::vector<cplx>& v, size_t i) {
    const cplx old = v[i];
    v[i] += cplx(0, h);
    const std::vector<cplx> y = ref(Pc, xc);
    v[i] = old;
    double s = 0;
    for (size_t k = 0; k < y.size(); ++k) s += y[k].imag() * r[k];
    return s / h;
  };
  double worst = 0;
  for (const auto& p : rig.reg.all()) {
    const i64 n = p.shape.numel();
    std::vector<float> an(rig.store.grad.begin() + p.offset, rig.store.grad.begin() + p.offset + n);
    std::vector<double> want(static_cast<size_t>(n));
    for (i64 i = 0; i < n; ++i) want[i] = dloss(Pc, static_cast<size_t>(p.offset + i));
    EXPECT_TRUE(close_rel(an, want, tol, what + " " + p.name));
    worst = std::max(worst, rel_rms(an, want));
  }
  std::vector<double> exact_x(x.size());
  for (size_t i = 0; i < x.size(); ++i) exact_x[i] = dloss(xc, i);
  EXPECT_TRUE(close_rel(dx, exact_x, tol, what + " dx"));
  return std::max(worst, rel_rms(dx, exact_x));
}

// For each parameter tensor, its largest-gradient entry through the mixer's own fp32 forward, by
// Richardson-extrapolated central differences (test_model.cpp's pattern).
inline void check_grads_fp32_richardson(MixerRig& rig, const std::vector<float>& x, i64 B, i64 T,
                                        const int32_t* doc_start, const std::string& what) {
  const std::vector<float> r = randn(x.size(), 777);
  rig.zero_grad();
  rig.forward(x, B, T, doc_start);
  rig.backward(x, r, B, T, doc_start);
  const std::vector<float> g = rig.grads();
  auto loss = [&]() {
    const std::vector<float> y = rig.forward(x, B, T, doc_start);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
    return s;
  };
  for (const auto& p : rig.reg.all()) {
    i64 best = 0;
    for (i64 i = 0; i < p.shape.numel(); ++i)
      if (std::fabs(g[p.offset + i]) > std::fabs(g[p.offset + best])) best = i;
    float& w = rig.store.data[p.offset + best];
    const double fd = richardson(w, loss, 1e-2f * std::max(1.f, std::fabs(w)));
    const double an = g[p.offset + best];
    EXPECT_NEAR(an, fd, 2e-3 + 0.02 * std::fabs(fd)) << what << " " << p.name << "[" << best << "]";
  }
}

}  // namespace hlm::testing
