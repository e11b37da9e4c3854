// Micro-benchmarks of one Gated DeltaNet layer against one sliding-window (W = 128) attention layer at the
// bench config (B = 8, T = 1024, D = 256, 4 heads of 64, chunk 64): mixer forward, forward + backward, and
// a decode step (B = 8); and one Mamba-2 layer (d_inner 512, d_state 64), forward + backward. Counters:
// tokens/s; compare G with S in the same run (the CPU is shared).
#include <benchmark/benchmark.h>

#include <memory>
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

struct Layer {
  hlm::ModelConfig cfg;
  hlm::ParamRegistry reg;
  std::unique_ptr<hlm::Mixer> m;
  std::vector<float> P, G, x, y, dx;
  hlm::Arena arena;
  explicit Layer(const char* preset) : cfg(hlm::resolve_config(preset, "", {})) {
    m = hlm::make_mixer(cfg, 0, reg);
    P.resize(reg.total_floats());
    G.resize(P.size());
    hlm::Rng r(1);
    for (auto& v : P) v = static_cast<float>(0.02 * r.normal());
    m->bind(P.data(), G.data(), cfg.d_model);
    m->init_custom(r);
    x.resize(kB * kT * cfg.d_model);
    for (auto& v : x) v = static_cast<float>(r.normal());
    y.resize(x.size());
    dx.resize(x.size());
    arena.reserve(static_cast<std::size_t>(m->saved_floats(kB, kT) + m->scratch_floats(kB, kT)) * sizeof(float));
  }
  void forward() {
    arena.reset();
    m->forward(x.data(), y.data(), hlm::SeqInfo{kB, kT, nullptr}, arena);
  }
  void backward() { m->backward(x.data(), x.data(), dx.data(), hlm::SeqInfo{kB, kT, nullptr}, arena); }
};

void run(benchmark::State& st, const char* preset, bool with_backward) {
  Layer l(preset);
  for (auto _ : st) {
    l.forward();
    if (with_backward) l.backward();
    benchmark::DoNotOptimize(l.dx.data());
  }
  st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(kB * kT), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_MixerGdnForward(benchmark::State& st) { run(st, "gdn", false); }
void BM_MixerSwa128Forward(benchmark::State& st) { run(st, "swa128", false); }
void BM_MixerGdnForwardBackward(benchmark::State& st) { run(st, "gdn", true); }
void BM_MixerSwa128ForwardBackward(benchmark::State& st) { run(st, "swa128", true); }
void BM_MixerMamba2ForwardBackward(benchmark::State& st) { run(st, "mamba2", true); }

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
BENCHMARK(BM_MixerGdnDecodeStep)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
