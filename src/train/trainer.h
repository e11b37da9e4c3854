#pragma once
// The training loop: gradient accumulation, clipping, AdamW, LR schedule, a live progress line,
// periodic validation, metrics JSONL, atomic checkpoints, exact resume, NaN stop, Ctrl-C save.
// Data-parallel over the ranks of train/distributed.h (docs/distributed.md): each rank's BatchStream
// yields its own rows of every global batch, gradients, token counts and losses are summed over ranks,
// rank 0 alone writes metrics and checkpoints, and a stop (Ctrl-C, end) is agreed by all ranks.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "ops/precision.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace hlm {

struct Batch {
  i64 B = 0, T = 0;
  std::vector<int32_t> inputs, targets, doc_start;  // [B*T]; doc_start empty = one document per row
};

// A deterministic stream of batches whose position can be saved and restored (exact resume).
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  virtual void next(Batch& b) = 0;
  virtual nlohmann::json state() const = 0;
  virtual void set_state(const nlohmann::json& s) = 0;
};

struct TrainConfig {
  long steps = 200;
  i64 batch = 8, seq_len = 256;  // batch: rows per micro-batch on each rank
  int grad_accum = 1;
  i64 allreduce_bucket_floats = 0;  // gradient all-reduce bucket (0 = the whole buffer at once)
  AdamWConfig adamw;
  ScheduleConfig schedule;
  long eval_every = 50;      // 0 = only at the start and the end
  int eval_batches = 8;      // validation batches (fixed, the same every evaluation)
  long ckpt_every = 0;       // 0 = only at the end (and on Ctrl-C)
  int keep_checkpoints = 3;  // newest N kept (0 = all)
  long log_every = 10;
  std::uint64_t seed = 1234;
  bool check_numerics = false;
  bool recompute = false;    // activation recomputation per block (less memory, one more forward)
  ops::Precision precision = ops::Precision::fp32;  // matmul precision while this trainer runs (ops/precision.h)
  bool quiet = false;        // no progress line
  std::string out_dir;       // "" = no checkpoints/metrics files
};

struct TrainResult {
  long steps = 0;            // optimizer steps completed in total (including before a resume)
  double tokens = 0;         // training tokens seen in total
  double first_val_loss = 0, final_val_loss = 0, final_train_loss = 0;
  double train_tokens_per_s = 0, train_gflops = 0, step_ms = 0;
  double allreduce_ms = 0;   // mean time per step in the gradient all-reduce (0 on one rank)
  std::string checkpoint;    // folder of the last checkpoint written
  bool interrupted = false;
  std::vector<double> losses;  // training loss of each step run in this call
};

// Hook for extra evaluations at eval steps (e.g. LongPPL); returns fields added to the metrics row.
using EvalHook = std::function<nlohmann::json(Model&, long step)>;

class Trainer {
 public:
  Trainer(Model& model, TrainConfig cfg, BatchStream& train, BatchStream* val);
  // Restores model, optimizer, data position and step from a checkpoint folder.
  void resume(const std::string& ckpt_dir);
  TrainResult run();
  void set_eval_hook(EvalHook h) { eval_hook_ = std::move(h); }
  // Mean validation loss over the fixed validation batches (shared round-robin among the ranks).
  double evaluate();
  // Extra JSON saved in trainer_state.json (e.g. data and tokenizer specs).
  void set_run_info(nlohmann::json info) { run_info_ = std::move(info); }

 private:
  nlohmann::json trainer_state(long step) const;
  // What a stop on a non-finite value leaves behind to resume from, for its message.
  std::string kept_state_note() const;
  void log_metrics(const nlohmann::json& row);
  // Sums the gradients over the ranks; returns the seconds it took.
  double sync_gradients();
  // With grad_accum > 1: adds micro-batch m's gradient (computed from zero) to the step's sum.
  void accumulate_micro_batch(size_t m);

  Model& model_;
  TrainConfig cfg_;
  BatchStream& train_;
  BatchStream* val_;
  AdamW opt_;
  long start_step_ = 0;
  double tokens_seen_ = 0;
  double first_val_loss_ = -1;
  EvalHook eval_hook_;
  nlohmann::json run_info_ = nlohmann::json::object();
  std::vector<Batch> val_batches_;
  aligned_vector<float> grad_acc_;  // the step's gradient sum while micro-batches run (grad_accum > 1)
  size_t micro_count_ = 1;
  int world_ = 1;
  bool writer_ = true;  // rank 0: writes metrics, checkpoints and the progress line
};

// Ctrl-C handling: the first SIGINT/SIGTERM/SIGUSR1 sets a flag the loop checks after each step.
void install_interrupt_handler();
bool interrupted();

}  // namespace hlm
