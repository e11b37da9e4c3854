// hybridlm logits: the logits of one token sequence as a safetensors file, for comparing a checkpoint with
// another framework's forward on the same tokens (tools/hf_check, tools/released_check). With --losses, the loss
// of each next token instead (T - 1 values rather than T x V, for perplexities over long texts and large vocabularies).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/safetensors.h"

namespace hlm::cli {

Command register_logits(CLI::App& app) {
  auto* sub = app.add_subcommand("logits", "write the logits of a token sequence (safetensors: tokens, logits [T, V])");
  struct Opts {
    std::string ckpt, tokens, tokens_file, out;
    int threads = 0;
    i64 last = 0;
    bool losses = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--ckpt", o->ckpt, "run folder or checkpoint folder")->required();
  auto* t = sub->add_option("--tokens", o->tokens, "token ids separated by spaces");
  sub->add_option("--tokens-file", o->tokens_file, "read the token ids from a file")->excludes(t);
  sub->add_option("--out", o->out, "output .safetensors file")->required();
  sub->add_option("--last", o->last, "write the logits of the last N positions only (0 = all)")
      ->check(in_range(0, 1 << 30));
  sub->add_flag("--losses", o->losses,
                "write 'losses' [T - 1]: -log p(token t+1 | tokens 0..t), computed in double, instead of the logits");
  add_threads_flag(sub, &o->threads);
  return {sub, [o]() -> int {
            apply_threads(o->threads);
            std::string text = o->tokens;
            const std::string source = o->tokens_file.empty() ? "--tokens" : o->tokens_file;
            if (!o->tokens_file.empty()) {
              text = read_text_file(o->tokens_file, "--tokens-file");
            }
            LoadedModel lm = load_model(o->ckpt);
            const i64 V = lm.model->config().vocab_size;
            std::vector<int32_t> ids;
            std::istringstream in(text);
            std::string word;
            while (in >> word) {
              size_t used = 0;
              long v = -1;
              try {
                v = std::stol(word, &used);
              } catch (const std::exception&) {
                used = 0;
              }
              if (used != word.size() || v < 0 || v >= V)
                fail("{}: '{}' is not a token id in [0, {})", source, word, V);
              ids.push_back(static_cast<int32_t>(v));
            }
            if (ids.empty()) fail("{}: no token ids", source);
            const i64 T = static_cast<i64>(ids.size());
            MemoryUse mem;  // one forward over the tokens, the T x V logits and the file's copy of them
            mem.batch = 1;
            mem.seq_len = T;
            mem.extra_bytes = 8.0 * static_cast<double>(T) * static_cast<double>(V);
            check_memory(fmt::format("logits ({} tokens x vocab {})", T, V), lm.model->config(), mem, 0);
            std::vector<float> logits(static_cast<size_t>(T * V));
            lm.model->forward_logits(ids.data(), nullptr, 1, T, logits.data());
            SafeTensorsWriter w;
            w.add_i32("tokens", {T}, ids.data());
            std::vector<float> losses;
            if (o->losses) {
              if (T < 2) fail("{}: --losses needs at least 2 tokens", source);
              losses.resize(static_cast<size_t>(T - 1));
              for (i64 t = 0; t + 1 < T; ++t) {
                const float* row = logits.data() + t * V;
                double mx = row[0], sum = 0;
                for (i64 v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
                for (i64 v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
                losses[static_cast<size_t>(t)] = static_cast<float>(mx + std::log(sum) - row[ids[static_cast<size_t>(t + 1)]]);
              }
              w.add_f32("losses", {T - 1}, losses.data());
            } else {
              const i64 keep = o->last > 0 ? std::min(o->last, T) : T;
              w.add_f32("logits", {keep, V}, logits.data() + (T - keep) * V);
            }
            w.write(o->out);
            return 0;
          }};
}

}  // namespace hlm::cli
