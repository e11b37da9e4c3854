// hybridlm bench: training-step speed (forward + backward + AdamW) of a config on random tokens. Under
// mpirun each rank trains its own --batch rows and the gradients are summed over ranks as in `train`
// (docs/distributed.md): tokens/s is then the whole job's, and the all-reduce time is reported.
// With --ckpt, inference speed instead: prefill of --prompt-tokens random tokens, then --decode-tokens greedy
// decode steps at that depth, the shape llama-bench times (pp N, tg M @ depth N; bench/compare_llama.sh).
#include <omp.h>

#include <algorithm>
#include <memory>

#include "cli/commands.h"
#include "infer/generator.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/machine.h"
#include "core/rng.h"
#include "core/simd_target.h"
#include "core/timer.h"
#include "ops/bf16_pairs.h"
#include "ops/precision.h"
#include "train/distributed.h"
#include "train/optimizer.h"

namespace hlm::cli {

namespace {

struct InferenceTimes {
  double prefill_s = 0, decode_s = 0;
};

// One prefill of `prompt` (in pieces, as generate) and `decode_tokens` greedy steps after it, timed apart.
InferenceTimes time_inference(Model& model, const std::vector<int32_t>& prompt, i64 decode_tokens,
                              const GenerateConfig& g) {
  const i64 P = static_cast<i64>(prompt.size());
  std::vector<float> logits(static_cast<size_t>(model.config().vocab_size));
  DecodeState st = model.new_decode_state(1, P + decode_tokens);
  InferenceTimes t;
  Timer prefill;
  const i64 chunk = g.prefill_chunk > 0 ? g.prefill_chunk : P;
  for (i64 b = 0; b < P; b += chunk) model.prefill(prompt.data() + b, 1, std::min(chunk, P - b), st, logits.data());
  t.prefill_s = prefill.seconds();
  const int threads = omp_get_max_threads();
  if (g.decode_threads > 0) omp_set_num_threads(g.decode_threads);
  Timer decode;
  for (i64 i = 0; i < decode_tokens; ++i) {
    const auto tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    model.decode_step(&tok, st, logits.data());
  }
  t.decode_s = decode.seconds();
  omp_set_num_threads(threads);
  return t;
}

template <class Opts>
int bench_inference(const Opts& o) {
  apply_threads(o.threads);
  LoadedModel lm = load_model(o.ckpt, o.max_memory);
  Model& model = *lm.model;
  const ModelConfig& cfg = model.config();
  MemoryUse mem;  // as generate: the caches for the whole context and the activations of one prefill piece
  mem.batch = 1;
  mem.seq_len = o.gen.prefill_chunk > 0 ? std::min(o.gen.prefill_chunk, o.prompt_tokens) : o.prompt_tokens;
  mem.decode_rows = 1;
  mem.decode_context = o.prompt_tokens + o.decode_tokens;
  check_memory(fmt::format("bench ({} prompt tokens)", o.prompt_tokens), cfg, mem, o.max_memory);
  const ops::Precision prec = ops::parse_precision(o.precision, "--precision");
  const ops::PrecisionScope precision(prec);
  // Random tokens, as llama-bench's: speed does not depend on the text.
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_tokens));
  Rng rng(7);
  for (auto& t : prompt) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
  std::vector<double> prefill_tps, decode_tps;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const InferenceTimes t = time_inference(model, prompt, o.decode_tokens, o.gen);
    if (s < o.warmup) continue;
    prefill_tps.push_back(static_cast<double>(o.prompt_tokens) / std::max(1e-9, t.prefill_s));
    if (o.decode_tokens > 0) decode_tps.push_back(static_cast<double>(o.decode_tokens) / std::max(1e-9, t.decode_s));
    if (!o.json) fmt::print(stderr, "\rbench run {}/{}: prefill {:.2f}s, decode {:.2f}s", s + 1 - o.warmup, o.steps,
                            t.prefill_s, t.decode_s);
  }
  if (!o.json) fmt::print(stderr, "\n");
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  nlohmann::json r = {{"checkpoint", lm.ckpt_dir}, {"pattern", cfg.layer_pattern()}, {"params", model.num_params()},
                      {"prompt_tokens", o.prompt_tokens}, {"decode_tokens", o.decode_tokens},
                      {"prefill_chunk", o.gen.prefill_chunk}, {"runs", o.steps},
                      {"prefill_tokens_per_s", median(prefill_tps)}, {"prefill_tokens_per_s_all", prefill_tps},
                      {"decode_tokens_per_s", median(decode_tps)}, {"decode_tokens_per_s_all", decode_tps},
                      {"peak_rss_mb", peak_rss_mb()}, {"precision", o.precision},
                      {"threads", omp_get_max_threads()},
                      {"decode_threads", o.gen.decode_threads > 0 ? o.gen.decode_threads : omp_get_max_threads()},
                      {"simd", simd_target()}, {"cpu", cpu_model_name()}};
  if (o.json) print_json(r);
  else fmt::print("{}\n", r.dump(2));
  return 0;
}

}  // namespace

Command register_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "measure training tokens/s and model GFLOP/s of a config "
                                          "(with --ckpt: prefill and decode tokens/s of a checkpoint)");
  struct Opts {
    ModelFlags model;
    i64 batch = 8, seq_len = 1024;
    int steps = 5, warmup = 2, threads = 0;
    double max_memory = 0;
    bool json = false, recompute = false;
    std::string precision = "fp32";
    double bucket_mb = 0;
    std::string ckpt;
    i64 prompt_tokens = 512, decode_tokens = 64;
    GenerateConfig gen;
  };
  auto o = std::make_shared<Opts>();
  o->model.add(sub);
  sub->add_option("--ckpt", o->ckpt, "inference mode: time prefill and decode of this run or checkpoint folder");
  sub->add_option("--prompt-tokens", o->prompt_tokens, "inference: random prompt tokens to prefill")
      ->capture_default_str()
      ->check(in_range(1, 1 << 30));
  sub->add_option("--decode-tokens", o->decode_tokens, "inference: greedy decode steps after the prompt (0 = none)")
      ->capture_default_str()
      ->check(in_range(0, 1 << 30));
  sub->add_option("--prefill-chunk", o->gen.prefill_chunk, "inference: prompt tokens per prefill piece, as generate")
      ->capture_default_str()
      ->check(in_range(0, 1 << 30));
  sub->add_option("--decode-threads", o->gen.decode_threads, "inference: OpenMP threads while decoding, as generate")
      ->capture_default_str()
      ->check(in_range(0, 4096));
  sub->add_option("--batch", o->batch, "rows per step (per rank under MPI)")->capture_default_str()
      ->check(in_range(1, 1 << 30));
  sub->add_option("--allreduce-bucket-mb", o->bucket_mb, "MPI: gradient all-reduce bucket in MiB (0 = one call)")
      ->capture_default_str()
      ->check(at_least(0));
  sub->add_option("--seq-len", o->seq_len, "tokens per row")->capture_default_str()
      ->check(in_range(1, 1 << 30));
  sub->add_option("--steps", o->steps, "timed steps (median reported)")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  sub->add_option("--warmup", o->warmup, "untimed warm-up steps")->capture_default_str()
      ->check(in_range(0, 1 << 20));
  sub->add_flag("--json", o->json, "print a JSON result on stdout");
  sub->add_flag("--recompute", o->recompute, "activation recomputation per block (as train --recompute)");
  add_threads_flag(sub, &o->threads);
  add_precision_flag(sub, &o->precision);
  add_max_memory_flag(sub, &o->max_memory);
  return {sub, [o]() -> int {
            if (!o->ckpt.empty()) {
              if (o->model.given())
                fail("bench: --ckpt takes the model from the checkpoint; drop --preset, --config and --set");
              if (dist::world_size() > 1) fail("bench --ckpt: inference runs on one rank (no mpirun)");
              return bench_inference(*o);
            }
            const int world = dist::world_size();
            apply_threads(o->threads == 0 && world > 1 ? dist::default_threads() : o->threads);
            ModelConfig cfg = o->model.resolve();
            if (o->seq_len > cfg.max_seq_len) {
              nlohmann::json j = cfg.to_json();
              j["max_seq_len"] = o->seq_len;
              cfg = ModelConfig::from_json(j, "bench config");
            }
            MemoryUse mem;
            mem.training = true;
            mem.batch = o->batch;
            mem.seq_len = o->seq_len;
            mem.recompute = o->recompute;
            const ops::Precision prec = ops::parse_precision(o->precision, "--precision");
            mem.bf16 = prec == ops::Precision::bf16;
            check_memory("bench", cfg, mem, o->max_memory);
            const ops::PrecisionScope precision(prec);
            Model model(cfg);
            model.init(1);
            model.set_recompute(o->recompute);
            AdamW opt(model.registry(), AdamWConfig{});
            const i64 N = o->batch * o->seq_len;
            std::vector<int32_t> in(static_cast<size_t>(N)), tg(static_cast<size_t>(N));
            Rng rng(7 + static_cast<std::uint64_t>(dist::rank()));
            for (i64 i = 0; i < N; ++i) {
              in[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
              tg[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
            }
            model.plan(o->batch, o->seq_len);
            std::vector<double> ms, comm_ms;
            const i64 bucket = static_cast<i64>(o->bucket_mb * (1 << 20) / sizeof(float));
            for (int s = 0; s < o->warmup + o->steps; ++s) {
              Timer t;
              model.zero_grad();
              // Every target counts (all are drawn from the vocabulary): the loss is the mean over N x world.
              model.forward_backward(in.data(), tg.data(), nullptr, o->batch, o->seq_len,
                                     1.0f / static_cast<float>(N * world));
              dist::barrier();  // time the all-reduce itself, not the wait for a slower rank
              Timer comm;
              dist::allreduce_sum(model.grads(), model.param_floats(), bucket);
              const double c = comm.ms();
              opt.clip(model.grads());
              opt.step(model.params(), model.grads(), 1e-3);
              if (s >= o->warmup) ms.push_back(t.ms()), comm_ms.push_back(c);
              if (!o->json && dist::is_root()) fmt::print(stderr, "\rbench step {}/{}: {:.1f} ms", s + 1, o->warmup + o->steps, t.ms());
            }
            if (!o->json && dist::is_root()) fmt::print(stderr, "\n");
            std::sort(ms.begin(), ms.end());
            std::sort(comm_ms.begin(), comm_ms.end());
            const double med = ms[ms.size() / 2];
            const ModelFlops f = model.flops(o->seq_len);
            const double tps = static_cast<double>(N) * world / (med / 1e3);
            nlohmann::json r = {{"pattern", cfg.layer_pattern()}, {"params", model.num_params()},
                                {"batch", o->batch}, {"seq_len", o->seq_len}, {"step_ms", med},
                                {"step_ms_min", ms.front()}, {"step_ms_max", ms.back()},
                                {"train_tokens_per_s", tps}, {"train_flops_per_token", f.train_per_token},
                                {"train_gflops", tps * f.train_per_token / 1e9}, {"peak_rss_mb", peak_rss_mb()},
                                {"recompute", o->recompute}, {"precision", o->precision}, {"arena_mb", model.arena_bytes() / 1048576.0},
                                {"arena_used_mb", model.arena_high_water() / 1048576.0},
                                {"threads", omp_get_max_threads()}, {"mpi", dist::backend()},
                                {"ranks", world}, {"allreduce_ms", comm_ms[comm_ms.size() / 2]},
                                {"gradient_mb", model.param_floats() * 4.0 / (1 << 20)},
                                {"simd", simd_target()}, {"simd_available", simd_targets_available()},
                                // bf16 attention and scan products (AVX512_BF16) ran, not only the bf16 matmuls
                                {"bf16_kernels", ops::bf16_pairs::active()},
                                // ... and on AMX tiles (ops/bf16_amx.cpp; HLM_AMX=0 turns them off)
                                {"bf16_amx", ops::bf16_pairs::active() && ops::bf16_pairs::amx_active()},
                                {"cpu", cpu_model_name()}};
            if (!dist::is_root()) return 0;
            if (o->json) print_json(r);
            else fmt::print("{}\n", r.dump(2));
            return 0;
          }};
}

}  // namespace hlm::cli
