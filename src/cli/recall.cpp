// hybridlm recall: train small models on MQAR associative recall from scratch and report recall accuracy
// (a curve per model, JSON, an SVG chart).
#include <omp.h>

#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "eval/plot.h"
#include "eval/recall.h"
#include "study/recall_sweep.h"
#include "train/checkpoint.h"

namespace hlm::cli {

Command register_recall(CLI::App& app) {
  auto* sub = app.add_subcommand("recall", "train a small model on MQAR associative recall; accuracy curve");
  struct Opts {
    ModelFlags model;
    std::string pattern = "SG", out, plot;
    RecallOptions r;
    std::vector<double> lrs{3e-3};
    std::vector<std::uint64_t> seeds{1};
    int threads = 1;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  o->r.task.vocab_size = 128;
  o->r.task.seq_len = 64;
  o->r.task.num_kv_pairs = 8;
  o->r.eval_every = 100;
  auto* pattern_opt =
      sub->add_option("--pattern", o->pattern,
                      "layer letters of the built-in small model (d_model 64, one layer per letter; docs/mixers.md); "
                      "several, comma-separated (SL,SM,SG), train one model each")
          ->capture_default_str();
  o->model.add(sub);
  sub->add_option("--kv-pairs", o->r.task.num_kv_pairs, "key-value pairs per row")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  sub->add_option("--seq-len", o->r.task.seq_len, "tokens per row")->capture_default_str()
      ->check(in_range(2, 1 << 24));
  sub->add_option("--task-vocab", o->r.task.vocab_size, "task vocabulary (keys [1, V/2), values [V/2, V))")
      ->capture_default_str()
      ->check(in_range(4, 1 << 24));
  sub->add_flag("!--zero-filler", o->r.task.random_non_queries,
                "fill the query region's non-query positions with 0 instead of random tokens");
  sub->add_option("--steps", o->r.steps, "AdamW steps")->capture_default_str()
      ->check(in_range(1, 1 << 30));
  sub->add_option("--batch", o->r.batch, "rows per step")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  sub->add_option("--lr", o->lrs, "learning rate (constant after the warm-up); several, comma-separated, sweep it")
      ->delimiter(',')
      ->capture_default_str()
      ->check(in_range(1e-30, 1e30));
  sub->add_option("--warmup", o->r.warmup, "linear warm-up steps")->capture_default_str()
      ->check(in_range(0, 1 << 30));
  sub->add_option("--wd", o->r.weight_decay, "AdamW weight decay")->capture_default_str()
      ->check(in_range(0, 1e6));
  sub->add_option("--seed", o->seeds, "model init seed; several, comma-separated, train one model each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(seed_range());
  sub->add_option("--data-seed", o->r.data_seed, "training rows' seed (held-out rows use another stream)")
      ->capture_default_str()
      ->check(seed_range());
  sub->add_option("--eval-rows", o->r.eval_rows, "held-out rows scored")->capture_default_str()
      ->check(in_range(1, 1 << 24));
  sub->add_option("--eval-every", o->r.eval_every, "score every N steps (0 = start and end)")->capture_default_str()
      ->check(in_range(0, 1 << 30));
  sub->add_option("--threads", o->threads, "OpenMP threads (0 = all cores; 1 is fastest for the small model)")
      ->capture_default_str()
      ->check(in_range(0, 4096));
  sub->add_option("--out", o->out, "write the JSON result to this file");
  sub->add_option("--plot", o->plot, "accuracy curves of every run as an SVG line chart");
  sub->add_flag("--json", o->json, "print the JSON result on stdout (else one line per curve point)");
  return {sub, [o, pattern_opt]() -> int {
            apply_threads(o->threads);
            const data::MqarConfig& task = o->r.task;
            data::MqarGenerator check(task, 0);  // bad task sizes fail here, naming the field
            // One model per pattern of the built-in small model, or the one --preset / --config model.
            std::vector<nlohmann::json> models;
            if (!o->model.preset.empty() || !o->model.config_file.empty()) {
              if (pattern_opt->count() > 0)
                fail("--pattern picks the built-in small model; with --preset/--config use --set pattern=...");
              nlohmann::json mj = o->model.resolve().to_json();
              mj["vocab_size"] = task.vocab_size;
              mj["max_seq_len"] = std::max<i64>(mj["max_seq_len"].get<i64>(), task.seq_len);
              models.push_back(mj);
            } else {
              std::string rest = o->pattern;
              while (true) {
                const auto comma = rest.find(',');
                const std::string pat = rest.substr(0, comma);
                if (pat.empty()) fail("--pattern '{}': empty pattern (expected e.g. SG or SL,SM,SG)", o->pattern);
                nlohmann::json mj = recall_model_json(pat, task);
                for (const auto& s : o->model.overrides) apply_override(mj, s);
                models.push_back(mj);
                if (comma == std::string::npos) break;
                rest = rest.substr(comma + 1);
              }
            }
            const double chance = 1.0 / static_cast<double>(task.vocab_size - task.vocab_size / 2);
            nlohmann::json j = {
                {"task",
                 {{"vocab_size", task.vocab_size}, {"seq_len", task.seq_len}, {"num_kv_pairs", task.num_kv_pairs},
                  {"random_non_queries", task.random_non_queries}}},
                {"train",
                 {{"steps", o->r.steps}, {"batch", o->r.batch}, {"lrs", o->lrs}, {"warmup", o->r.warmup},
                  {"weight_decay", o->r.weight_decay}, {"seeds", o->seeds}, {"data_seed", o->r.data_seed},
                  {"eval_rows", o->r.eval_rows}, {"threads", omp_get_max_threads()}}},
                {"chance", chance},
                {"runs", nlohmann::json::array()},
                {"best", nlohmann::json::array()}};
            for (double lr : o->lrs)
              if (!(lr > 0)) fail("--lr: every learning rate must be > 0, got {}", lr);
            std::vector<ModelConfig> cfgs;  // all validated before any training starts
            for (const auto& mj : models) {
              cfgs.push_back(ModelConfig::from_json(mj, "recall model"));
              const ModelConfig& cfg = cfgs.back();
              if (cfg.vocab_size < task.vocab_size || cfg.max_seq_len < task.seq_len)
                fail("recall model: vocab_size {} / max_seq_len {} must cover --task-vocab {} / --seq-len {}",
                     cfg.vocab_size, cfg.max_seq_len, task.vocab_size, task.seq_len);
            }
            LinePlot plot;
            plot.title = fmt::format("MQAR recall: {} pairs in {} tokens, vocab {}", task.num_kv_pairs, task.seq_len,
                                     task.vocab_size);
            plot.xlabel = "training step";
            plot.ylabel = "recall accuracy";
            // Every (model, lr, seed), and per model the best lr: the policy of study/recall_sweep.h.
            const bool many = o->lrs.size() > 1 || o->seeds.size() > 1;
            const nlohmann::json swept = study::run_recall_sweep(cfgs, o->lrs, o->seeds, o->r, [&](const study::RecallEvent& e) {
              if (o->json) return;
              if (e.point) {
                fmt::print("{} step {:6d}  accuracy {:.3f}  ({:.1f} s)\n", e.label, e.point->step, e.point->accuracy,
                           e.point->seconds);
                std::fflush(stdout);
              } else if (!e.result) {
                fmt::print(stderr, "recall: {} ({} params), {} pairs in {} tokens, vocab {}, {} steps of {} rows\n",
                           e.label, e.model->num_params(), task.num_kv_pairs, task.seq_len, task.vocab_size,
                           o->r.steps, o->r.batch);
              } else if (!e.error->empty()) {
                fmt::print("{}: stopped: {}\n", e.label, *e.error);
              } else {
                fmt::print("{}: accuracy {:.3f} after {} steps ({:.1f} s training; chance {:.3f})\n", e.label,
                           e.result->accuracy, o->r.steps, e.result->seconds, chance);
              }
            });
            j["runs"] = swept["runs"];
            j["best"] = swept["best"];
            for (const auto& run : j["runs"]) {
              Series sr;
              sr.label = many ? fmt::format("{} lr {:g} seed {}", run["pattern"].get<std::string>(),
                                            run["lr"].get<double>(), run["seed"].get<std::uint64_t>())
                              : run["pattern"].get<std::string>();
              for (const auto& p : run["curve"]) {
                sr.x.push_back(p["step"].get<double>());
                sr.y.push_back(p["accuracy"].get<double>());
              }
              if (!sr.x.empty()) plot.series.push_back(sr);
            }
            if (!o->json)
              for (const auto& b : j["best"]) {
                const std::string pat = b["pattern"];
                if (b["lr"].is_null())
                  fmt::print("{}: every learning rate diverged\n", pat);
                else if (many)
                  fmt::print("{}: best lr {:g}, accuracy {:.3f} (mean over {} seed(s))\n", pat, b["lr"].get<double>(),
                             b["accuracy"].get<double>(), o->seeds.size());
              }
            if (!o->out.empty()) write_file_atomic(o->out, j.dump(2) + "\n");
            if (!o->plot.empty()) {
              Series c;
              c.label = "chance";
              c.x = {0.0, static_cast<double>(o->r.steps)};
              c.y = {chance, chance};
              plot.series.push_back(c);
              write_line_plot(plot, o->plot);
            }
            if (o->json) print_json(j);
            return 0;
          }};
}

}  // namespace hlm::cli
