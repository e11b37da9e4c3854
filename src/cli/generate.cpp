// hybridlm generate: decode from a trained checkpoint with per-layer caches.
#include <algorithm>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/file_io.h"
#include "data/tokenizer.h"
#include "infer/generator.h"

namespace hlm::cli {

Command register_generate(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "generate text from a checkpoint");
  struct Opts {
    std::string ckpt, prompt, prompt_file, tokenizer;
    GenerateConfig g;
    bool json = false;
    int threads = 0;
    double max_memory = 0;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--ckpt", o->ckpt, "run folder or checkpoint folder")->required();
  auto* po = sub->add_option("--prompt", o->prompt, "prompt text");
  sub->add_option("--prompt-file", o->prompt_file, "read the prompt from a file")->excludes(po);
  sub->add_option("--max-tokens", o->g.max_new_tokens, "tokens to generate")->capture_default_str()
      ->check(in_range(0, 1 << 30));
  sub->add_option("--temperature", o->g.sampler.temperature, "0 = greedy")->capture_default_str()
      ->check(in_range(0, 1e6));
  sub->add_option("--top-k", o->g.sampler.top_k, "keep the k most likely tokens (0 = off)")->capture_default_str()
      ->check(in_range(0, 1 << 30));
  sub->add_option("--top-p", o->g.sampler.top_p, "nucleus sampling mass (1 = off)")->capture_default_str()
      ->check(in_range(0, 1));
  sub->add_option("--seed", o->g.sampler.seed, "sampling seed")->capture_default_str()
      ->check(seed_range());
  sub->add_option("--prefill-chunk", o->g.prefill_chunk, "prompt tokens per prefill piece (memory is sized for one piece; 0 = whole prompt)")->capture_default_str()
      ->check(in_range(0, 1 << 30));
  sub->add_option("--decode-threads", o->g.decode_threads,
                  "OpenMP threads while decoding (0 = --threads); one token is memory-bound GEMVs")
      ->capture_default_str()
      ->check(in_range(0, 4096));
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer spec (default: the run's)");
  sub->add_flag("--json", o->json, "print a JSON result on stdout");
  add_threads_flag(sub, &o->threads);
  add_max_memory_flag(sub, &o->max_memory);
  return {sub, [o]() -> int {
            apply_threads(o->threads);
            LoadedModel lm = load_model(o->ckpt, o->max_memory);
            std::string spec = o->tokenizer.empty() ? lm.run.value("tokenizer", std::string()) : o->tokenizer;
            if (spec.empty()) fail("{}: no tokenizer recorded in run.json; pass --tokenizer", lm.ckpt_dir);
            auto tok = tokenizer_for(lm, spec);
            std::string text = o->prompt;
            if (!o->prompt_file.empty()) {
              text = read_text_file(o->prompt_file, "--prompt-file", std::size_t{64} << 20);
            }
            std::vector<int32_t> prompt = tok->encode(text);
            if (prompt.empty()) fail("generate: give a non-empty --prompt or --prompt-file");
            if (tok->adds_bos()) prompt.insert(prompt.begin(), tok->bos_id());  // as the model was trained
            MemoryUse mem;  // the caches for the whole context and the activations of one prefill piece
            const i64 piece = static_cast<i64>(prompt.size());
            mem.batch = 1;
            mem.seq_len = o->g.prefill_chunk > 0 ? std::min<i64>(o->g.prefill_chunk, piece) : piece;
            mem.decode_rows = 1;
            mem.decode_context = piece + o->g.max_new_tokens;
            check_memory(fmt::format("generate ({} prompt tokens)", piece), lm.model->config(), mem, o->max_memory);
            GenerateConfig g = o->g;
            g.stop_token = tok->eos_id();
            GenerateStats stats;
            auto out = generate(*lm.model, prompt, g, &stats, [&](int32_t t) {
              if (!o->json) {
                std::fputs(tok->decode({t}).c_str(), stdout);
                std::fflush(stdout);
              }
            });
            if (o->json) {
              print_json({{"text", tok->decode(out)}, {"tokens", out}, {"prompt_tokens", stats.prompt_tokens},
                          {"new_tokens", stats.new_tokens}, {"prefill_s", stats.prefill_s},
                          {"prefill_tokens_per_s", stats.prompt_tokens / std::max(1e-9, stats.prefill_s)},
                          {"decode_s", stats.decode_s},
                          {"decode_tokens_per_s", stats.new_tokens / std::max(1e-9, stats.decode_s)},
                          {"state_mb", stats.state_bytes / 1048576.0}, {"peak_rss_mb", peak_rss_mb()}});
            } else {
              std::fputc('\n', stdout);
              fmt::print(stderr, "prefill {} tokens in {:.2f}s, decoded {} in {:.2f}s ({:.1f} tok/s), state {:.1f} MB\n",
                         stats.prompt_tokens, stats.prefill_s, stats.new_tokens, stats.decode_s,
                         stats.new_tokens / std::max(1e-9, stats.decode_s), stats.state_bytes / 1048576.0);
            }
            return 0;
          }};
}

}  // namespace hlm::cli
