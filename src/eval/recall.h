#pragma once
// Associative recall (MQAR, data/mqar.h) as a training study: train a model on the task from scratch and
// score recall on held-out rows, with an accuracy curve. Shared by `hybridlm recall` and the recall tests.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/mqar.h"
#include "model/model.h"

namespace hlm {

struct RecallOptions {
  data::MqarConfig task;  // vocabulary, length, pairs; the model's vocab_size must be >= task.vocab_size
  long steps = 400;
  i64 batch = 32;
  double lr = 3e-3;  // constant after `warmup` linear warm-up steps
  long warmup = 20;
  double weight_decay = 0.1;
  std::uint64_t data_seed = 11;   // training rows
  std::uint64_t eval_seed = 999;  // held-out rows (a different stream)
  i64 eval_rows = 256;
  long eval_every = 0;  // 0: score only at the end
};

struct RecallPoint {
  long step = 0;
  double accuracy = 0;
  double seconds = 0;  // training time so far
};

struct RecallResult {
  double accuracy = 0;  // on eval_rows held-out rows after the last step
  double seconds = 0;   // training time (without the scoring)
  std::vector<RecallPoint> curve;  // every eval_every steps and at the end
  nlohmann::json to_json() const;
};

// The small model the recall tests and `hybridlm recall` use unless told otherwise: d_model 64, 2 heads of 32,
// SwiGLU 128, SWA window 4 with RoPE, chunk 32, Mamba-2 d_state 32, init_scale 3 (tiny models leave the
// recall plateau far sooner with it); one layer per letter of `pattern`; vocabulary and length of `task`.
nlohmann::json recall_model_json(const std::string& pattern, const data::MqarConfig& task);

// Fraction of query positions answered right (argmax) on `rows` rows of the stream (task, seed).
double recall_accuracy(Model& model, const data::MqarConfig& task, std::uint64_t seed, i64 rows);

// Trains `model` (already initialised) on the task with AdamW and scores it. `on_point` sees each curve point.
RecallResult train_recall(Model& model, const RecallOptions& opt,
                          const std::function<void(const RecallPoint&)>& on_point = {});

}  // namespace hlm
