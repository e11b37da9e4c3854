#include "train/trainer.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "core/timer.h"
#include "train/checkpoint.h"

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
}
bool interrupted() { return g_interrupted.load(); }

Trainer::Trainer(Model& model, TrainConfig cfg, BatchStream& train, BatchStream* val)
    : model_(model), cfg_(std::move(cfg)), train_(train), val_(val), opt_(model.registry(), cfg_.adamw) {
  if (cfg_.seq_len > model.config().max_seq_len)
    fail("--seq-len {} is over the model's limit max_seq_len = {} (raise it with --set max_seq_len=N)", cfg_.seq_len,
         model.config().max_seq_len);
  if (cfg_.grad_accum < 1) fail("--grad-accum must be >= 1, got {}", cfg_.grad_accum);
  model_.set_check_numerics(cfg_.check_numerics);
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
  if (cfg_.out_dir.empty()) return;
  append_file((std::filesystem::path(cfg_.out_dir) / "metrics.jsonl").string(), row.dump() + "\n");
}

double Trainer::evaluate() {
  if (val_batches_.empty()) return NAN;
  double sum = 0;
  i64 count = 0;
  for (auto& b : val_batches_) {
    i64 n = 0;
    sum += model_.forward(b.inputs.data(), b.targets.data(), b.doc_start.empty() ? nullptr : b.doc_start.data(), b.B,
                          b.T, &n);
    count += n;
  }
  return count ? sum / static_cast<double>(count) : NAN;
}

TrainResult Trainer::run() {
  TrainResult r;
  const ModelFlops mf = model_.flops(cfg_.seq_len);
  const double tokens_per_step = static_cast<double>(cfg_.batch * cfg_.seq_len * cfg_.grad_accum);
  const bool tty = isatty(fileno(stderr)) && !cfg_.quiet;
  if (!cfg_.out_dir.empty()) std::filesystem::create_directories(cfg_.out_dir);
  model_.plan(cfg_.batch, cfg_.seq_len);

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
  Timer total;
  double step_time_sum = 0;
  long timed_steps = 0;
  long step = start_step_;
  for (; step < cfg_.steps; ++step) {
    Timer st;
    model_.zero_grad();
    i64 count = 0;
    for (auto& b : micro) {
      train_.next(b);
      for (int32_t t : b.targets) count += t >= 0;
    }
    if (count == 0) fail("training batch at step {} has no targets", step + 1);
    double loss_sum = 0;
    for (auto& b : micro) {
      loss_sum += model_.forward(b.inputs.data(), b.targets.data(), b.doc_start.empty() ? nullptr : b.doc_start.data(),
                                 b.B, b.T);
      model_.backward(1.0f / static_cast<float>(count));
    }
    const double loss = loss_sum / static_cast<double>(count);
    const double gnorm = opt_.clip(model_.grads());
    if (!std::isfinite(loss) || !std::isfinite(gnorm)) {
      if (tty) std::fputc('\n', stderr);
      fail("non-finite {} at step {} (loss {}, grad norm {}); stopped without saving this state{}",
           std::isfinite(loss) ? "gradient" : "loss", step + 1, loss, gnorm,
           cfg_.out_dir.empty() ? "" : "; the last good checkpoint in " + cfg_.out_dir + " is kept");
    }
    const double lr = lr_at(cfg_.schedule, step, cfg_.steps);
    opt_.step(model_.params(), model_.grads(), lr);
    tokens_seen_ += tokens_per_step;
    r.losses.push_back(loss);
    r.final_train_loss = loss;
    const double dt = st.seconds();
    if (step > start_step_ || cfg_.steps - start_step_ == 1) {  // the first step warms caches up
      step_time_sum += dt;
      ++timed_steps;
    }
    const double sps = timed_steps ? step_time_sum / timed_steps : dt;
    const double tps = tokens_per_step / sps;
    const long done = step + 1;
    if (!cfg_.quiet && (tty || done % cfg_.log_every == 0 || done == cfg_.steps)) {
      std::string line = fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | gnorm {:.2f} | {:.0f} tok/s | ETA {}",
                                     done, cfg_.steps, loss, lr, gnorm, tps,
                                     fmt_duration(sps * static_cast<double>(cfg_.steps - done)));
      if (tty) fmt::print(stderr, "\r\033[K{}", line);
      else fmt::print(stderr, "{}\n", line);
    }
    nlohmann::json row = {{"step", done}, {"loss", loss}, {"lr", lr}, {"grad_norm", gnorm},
                          {"tokens", tokens_seen_}, {"tokens_per_s", tps}, {"step_ms", dt * 1e3},
                          {"flops", tokens_seen_ * mf.train_per_token}, {"elapsed_s", total.seconds()}};
    log_metrics(row);

    const bool last = done == cfg_.steps;
    const bool stop = interrupted();
    if ((cfg_.eval_every > 0 && done % cfg_.eval_every == 0) || last) {
      r.final_val_loss = eval_row(done);
      last_eval_step = done;
      if (tty) fmt::print(stderr, "\r\033[Kstep {}/{} | val loss {:.4f}\n", done, cfg_.steps, r.final_val_loss);
      else if (!cfg_.quiet) fmt::print(stderr, "step {}/{} | val loss {:.4f}\n", done, cfg_.steps, r.final_val_loss);
    }
    if (!cfg_.out_dir.empty() && (last || stop || (cfg_.ckpt_every > 0 && done % cfg_.ckpt_every == 0))) {
      r.checkpoint = save_checkpoint(cfg_.out_dir, done, model_, &opt_, trainer_state(done));
      prune_checkpoints(cfg_.out_dir, cfg_.keep_checkpoints);
    }
    if (stop) {
      if (tty) std::fputc('\n', stderr);
      fmt::print(stderr, "interrupted at step {}: {}\n", done,
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
  r.train_gflops = r.train_tokens_per_s * mf.train_per_token / 1e9;
  if (r.checkpoint.empty() && !cfg_.out_dir.empty()) {
    // Nothing ran (e.g. resume at the end): point at the latest checkpoint.
    r.checkpoint = resolve_checkpoint(cfg_.out_dir);
  }
  return r;
}

}  // namespace hlm
