// Micro-benchmarks of one Gated DeltaNet layer against one sliding-window (W = 128) attention layer at the
// bench config (B = 8, T = 1024, D = 256, 4 heads of 64, chunk 64): mixer forward, forward + backward, and
// a decode step (B = 8); and one Mamba-2 layer (d_inner 512, d_state 64), forward + backward. BM_MixerStudySmall/P:
// one layer of each mixer (P: 0 full, 1 swa128, 2 lightning, 3 mamba2, 4 gdn) forward + backward at the reproduce
// study's `small` shape (B = 16, T = 128, d_model 128, 4 heads of 32), which trains one thread per run: run it with
// OMP_NUM_THREADS=1. Counters: tokens/s; compare mixers within one run (the CPU is shared).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/params.h"
#include "core/rng.h"
#include "mixers/mixer.h"
#include "model/config.h"
#include "model/layer_spec.h"

using hlm::i64;

namespace {

constexpr i64 kB = 8, kT = 1024;

// A layer's batch shape and the config keys set on its preset.
struct Shape {
  i64 B, T;
  std::vector<std::string> set;
};
const Shape kBenchShape{kB, kT, {}};
const Shape kStudySmallShape{16, 128, {"d_model=128", "n_heads=4", "n_kv_heads=4", "head_dim=32", "d_ff=384"}};

struct Layer {
  hlm::ModelConfig cfg;
  hlm::ParamRegistry reg;
  std::unique_ptr<hlm::Mixer> m;
  std::vector<float> P, G, x, y, dx;
  hlm::Arena arena;
  i64 B, T;
  explicit Layer(const char* preset, const Shape& shape = kBenchShape)
      : cfg(hlm::resolve_config(preset, "", shape.set)), B(shape.B), T(shape.T) {
    m = hlm::make_mixer(cfg, 0, reg);
    P.resize(reg.total_floats());
    G.resize(P.size());
    hlm::Rng r(1);
    for (auto& v : P) v = static_cast<float>(0.02 * r.normal());
    m->bind(P.data(), G.data(), cfg.d_model);
    m->init_custom(r);
    x.resize(B * T * cfg.d_model);
    for (auto& v : x) v = static_cast<float>(r.normal());
    y.resize(x.size());
    dx.resize(x.size());
    arena.reserve(static_cast<std::size_t>(m->saved_floats(B, T) + m->scratch_floats(B, T)) * sizeof(float));
  }
  void forward() {
    arena.reset();
    m->forward(x.data(), y.data(), hlm::SeqInfo{B, T, nullptr}, arena);
  }
  void backward() { m->backward(x.data(), x.data(), dx.data(), hlm::SeqInfo{B, T, nullptr}, arena); }
};

void run(benchmark::State& st, const char* preset, bool with_backward, const Shape& shape = kBenchShape) {
  Layer l(preset, shape);
  for (auto _ : st) {
    l.forward();
    if (with_backward) l.backward();
    benchmark::DoNotOptimize(l.dx.data());
  }
  st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(l.B * l.T), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_MixerGdnForward(benchmark::State& st) { run(st, "gdn", false); }
void BM_MixerSwa128Forward(benchmark::State& st) { run(st, "swa128", false); }
void BM_MixerGdnForwardBackward(benchmark::State& st) { run(st, "gdn", true); }
void BM_MixerSwa128ForwardBackward(benchmark::State& st) { run(st, "swa128", true); }
void BM_MixerMamba2ForwardBackward(benchmark::State& st) { run(st, "mamba2", true); }
void BM_MixerStudySmall(benchmark::State& st) {
  static const char* const presets[] = {"full", "swa128", "lightning", "mamba2", "gdn"};
  const char* preset = presets[st.range(0)];
  st.SetLabel(preset);
  run(st, preset, true, kStudySmallShape);
}

void BM_MixerGdnDecodeStep(benchmark::State& st) {
  Layer l("gdn");
  auto s = l.m->new_state(kB, kT);
  for (auto _ : st) {
    l.m->step(l.x.data(), l.y.data(), *s, kB);
    benchmark::DoNotOptimize(l.y.data());
  }
  st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(kB), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_MixerGdnForward)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_MixerSwa128Forward)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_MixerGdnForwardBackward)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_MixerSwa128ForwardBackward)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_MixerMamba2ForwardBackward)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_MixerStudySmall)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_MixerGdnDecodeStep)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
