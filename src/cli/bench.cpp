// hybridlm bench: training-step speed (forward + backward + AdamW) of a config on random tokens.
#include <omp.h>

#include <algorithm>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/simd_target.h"
#include "core/timer.h"
#include "train/optimizer.h"

namespace hlm::cli {

Command register_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "measure training tokens/s and model GFLOP/s of a config");
  struct Opts {
    ModelFlags model;
    i64 batch = 8, seq_len = 1024;
    int steps = 5, warmup = 2, threads = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  o->model.add(sub);
  sub->add_option("--batch", o->batch, "rows per step")->capture_default_str();
  sub->add_option("--seq-len", o->seq_len, "tokens per row")->capture_default_str();
  sub->add_option("--steps", o->steps, "timed steps (median reported)")->capture_default_str();
  sub->add_option("--warmup", o->warmup, "untimed warm-up steps")->capture_default_str();
  sub->add_flag("--json", o->json, "print a JSON result on stdout");
  add_threads_flag(sub, &o->threads);
  return {sub, [o]() -> int {
            apply_threads(o->threads);
            ModelConfig cfg = o->model.resolve();
            if (o->seq_len > cfg.max_seq_len) {
              nlohmann::json j = cfg.to_json();
              j["max_seq_len"] = o->seq_len;
              cfg = ModelConfig::from_json(j, "bench config");
            }
            Model model(cfg);
            model.init(1);
            AdamW opt(model.registry(), AdamWConfig{});
            const i64 N = o->batch * o->seq_len;
            std::vector<int32_t> in(static_cast<size_t>(N)), tg(static_cast<size_t>(N));
            Rng rng(7);
            for (i64 i = 0; i < N; ++i) {
              in[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
              tg[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
            }
            model.plan(o->batch, o->seq_len);
            std::vector<double> ms;
            for (int s = 0; s < o->warmup + o->steps; ++s) {
              Timer t;
              model.zero_grad();
              i64 n = 0;
              model.forward(in.data(), tg.data(), nullptr, o->batch, o->seq_len, &n);
              model.backward(1.0f / static_cast<float>(n));
              opt.clip(model.grads());
              opt.step(model.params(), model.grads(), 1e-3);
              if (s >= o->warmup) ms.push_back(t.ms());
              if (!o->json) fmt::print(stderr, "\rbench step {}/{}: {:.1f} ms", s + 1, o->warmup + o->steps, t.ms());
            }
            if (!o->json) fmt::print(stderr, "\n");
            std::sort(ms.begin(), ms.end());
            const double med = ms[ms.size() / 2];
            const ModelFlops f = model.flops(o->seq_len);
            const double tps = static_cast<double>(N) / (med / 1e3);
            nlohmann::json r = {{"pattern", cfg.layer_pattern()}, {"params", model.num_params()},
                                {"batch", o->batch}, {"seq_len", o->seq_len}, {"step_ms", med},
                                {"step_ms_min", ms.front()}, {"step_ms_max", ms.back()},
                                {"train_tokens_per_s", tps}, {"train_flops_per_token", f.train_per_token},
                                {"train_gflops", tps * f.train_per_token / 1e9}, {"peak_rss_mb", peak_rss_mb()},
                                {"threads", omp_get_max_threads()}, {"simd", simd_target()},
                                {"simd_available", simd_targets_available()}};
            if (o->json) print_json(r);
            else fmt::print("{}\n", r.dump(2));
            return 0;
          }};
}

}  // namespace hlm::cli
