#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "core/timer.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/distributed.h"
#include "train/metrics_log.h"
#include "train/run_folder.h"

namespace hlm {

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_signal(int) { g_interrupted.store(true); }

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = static_cast<long>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}
}  // namespace

void install_interrupt_handler() {
  g_interrupted.store(false);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  // mpirun forwards SIGUSR1 to every rank but answers SIGINT/SIGTERM with SIGKILL one second after a SIGTERM,
  // too soon to finish a step: `kill -USR1 <mpirun>` is the graceful stop of a multi-rank run.
  std::signal(SIGUSR1, on_signal);
}
bool interrupted() { return g_interrupted.load(); }

Trainer::Trainer(Model& model, TrainConfig cfg, BatchStream& train, BatchStream* val)
    : model_(model),
      cfg_(std::move(cfg)),
      train_(train),
      val_(val),
      opt_(model.registry(), cfg_.adamw),
      world_(dist::world_size()),
      writer_(dist::is_root()) {
  if (cfg_.seq_len > model.config().max_seq_len)
    fail("--seq-len {} is over the model's limit max_seq_len = {} (raise it with --set max_seq_len=N)", cfg_.seq_len,
         model.config().max_seq_len);
  if (cfg_.grad_accum < 1) fail("--grad-accum must be >= 1, got {}", cfg_.grad_accum);
  model_.set_check_numerics(cfg_.check_numerics);
  model_.set_recompute(cfg_.recompute);
  if (val_) {
    val_batches_.resize(static_cast<size_t>(cfg_.eval_batches));
    for (auto& b : val_batches_) val_->next(b);
  }
}

void Trainer::resume(const std::string& ckpt_dir) {
  load_model_params(ckpt_dir, model_);
  load_optimizer(ckpt_dir, opt_);
  nlohmann::json st = load_trainer_state(ckpt_dir);
  start_step_ = st.at("step").get<long>();
  tokens_seen_ = st.value("tokens", 0.0);
  first_val_loss_ = st["first_val_loss"].is_number() ? st["first_val_loss"].get<double>() : -1.0;
  train_.set_state(st.at("train_loader"));
  // Rows a stopped process logged after this checkpoint belong to steps about to run again.
  if (!cfg_.out_dir.empty() && writer_) keep_metrics_through(run_folder::metrics(cfg_.out_dir).string(), start_step_);
}

nlohmann::json Trainer::trainer_state(long step) const {
  nlohmann::json st = run_info_;
  st["step"] = step;
  st["tokens"] = tokens_seen_;
  if (std::isfinite(first_val_loss_)) st["first_val_loss"] = first_val_loss_;
  st["train_loader"] = train_.state();
  st["optimizer"] = {{"type", "adamw"}, {"step", opt_.steps()}, {"lr", cfg_.adamw.lr}, {"beta1", cfg_.adamw.beta1},
                     {"beta2", cfg_.adamw.beta2}, {"eps", cfg_.adamw.eps},
                     {"weight_decay", cfg_.adamw.weight_decay}, {"grad_clip", cfg_.adamw.grad_clip}};
  st["schedule"] = {{"kind", cfg_.schedule.kind}, {"lr", cfg_.schedule.lr}, {"warmup", cfg_.schedule.warmup},
                    {"decay_fraction", cfg_.schedule.decay_fraction}, {"total_steps", cfg_.steps}};
  st["seed"] = cfg_.seed;
  return st;
}

void Trainer::log_metrics(const nlohmann::json& row) {
  if (cfg_.out_dir.empty() || !writer_) return;  // under MPI rank 0 alone writes
  append_file(run_folder::metrics(cfg_.out_dir).string(), row.dump() + "\n");
}

std::string Trainer::kept_state_note() const {
  if (cfg_.out_dir.empty()) return " (no --out folder: nothing was saved)";
  const auto ckpts = run_folder::list_checkpoints(cfg_.out_dir);
  if (ckpts.empty())
    return fmt::format("; no checkpoint of this run exists yet ({}), so nothing is kept to resume from",
                       cfg_.ckpt_every > 0 ? fmt::format("the first was due at step {}", cfg_.ckpt_every)
                                           : std::string("--ckpt-every 0 saves only at the end"));
  return fmt::format("; the last good checkpoint, step {} ({}), is kept", ckpts.back().first,
                     ckpts.back().second.string());
}

double Trainer::evaluate() {
  if (val_batches_.empty()) return NAN;
  // Every rank holds the same validation batches and scores every world_-th one; the sums are then
  // added over ranks, so the value does not depend on the number of ranks (up to summation order).
  double sum_count[2] = {0, 0};
  for (size_t i = static_cast<size_t>(dist::rank()); i < val_batches_.size(); i += static_cast<size_t>(world_)) {
    Batch& b = val_batches_[i];
    i64 n = 0;
    sum_count[0] += model_.forward(b.inputs.data(), b.targets.data(),
                                   b.doc_start.empty() ? nullptr : b.doc_start.data(), b.B, b.T, &n);
    sum_count[1] += static_cast<double>(n);
  }
  dist::allreduce_sum(sum_count, 2);
  return sum_count[1] > 0 ? sum_count[0] / sum_count[1] : NAN;
}

void Trainer::accumulate_micro_batch(size_t m) {
  if (micro_count_ == 1) return;
  // Each micro-batch's gradient is computed from zero and then added, (g0 + g1) + g2 ..., rather than
  // accumulated inside backward: so one process with 2 micro-batches adds exactly what 2 ranks'
  // all-reduce adds, and their runs agree bit for bit (tests/mpi/).
  float* g = model_.grads();
  const i64 n = model_.param_floats();
  if (m == 0) {
    grad_acc_.assign(g, g + n);
    return;
  }
  float* acc = grad_acc_.data();
#pragma omp parallel for schedule(static)
  for (i64 i = 0; i < n; ++i) acc[i] += g[i];
  if (m + 1 == micro_count_) std::copy(acc, acc + n, g);
}

double Trainer::sync_gradients() {
  if (world_ == 1) return 0;
  Timer t;
  dist::allreduce_sum(model_.grads(), model_.param_floats(), cfg_.allreduce_bucket_floats);
  return t.seconds();
}

TrainResult Trainer::run() {
  const ops::PrecisionScope precision(cfg_.precision);  // validation runs in it too, as it would at inference
  TrainResult r;
  const ModelFlops mf = model_.flops(cfg_.seq_len);
  const double tokens_per_step = static_cast<double>(cfg_.batch * cfg_.seq_len * cfg_.grad_accum) * world_;
  const bool quiet = cfg_.quiet || !writer_;
  const bool tty = isatty(fileno(stderr)) && !quiet;
  if (!cfg_.out_dir.empty() && writer_) std::filesystem::create_directories(cfg_.out_dir);
  model_.plan(cfg_.batch, cfg_.seq_len);
  if (world_ > 1) {
    // Every rank starts from rank 0's weights and moments (a fresh init or a resumed checkpoint).
    dist::broadcast(model_.params(), model_.param_floats() * static_cast<i64>(sizeof(float)));
    dist::broadcast(opt_.m().data(), static_cast<i64>(opt_.m().size() * sizeof(float)));
    dist::broadcast(opt_.v().data(), static_cast<i64>(opt_.v().size() * sizeof(float)));
  }

  auto eval_row = [&](long step) {
    double vl = evaluate();
    nlohmann::json row = {{"step", step}, {"val_loss", vl}, {"tokens", tokens_seen_},
                          {"flops", tokens_seen_ * mf.train_per_token}, {"params", model_.num_params()},
                          {"matmul_params", mf.matmul_params}};
    if (eval_hook_) row.update(eval_hook_(model_, step));
    log_metrics(row);
    return vl;
  };

  if (start_step_ == 0 || first_val_loss_ < 0) {
    first_val_loss_ = eval_row(start_step_);
  }
  r.first_val_loss = first_val_loss_;
  r.final_val_loss = first_val_loss_;
  double last_eval_step = start_step_;

  std::vector<Batch> micro(static_cast<size_t>(cfg_.grad_accum));
  micro_count_ = micro.size();
  Timer total;
  double step_time_sum = 0, allreduce_sum_s = 0;
  long timed_steps = 0;
  long step = start_step_;
  for (; step < cfg_.steps; ++step) {
    Timer st;
    model_.zero_grad();
    double count = 0;  // targets of the global batch (all ranks): the loss is their mean
    for (auto& b : micro) {
      train_.next(b);
      for (int32_t t : b.targets) count += t >= 0;
    }
    dist::allreduce_sum(&count, 1);
    if (count == 0) fail("training batch at step {} has no targets", step + 1);
    double loss_sum = 0;
    for (size_t m = 0; m < micro.size(); ++m) {
      const Batch& b = micro[m];
      if (m > 0) model_.zero_grad();
      loss_sum += model_.forward_backward(b.inputs.data(), b.targets.data(),
                                          b.doc_start.empty() ? nullptr : b.doc_start.data(), b.B, b.T,
                                          1.0f / static_cast<float>(count));
      accumulate_micro_batch(m);
    }
    const double allreduce_s = sync_gradients();
    dist::allreduce_sum(&loss_sum, 1);
    const double loss = loss_sum / count;
    const double gnorm = opt_.clip(model_.grads());
    if (!std::isfinite(loss) || !std::isfinite(gnorm)) {
      if (tty) std::fputc('\n', stderr);
      fail("non-finite {} at step {} (loss {}, grad norm {}); stopped without saving this state{}",
           std::isfinite(loss) ? "gradient" : "loss", step + 1, loss, gnorm, kept_state_note());
    }
    const double lr = lr_at(cfg_.schedule, step, cfg_.steps);
    opt_.step(model_.params(), model_.grads(), lr);
    tokens_seen_ += tokens_per_step;
    r.losses.push_back(loss);
    r.final_train_loss = loss;
    const double dt = st.seconds();
    if (step > start_step_ || cfg_.steps - start_step_ == 1) {  // the first step warms caches up
      step_time_sum += dt;
      allreduce_sum_s += allreduce_s;
      ++timed_steps;
    }
    const double sps = timed_steps ? step_time_sum / timed_steps : dt;
    const double tps = tokens_per_step / sps;
    const long done = step + 1;
    if (!quiet && (tty || done % cfg_.log_every == 0 || done == cfg_.steps)) {
      std::string line = fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | gnorm {:.2f} | {:.0f} tok/s | ETA {}",
                                     done, cfg_.steps, loss, lr, gnorm, tps,
                                     fmt_duration(sps * static_cast<double>(cfg_.steps - done)));
      if (tty) fmt::print(stderr, "\r\033[K{}", line);
      else fmt::print(stderr, "{}\n", line);
    }
    nlohmann::json row = {{"step", done}, {"loss", loss}, {"lr", lr}, {"grad_norm", gnorm},
                          {"tokens", tokens_seen_}, {"tokens_per_s", tps}, {"step_ms", dt * 1e3},
                          {"flops", tokens_seen_ * mf.train_per_token}, {"elapsed_s", total.seconds()}};
    if (world_ > 1) row["allreduce_ms"] = allreduce_s * 1e3;
    log_metrics(row);

    const bool last = done == cfg_.steps;
    const bool stop = dist::any(interrupted());  // a Ctrl-C on any rank stops all of them after this step
    if ((cfg_.eval_every > 0 && done % cfg_.eval_every == 0) || last) {
      r.final_val_loss = eval_row(done);
      last_eval_step = done;
      if (tty) fmt::print(stderr, "\r\033[Kstep {}/{} | val loss {:.4f}\n", done, cfg_.steps, r.final_val_loss);
      else if (!quiet) fmt::print(stderr, "step {}/{} | val loss {:.4f}\n", done, cfg_.steps, r.final_val_loss);
    }
    if (!cfg_.out_dir.empty() && (last || stop || (cfg_.ckpt_every > 0 && done % cfg_.ckpt_every == 0))) {
      check_replicas_identical(model_.params(), model_.param_floats(), done);
      if (writer_) {
        r.checkpoint = save_checkpoint(cfg_.out_dir, done, model_, &opt_, trainer_state(done));
        prune_checkpoints(cfg_.out_dir, cfg_.keep_checkpoints);
      }
      dist::barrier();  // the checkpoint exists once any rank returns
    }
    if (stop) {
      if (tty) std::fputc('\n', stderr);
      if (writer_) fmt::print(stderr, "interrupted at step {}: {}\n", done,
                 r.checkpoint.empty() ? "no --out folder, nothing saved" : "saved " + r.checkpoint);
      r.interrupted = true;
      ++step;
      break;
    }
  }
  if (tty && !r.interrupted) std::fputc('\n', stderr);
  (void)last_eval_step;
  r.steps = step;
  r.tokens = tokens_seen_;
  r.step_ms = timed_steps ? 1e3 * step_time_sum / timed_steps : 0;
  r.train_tokens_per_s = r.step_ms > 0 ? tokens_per_step / (r.step_ms / 1e3) : 0;
  r.allreduce_ms = timed_steps ? 1e3 * allreduce_sum_s / timed_steps : 0;
  r.train_gflops = r.train_tokens_per_s * mf.train_per_token / 1e9;
  if (r.checkpoint.empty() && !cfg_.out_dir.empty()) {
    // Nothing ran (e.g. resume at the end): point at the latest checkpoint.
    r.checkpoint = resolve_checkpoint(cfg_.out_dir);
  }
  return r;
}

}  // namespace hlm
