#include "eval/recall.h"

#include <algorithm>

#include "core/error.h"
#include "core/timer.h"
#include "train/trainer.h"

namespace hlm {

namespace {

class MqarStream final : public BatchStream {
 public:
  MqarStream(const data::MqarConfig& c, std::uint64_t seed, i64 B) : gen_(c, seed), B_(B) {}
  void next(Batch& b) override {
    gen_.next(B_, tmp_);
    b.B = tmp_.B;
    b.T = tmp_.T;
    b.inputs = tmp_.inputs;
    b.targets = tmp_.targets;
    b.doc_start.clear();
  }
  nlohmann::json state() const override { return {{"position", gen_.position()}}; }
  void set_state(const nlohmann::json& s) override { gen_.set_position(s.at("position").get<std::uint64_t>()); }

 private:
  data::MqarGenerator gen_;
  i64 B_;
  data::MqarBatch tmp_;
};

}  // namespace

nlohmann::json RecallResult::to_json() const {
  nlohmann::json c = nlohmann::json::array();
  for (const auto& p : curve)
    c.push_back({{"step", p.step}, {"accuracy", p.accuracy}, {"seconds", p.seconds}});
  return {{"accuracy", accuracy}, {"seconds", seconds}, {"curve", c}};
}

nlohmann::json recall_model_json(const std::string& pattern, const data::MqarConfig& task) {
  return {{"d_model", 64},
          {"n_layers", static_cast<i64>(pattern.size())},
          {"n_heads", 2},
          {"n_kv_heads", 2},
          {"head_dim", 32},
          {"d_ff", 128},
          {"vocab_size", task.vocab_size},
          {"max_seq_len", task.seq_len},
          {"pattern", pattern},
          {"window", 4},
          {"chunk_size", 32},
          {"mamba_d_state", 32},
          {"init_scale", 3.0},
          {"layer_types", {{"S", {{"rope", true}}}}}};
}

double recall_accuracy(Model& model, const data::MqarConfig& task, std::uint64_t seed, i64 rows) {
  const i64 V = model.config().vocab_size;
  HLM_CHECK(V >= task.vocab_size, "recall: the model's vocab_size {} is smaller than the task's {}", V,
            task.vocab_size);
  data::MqarGenerator gen(task, seed);
  data::MqarBatch b;
  std::vector<float> logits;
  double hits = 0;
  i64 queries = 0;
  for (i64 done = 0; done < rows;) {
    const i64 B = std::min<i64>(64, rows - done);
    gen.next(B, b);
    logits.resize(static_cast<size_t>(B * b.T * V));
    model.forward_logits(b.inputs.data(), nullptr, B, b.T, logits.data());
    const i64 n = std::count_if(b.targets.begin(), b.targets.end(), [](int32_t t) { return t >= 0; });
    hits += data::mqar_accuracy(logits.data(), b.targets.data(), B * b.T, V) * static_cast<double>(n);
    queries += n;
    done += B;
  }
  return queries ? hits / static_cast<double>(queries) : 0.0;
}

RecallResult train_recall(Model& model, const RecallOptions& opt,
                          const std::function<void(const RecallPoint&)>& on_point) {
  HLM_CHECK(opt.steps >= 1 && opt.batch >= 1 && opt.eval_rows >= 1,
            "recall: steps, batch and eval rows must be >= 1 (got {}, {}, {})", opt.steps, opt.batch, opt.eval_rows);
  HLM_CHECK(model.config().max_seq_len >= opt.task.seq_len,
            "recall: the model's max_seq_len {} is shorter than the task's seq_len {}", model.config().max_seq_len,
            opt.task.seq_len);
  MqarStream train(opt.task, opt.data_seed, opt.batch);
  TrainConfig tc;
  tc.steps = opt.steps;
  tc.batch = opt.batch;
  tc.seq_len = opt.task.seq_len;
  tc.schedule.kind = "constant";
  tc.schedule.lr = opt.lr;
  tc.schedule.warmup = opt.warmup;
  tc.adamw.weight_decay = opt.weight_decay;
  tc.eval_every = opt.eval_every;  // 0: the trainer still evaluates at the start and the end
  tc.quiet = true;
  RecallResult r;
  Timer clock;
  double scoring = 0;  // seconds spent scoring, kept out of the training time
  // No validation stream: the trainer's evaluation points only run the hook, which scores recall.
  Trainer tr(model, tc, train, nullptr);
  tr.set_eval_hook([&](Model& m, long step) {
    Timer t;
    RecallPoint p;
    p.step = step;
    p.accuracy = recall_accuracy(m, opt.task, opt.eval_seed, opt.eval_rows);
    scoring += t.seconds();
    p.seconds = clock.seconds() - scoring;
    r.curve.push_back(p);
    if (on_point) on_point(p);
    return nlohmann::json{{"recall_accuracy", p.accuracy}};
  });
  tr.run();
  r.seconds = clock.seconds() - scoring;
  r.accuracy = r.curve.back().accuracy;  // the trainer always evaluates after the last step
  return r;
}

}  // namespace hlm
