// hybridlm train: a model from a preset/config on a corpus, with periodic validation, checkpoints and
// exact resume. With --json, ends by printing one JSON object with the run's summary.
#include <omp.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "data/dataset.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/data_stream.h"
#include "train/distributed.h"
#include "train/run_lock.h"
#include "train/run_protocol.h"
#include "train/trainer.h"
#include "train/niah_mix.h"
#include "data/tokenizer.h"
#include "eval/longppl.h"
#include "data/niah_task.h"
#include "eval/niah.h"
#include "train/run_folder.h"

namespace hlm::cli {

namespace fs = std::filesystem;

namespace {

// More optimizer steps than any run of this engine finishes (a billion steps at a millisecond each is 12 days):
// a larger --steps is a typo, and would train until killed.
constexpr double kMaxSteps = 1e9;

struct TrainOpts {
  ModelFlags model;
  std::string data = "default", tokenizer, out;
  bool resume = false, overwrite = false, json = false, check_numerics = false, quiet = false, recompute = false;
  TrainConfig t;
  int threads = 0, niah_digits = 7;
  double mix_niah = 0, max_memory = 0;
  double bucket_mb = 0;  // MPI all-reduce bucket (MiB)
  std::string mix_haystack = "corpus";
  std::string precision = "fp32";
  std::vector<std::string> evals;
};

// A data spec as run.json stores it: paths absolute, so eval and --resume work from any folder.
std::string portable_spec(const std::string& spec) {
  std::error_code ec;
  if (spec == "default" || !fs::exists(spec, ec)) return spec;
  return fs::absolute(spec).lexically_normal().string();
}

// --resume: the run keeps its data, tokenizer and training settings (run.json). A flag given with a different
// value is refused rather than silently ignored; --steps defaults to the run's total.
void apply_run_settings(const CLI::App& sub, const nlohmann::json& run, TrainConfig& t, TrainOpts& o,
                        std::string& data_spec, std::string& tok_spec, int& digits) {
  auto keep = [&](const nlohmann::json& from, const char* flag, const char* key, auto& value) {
    using V = std::decay_t<decltype(value)>;
    if (!from.contains(key)) return;
    V have;
    try {
      have = from[key].get<V>();
    } catch (const nlohmann::json::exception&) {
      fail("{}/run.json: field '{}' has the wrong type ({})", o.out, key, from[key].dump());
    }
    if (sub.count(flag) > 0 && !(have == value))
      fail("{} {} conflicts with the run's {} = {}: --resume continues with the run's settings (drop the flag, or "
           "start a new run with --overwrite or another --out)", flag, value, key, have);
    value = have;
  };
  if (sub.count("--data") > 0) data_spec = portable_spec(data_spec);
  keep(run, "--data", "data", data_spec);
  keep(run, "--tokenizer", "tokenizer", tok_spec);
  if (!run.contains("train")) return;
  const auto& rt = run["train"];
  if (sub.count("--steps") == 0) t.steps = rt.value("steps", t.steps);
  keep(rt, "--batch", "batch", t.batch);
  keep(rt, "--seq-len", "seq_len", t.seq_len);
  keep(rt, "--grad-accum", "grad_accum", t.grad_accum);
  keep(rt, "--seed", "seed", t.seed);
  keep(rt, "--lr", "lr", t.schedule.lr);
  t.adamw.lr = t.schedule.lr;
  keep(rt, "--schedule", "schedule", t.schedule.kind);
  keep(rt, "--warmup", "warmup", t.schedule.warmup);
  keep(rt, "--decay-fraction", "decay_fraction", t.schedule.decay_fraction);
  keep(rt, "--weight-decay", "weight_decay", t.adamw.weight_decay);
  keep(rt, "--grad-clip", "grad_clip", t.adamw.grad_clip);
  keep(rt, "--mix-niah", "mix_niah", o.mix_niah);
  keep(rt, "--mix-haystack", "mix_haystack", o.mix_haystack);
  if (!rt.contains("niah_digits")) digits = 7;  // runs from before the flag used 7
  keep(rt, "--niah-digits", "niah_digits", digits);
  // The thread count decides how reductions are split, so the run's count gives the bits an uninterrupted run
  // gives; a machine with fewer cores takes its own (oversubscribed threads would crawl) and says so.
  if (sub.count("--threads") == 0 && rt.contains("threads") && rt["threads"].is_number_integer()) {
    const int run_threads = rt["threads"].get<int>();
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    if (run_threads >= 1 && run_threads <= cores) {
      o.threads = run_threads;
    } else if (!o.quiet) {
      fmt::print(stderr, "note: the run trained on {} threads, this machine has {} cores: continuing on {}, so the "
                 "last bits of the curve may differ from an uninterrupted run's\n", run_threads, cores, cores);
    }
  }
  // The precision is how the run computes, not what it is: a resume may change it (a machine without bf16).
  if (sub.count("--precision") == 0 && rt.contains("precision") && rt["precision"].is_string()) {
    o.precision = rt["precision"].get<std::string>();
    const std::string field = o.out + "/run.json: field 'train.precision'";
    t.precision = ops::parse_precision(o.precision, field);
    ops::require_supported(t.precision, field + " = bf16");
  }
}

// Flags of what is trained: the model, the data and the optimization.
void add_training_flags(CLI::App* sub, TrainOpts& o) {
  o.model.add(sub);
  sub->add_option("--data", o.data, "'default' (built-in corpus), a text file/folder, or a prepared dataset folder")
      ->capture_default_str();
  sub->add_option("--tokenizer", o.tokenizer, "byte | bpe:N | path/to.model | path/to/tokenizer.json (default bpe:4096)");
  sub->add_option("--steps", o.t.steps, "optimizer steps (total, also when resuming; at most 1e9)")
      ->capture_default_str()
      ->check(in_range(1, kMaxSteps));
  sub->add_option("--seq-len", o.t.seq_len, "tokens per row")->capture_default_str()
      ->check(in_range(2, 1 << 30));
  sub->add_option("--batch", o.t.batch, "rows per micro-batch (per rank under MPI)")->capture_default_str()
      ->check(in_range(1, 1 << 30));
  sub->add_option("--grad-accum", o.t.grad_accum, "micro-batches per optimizer step")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  sub->add_option("--lr", o.t.schedule.lr, "peak learning rate")->capture_default_str()
      ->check(in_range(0, 1e30));
  sub->add_option("--schedule", o.t.schedule.kind, "wsd | cosine | constant")->capture_default_str()
      ->check(CLI::IsMember({"wsd", "cosine", "constant"}));
  sub->add_option("--warmup", o.t.schedule.warmup, "warmup steps (default: min(100, steps/10))")
      ->check(at_least(0));
  sub->add_option("--decay-fraction", o.t.schedule.decay_fraction, "WSD: fraction of steps in the decay")
      ->capture_default_str()
      ->check(in_range(0, 1));
  sub->add_option("--weight-decay", o.t.adamw.weight_decay, "AdamW weight decay")->capture_default_str()
      ->check(at_least(0));
  sub->add_option("--grad-clip", o.t.adamw.grad_clip, "global gradient-norm clip (0 = off)")->capture_default_str()
      ->check(at_least(0));
}

// Flags of the run around it: evaluations, checkpoints, the run folder, NIAH mixing, resume, threads, MPI, memory.
void add_run_flags(CLI::App* sub, TrainOpts& o) {
  sub->add_option("--eval-every", o.t.eval_every, "validate every N steps (and at the start and end)")
      ->capture_default_str()
      ->check(at_least(0));
  sub->add_option("--eval-batches", o.t.eval_batches, "validation batches")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  sub->add_option("--ckpt-every", o.t.ckpt_every, "checkpoint every N steps (0 = at the end only)")
      ->capture_default_str()
      ->check(at_least(0));
  sub->add_option("--keep-checkpoints", o.t.keep_checkpoints, "newest checkpoints kept (0 = all)")
      ->capture_default_str()
      ->check(in_range(0, 1 << 30));
  sub->add_option("--log-every", o.t.log_every, "progress line every N steps when not a terminal")
      ->capture_default_str()
      ->check(at_least(1));
  sub->add_option("--seed", o.t.seed, "seed for init and data order")->capture_default_str()
      ->check(seed_range());
  sub->add_option("--out", o.out, "run folder: checkpoints, config.json, run.json, metrics.jsonl");
  sub->add_option("--mix-niah", o.mix_niah, "fraction of training rows replaced by NIAH sequences (0..1)")
      ->capture_default_str()
      ->check(in_range(0, 1));
  sub->add_option("--mix-haystack", o.mix_haystack, "haystack of mixed-in NIAH rows: corpus | noise")
      ->capture_default_str();
  add_niah_digits_flag(sub, &o.niah_digits);
  add_precision_flag(sub, &o.precision);
  sub->add_option("--eval", o.evals, "extra evaluations at each eval step: longppl, niah")->delimiter(',');
  auto* resume_flag = sub->add_flag(
      "--resume", o.resume,
      "continue the run in --out from its latest checkpoint, with the run's model, data, tokenizer and training "
      "settings (a different value of one of those flags is refused; --steps may grow the run)");
  sub->add_flag("--overwrite", o.overwrite, "replace the run in --out (its checkpoints, metrics and run.json)")
      ->excludes(resume_flag);
  sub->add_flag("--json", o.json, "print a JSON summary on stdout");
  sub->add_flag("--check-numerics", o.check_numerics, "stop at the first non-finite tensor and name it");
  sub->add_flag("--recompute", o.recompute,
                "recompute each block's activations in backward: memory of one block instead of all, ~1/3 more "
                "compute, bitwise the same result");
  sub->add_flag("--quiet", o.quiet, "no progress line");
  add_threads_flag(sub, &o.threads);
  sub->add_option("--allreduce-bucket-mb", o.bucket_mb,
                  "MPI: gradient all-reduce bucket in MiB (0 = the whole gradient in one call)")
      ->capture_default_str()
      ->check(at_least(0));
  add_max_memory_flag(sub, &o.max_memory);
}

// The TrainConfig of the flags, checked.
TrainConfig train_config(const TrainOpts& o) {
  TrainConfig t = o.t;
  if (o.bucket_mb < 0) fail("--allreduce-bucket-mb must be >= 0, got {}", o.bucket_mb);
  t.allreduce_bucket_floats = static_cast<i64>(o.bucket_mb * (1 << 20) / sizeof(float));
  t.out_dir = o.out;
  t.check_numerics = o.check_numerics;
  t.recompute = o.recompute;
  t.precision = ops::parse_precision(o.precision, "--precision");
  ops::require_supported(t.precision);  // before the dataset is built
  t.quiet = o.quiet;
  t.adamw.lr = t.schedule.lr;
  if (t.schedule.warmup < 0) t.schedule.warmup = std::max(1L, std::min(100L, t.steps / 10));
  if (t.steps < 1 || t.steps > kMaxSteps) fail("--steps must be in [1, 1e9], got {}", t.steps);
  // The token and FLOP counters of metrics.jsonl are doubles: exact up to 2^53 tokens.
  const double total_tokens = static_cast<double>(t.steps) * static_cast<double>(t.batch) *
                              static_cast<double>(t.seq_len) * t.grad_accum * dist::world_size();
  if (total_tokens > 9007199254740992.0)
    fail("--steps {} x --batch {} x --seq-len {} x --grad-accum {} x {} ranks = {:.3g} training tokens, more than "
         "the run's token counter holds exactly (2^53); train fewer steps or smaller batches",
         t.steps, t.batch, t.seq_len, t.grad_accum, dist::world_size(), total_tokens);
  if (t.batch < 1) fail("--batch must be >= 1, got {}", t.batch);
  if (t.seq_len < 2) fail("--seq-len must be >= 2, got {}", t.seq_len);
  if (o.resume && o.out.empty()) fail("--resume needs --out (the run folder to continue)");
  return t;
}

// The run being started or continued: its model config, data and tokenizer specs, NIAH digits, run.json and,
// when continuing, the checkpoint to resume from.
struct RunStart {
  std::string ckpt;
  nlohmann::json run = nlohmann::json::object();
  ModelConfig cfg;
  std::string data_spec, tok_spec;
  int digits = 7;
  long done_step = 0;     // the checkpoint's step when continuing
  RunProtocol protocol;   // what the run measures and keeps (run.json "protocol")
  std::unique_ptr<RunLock> lock;
  bool clear_old_run = false;  // --overwrite: cleared only once the new run has passed every check
};

// The protocol the flags (or their defaults) describe.
RunProtocol flag_protocol(const TrainOpts& o, const TrainConfig& t, int digits) {
  RunProtocol p;
  p.eval_every = t.eval_every;
  p.eval_batches = t.eval_batches;
  p.ckpt_every = t.ckpt_every;
  p.keep_checkpoints = t.keep_checkpoints;
  p.evals = ExtraEvalSettings::for_run(o.evals, t.seq_len, digits);
  return p;
}

// The run's protocol: the flags' for a new run; run.json's when continuing, with the flags given applied
// (train/run_protocol.h says which are refused and which are recorded). A run.json written before runs kept their
// protocol takes the flags'.
RunProtocol run_protocol(const CLI::App& sub, const TrainOpts& o, const TrainConfig& t, const RunStart& r) {
  const RunProtocol flags = flag_protocol(o, t, r.digits);
  if (!o.resume || !r.run.contains("protocol")) {
    if (o.resume && !o.quiet)
      fmt::print(stderr, "note: {}/run.json records no protocol; continuing with the flags' (eval every {}, {} "
                 "batches, checkpoint every {}, keep {})\n", o.out, flags.eval_every, flags.eval_batches,
                 flags.ckpt_every, flags.keep_checkpoints);
    return flags;
  }
  const std::string source = o.out + "/run.json";
  ProtocolFlagsGiven given;
  given.eval_every = sub.count("--eval-every") > 0;
  given.eval_batches = sub.count("--eval-batches") > 0;
  given.ckpt_every = sub.count("--ckpt-every") > 0;
  given.keep_checkpoints = sub.count("--keep-checkpoints") > 0;
  given.evals = sub.count("--eval") > 0;
  return resume_protocol(RunProtocol::from_json(r.run["protocol"], source), flags, given, r.done_step, source);
}

void apply_protocol(const RunProtocol& p, TrainConfig& t) {
  t.eval_every = p.eval_every;
  t.eval_batches = p.eval_batches;
  t.ckpt_every = p.ckpt_every;
  t.keep_checkpoints = p.keep_checkpoints;
}

// One trainer per run folder, and a folder holding a run is continued (--resume, with the run's settings and,
// under another number of ranks, its global batch re-split) or replaced (--overwrite) only when asked.
RunStart start_run(const CLI::App& sub, TrainOpts& o, TrainConfig& t, int world) {
  RunStart r;
  r.data_spec = o.data, r.tok_spec = o.tokenizer;
  r.digits = niah_digits(o.niah_digits, nlohmann::json::object());  // validates the flag; 7 when unset
  if (!o.out.empty()) {
    if (dist::is_root()) r.lock = std::make_unique<RunLock>(o.out);  // the ranks are one trainer
    if (!o.resume && holds_run(o.out)) {
      if (!o.overwrite)
        fail("{}: already holds a run (checkpoints, latest or metrics.jsonl); continue it with --resume, "
             "replace it with --overwrite, or choose another --out", o.out);
      r.clear_old_run = true;
    }
  }
  if (!o.resume) {
    r.cfg = o.model.resolve();
    return r;
  }
  r.ckpt = resolve_checkpoint(o.out);
  r.cfg = load_checkpoint_config(r.ckpt);
  r.run = read_run_config(o.out);
  if (o.model.given())
    fail("--resume continues with the run's model config ({}/config.json); --preset/--config/--set "
         "cannot change it (use --overwrite or another --out for a new model)", o.out);
  apply_run_settings(sub, r.run, t, o, r.data_spec, r.tok_spec, r.digits);
  const long done = load_trainer_state(r.ckpt).at("step").get<long>();
  r.done_step = done;
  if (t.steps < done)
    fail("--steps {} is below the run's checkpoint step {} ({}); --steps is the total, give at least {}", t.steps,
         done, r.ckpt, done);
  if (r.run.contains("train")) {
    // The global batch is the run's; a different number of ranks re-splits it (docs/distributed.md).
    const auto& rt = r.run["train"];
    const i64 global = rt.value("global_batch", t.batch * t.grad_accum);
    const BatchSplit split = split_global_batch(global, world, t.batch);
    if (split.batch != t.batch || split.grad_accum != t.grad_accum) {
      if (!o.quiet)
        fmt::print(stderr, "note: global batch {} on {} ranks: --batch {} --grad-accum {} (was {} x {})\n", global,
                   world, split.batch, split.grad_accum, t.batch, t.grad_accum);
      t.batch = split.batch;
      t.grad_accum = split.grad_accum;
    }
  }
  return r;
}

// The dataset (rank 0 tokenizes into the shared cache first; the other ranks then find it ready), with the
// model's vocabulary matched to the tokenizer's for a new run and the sequence length checked against the model.
data::Dataset prepare_training_data(const TrainOpts& o, const TrainConfig& t, RunStart& r, const MemoryUse& mem) {
  check_memory("training", r.cfg, mem, o.max_memory);  // before the dataset is built
  data::PrepareOptions popt;
  popt.quiet = o.quiet;
  data::Dataset ds;
  if (dist::is_root()) ds = data::prepare_dataset(r.data_spec, r.tok_spec, "", popt);
  dist::barrier();
  if (!dist::is_root()) ds = data::prepare_dataset(r.data_spec, r.tok_spec, "", popt);
  if (!o.resume && r.cfg.vocab_size != ds.vocab_size) {
    if (!o.quiet)
      fmt::print(stderr, "note: vocab_size {} -> {} to match the tokenizer ({})\n", r.cfg.vocab_size, ds.vocab_size,
                 ds.tokenizer_spec);
    nlohmann::json j = r.cfg.to_json();
    j["vocab_size"] = ds.vocab_size;
    r.cfg = ModelConfig::from_json(j, "config");
  }
  if (r.cfg.vocab_size < ds.vocab_size)
    fail("model vocab_size {} is smaller than the tokenizer's {} ({})", r.cfg.vocab_size, ds.vocab_size,
         ds.tokenizer_spec);
  if (t.seq_len > r.cfg.max_seq_len)
    fail("--seq-len {} is over the model's limit max_seq_len = {} (raise it with --set max_seq_len=N)", t.seq_len,
         r.cfg.max_seq_len);
  check_memory("training", r.cfg, mem, o.max_memory);  // with the tokenizer's vocabulary
  return ds;
}

// Rank 0 writes the run folder: config.json and run.json (data, tokenizer, training settings).
void write_run_folder(const TrainOpts& o, const TrainConfig& t, RunStart& r, const data::Dataset& ds, int world) {
  if (o.out.empty() || !dist::is_root()) return;
  if (r.clear_old_run) clear_run(o.out);
  fs::create_directories(o.out);
  write_file_atomic(run_folder::config(o.out).string(), r.cfg.to_json().dump(2) + "\n");
  r.run["data"] = portable_spec(r.data_spec);
  r.run["dataset_dir"] = ds.dir;
  r.run["tokenizer"] = ds.tokenizer_spec;
  r.run["train"] = {{"mix_niah", o.mix_niah}, {"mix_haystack", o.mix_haystack},
                    {"niah_digits", r.digits}, {"steps", t.steps}, {"batch", t.batch}, {"seq_len", t.seq_len},
                    {"grad_accum", t.grad_accum}, {"world_size", world},
                    {"global_batch", t.batch * t.grad_accum * world}, {"lr", t.schedule.lr}, {"schedule", t.schedule.kind},
                    {"warmup", t.schedule.warmup}, {"decay_fraction", t.schedule.decay_fraction},
                    {"weight_decay", t.adamw.weight_decay}, {"grad_clip", t.adamw.grad_clip},
                    {"seed", t.seed}, {"precision", ops::precision_name(t.precision)},
                    {"threads", omp_get_max_threads()}};
  r.run["protocol"] = r.protocol.to_json();
  write_file_atomic(run_folder::run_json(o.out).string(), r.run.dump(2) + "\n");
}

// --mix-niah: the training stream with that fraction of rows replaced by NIAH sequences (nullptr when 0). The
// haystack it reads is kept in `hay`.
std::unique_ptr<NiahMixStream> niah_mix_stream(const TrainOpts& o, const TrainConfig& t, int digits,
                                               ShardBatchStream& train,
                                               const std::shared_ptr<data::TokenShard>& train_shard,
                                               const data::Tokenizer& tok, std::unique_ptr<Haystack>& hay) {
  if (o.mix_niah < 0 || o.mix_niah > 1) fail("--mix-niah must be in [0, 1], got {}", o.mix_niah);
  if (o.mix_niah <= 0) return nullptr;
  NiahMixStream::check_row_length(t.seq_len, digits, tok);
  if (o.mix_haystack == "noise") hay = std::make_unique<Haystack>(tok);
  else if (o.mix_haystack == "corpus") hay = std::make_unique<Haystack>(train_shard, tok);
  else fail("--mix-haystack must be corpus or noise, got '{}'", o.mix_haystack);
  return std::make_unique<NiahMixStream>(train, tok, *hay, o.mix_niah, t.seed ^ 0x5eedULL, digits,
                                         dist::rank() * t.batch);
}

// --eval longppl,niah: extra evaluations logged with each validation row (scaling fits read them from
// metrics.jsonl), with the run's settings. Holds what the trainer's eval hook reads, so it must outlive the run.
struct ExtraEvals {
  ExtraEvalSettings settings;
  std::vector<std::vector<int32_t>> lp_docs;
  LongPplConfig lpc;
  std::unique_ptr<Haystack> noise;

  void install(Trainer& trainer, const ExtraEvalSettings& s, const TrainConfig& t, const data::TokenShard& val_shard,
               const data::Tokenizer& tok) {
    settings = s;
    if (s.niah) {  // refused before the first step rather than at the first evaluation
      const i64 shortest = niah_min_length(tok, static_cast<int>(s.niah_digits));
      for (i64 len : s.niah_lengths)
        if (len < shortest)
          fail("--eval niah: the NIAH prompts are {} tokens (--seq-len), shorter than the {} a needle of {} digits "
               "(--niah-digits) and its question take with this tokenizer; give --seq-len >= {}",
               len, shortest, s.niah_digits, shortest);
    }
    if (s.longppl) {
      lp_docs = long_documents(val_shard, t.seq_len, static_cast<int>(s.longppl_documents));
      lpc.trunc_len = s.longppl_trunc_len;
      lpc.block = s.longppl_block;
    }
    noise = std::make_unique<Haystack>(tok);
    if (!s.longppl && !s.niah) return;
    const i64 seq_len = t.seq_len, batch = t.batch;
    trainer.set_eval_hook([this, &tok, seq_len, batch](Model& m, long) {
      nlohmann::json extra = nlohmann::json::object();
      if (settings.longppl) {
        auto sc = model_scorer(m);
        auto r = run_longppl(sc, sc, lp_docs, lpc);
        extra["longppl"] = r["longppl"];
        extra["log_longppl"] = r["log_longppl"];
        extra["longppl_key_tokens"] = r["key_tokens"];
      }
      if (settings.niah) {
        NiahGridConfig nc;
        nc.lengths = settings.niah_lengths;
        nc.depths = settings.niah_depths;
        nc.samples = static_cast<int>(settings.niah_samples);
        nc.value_digits = static_cast<int>(settings.niah_digits);
        nc.progress = false;
        extra["niah_accuracy"] = run_niah_grid(m, tok, *noise, nc)["mean"];
      }
      m.plan(batch, seq_len);
      return extra;
    });
  }
};

// The training run: under MPI ranks x threads (docs/distributed.md); rank 0 alone prints and writes.
int run_train(const CLI::App& sub, TrainOpts& o) {
  const int world = dist::world_size();
  apply_threads(o.threads == 0 && world > 1 ? dist::default_threads() : o.threads);
  if (!dist::is_root()) o.quiet = true;
  TrainConfig t = train_config(o);
  RunStart r = start_run(sub, o, t, world);
  if (o.resume) apply_threads(o.threads);  // the run's own count (apply_run_settings)
  r.protocol = run_protocol(sub, o, t, r);
  apply_protocol(r.protocol, t);
  MemoryUse mem;
  mem.training = true;
  mem.batch = t.batch;
  mem.seq_len = t.seq_len;
  mem.recompute = t.recompute;
  mem.bf16 = t.precision == ops::Precision::bf16;
  check_niah_rows_before_data(o.mix_niah, t.seq_len, r.digits, r.tok_spec);
  const data::Dataset ds = prepare_training_data(o, t, r, mem);
  Model model(r.cfg);
  model.init(t.seed);
  auto train_shard = std::make_shared<data::TokenShard>(ds.train_path);
  auto val_shard = std::make_shared<data::TokenShard>(ds.val_path);
  data::LoaderOptions lo;
  lo.batch = static_cast<int>(t.batch);
  lo.seq_len = static_cast<int>(t.seq_len);
  lo.seed = t.seed;
  lo.rank = dist::rank();
  lo.world_size = world;
  ShardBatchStream train(train_shard, lo);
  data::LoaderOptions vo = lo;
  vo.mode = data::SampleMode::kSequential;
  vo.rank = 0;  // every rank holds the whole validation set; the trainer shares it out
  vo.world_size = 1;
  ShardBatchStream val(val_shard, vo);

  // From here on Ctrl-C is caught: the loop saves after the step in progress (or after the first step when
  // it comes during the rest of the setup) and exits with 130. Installed before run.json is written, so a
  // run folder with run.json always has the handler in place.
  install_interrupt_handler();
  write_run_folder(o, t, r, ds, world);
  auto tok = data::load_tokenizer(ds.tokenizer_spec);
  std::unique_ptr<Haystack> mix_hay;
  std::unique_ptr<NiahMixStream> mixed = niah_mix_stream(o, t, r.digits, train, train_shard, *tok, mix_hay);
  Trainer trainer(model, t, mixed ? static_cast<BatchStream&>(*mixed) : train, &val);
  ExtraEvals extra;
  extra.install(trainer, r.protocol.evals, t, *val_shard, *tok);
  trainer.set_run_info({{"data", portable_spec(r.data_spec)}, {"tokenizer", ds.tokenizer_spec}});
  if (o.resume) {
    trainer.resume(r.ckpt);
    if (!o.quiet) fmt::print(stderr, "resumed from {}\n", r.ckpt);
  }
  if (!o.quiet && world > 1)
    fmt::print(stderr, "data parallel: {} ranks x {} threads; global batch {} = {} ranks x {} rows x {} accum\n",
               world, omp_get_max_threads(), t.batch * t.grad_accum * world, world, t.batch, t.grad_accum);
  if (!o.quiet) {
    fmt::print(stderr, "model: {} layers [{}], d_model {}, {:.2f}M params; data: {} ({} train tokens, vocab {})\n",
               r.cfg.n_layers, r.cfg.layer_pattern(), r.cfg.d_model, model.num_params() / 1e6, ds.dir,
               train_shard->n_tokens(), ds.vocab_size);
  }
  TrainResult res = trainer.run();
  if (o.json && dist::is_root()) {
    print_json({{"steps", res.steps}, {"tokens", res.tokens}, {"first_val_loss", res.first_val_loss},
                {"final_val_loss", res.final_val_loss}, {"final_train_loss", res.final_train_loss},
                {"train_tokens_per_s", res.train_tokens_per_s}, {"train_gflops", res.train_gflops},
                {"step_ms", res.step_ms}, {"checkpoint", res.checkpoint}, {"params", model.num_params()},
                {"interrupted", res.interrupted}, {"world_size", world}, {"allreduce_ms", res.allreduce_ms}});
  }
  return res.interrupted ? 130 : 0;
}

}  // namespace

Command register_train(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "train a model (preset/config) on a corpus");
  auto o = std::make_shared<TrainOpts>();
  o->t.schedule.warmup = -1;
  add_training_flags(sub, *o);
  add_run_flags(sub, *o);
  return {sub, [o, sub]() -> int { return run_train(*sub, *o); }};
}

}  // namespace hlm::cli
