#pragma once
// `hybridlm recall`'s learning-rate x seed policy as library code: every (model, lr, seed) is trained from
// scratch on MQAR (eval/recall.h); per model the learning rate whose final accuracy, averaged over the seeds,
// is highest is reported (zoology reports MQAR as the best over a learning-rate sweep), and a learning rate
// with a diverged seed (non-finite loss) is out.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/recall.h"
#include "model/config.h"

namespace hlm::study {

struct RecallTrial {
  double lr = 0;
  std::uint64_t seed = 0;
  double accuracy = 0;
  bool diverged = false;
};

struct BestLr {
  bool found = false;  // false: every learning rate had a diverged seed
  double lr = 0, accuracy = 0;
};

// The policy above, over one model's trials. Ties keep the learning rate seen first.
BestLr best_learning_rate(const std::vector<RecallTrial>& trials);

// What a sweep reports while it runs: a trial starting (point == nullptr, result == nullptr), a curve point,
// or a trial's end (result set; error non-empty when it diverged).
struct RecallEvent {
  const std::string& label;  // "SG", or "SG lr 0.003 seed 2" when the sweep has several lrs or seeds
  const Model* model = nullptr;
  const RecallPoint* point = nullptr;
  const RecallResult* result = nullptr;
  const std::string* error = nullptr;
};

// Trains every (model, lr, seed) with `base` (its lr replaced); returns {"runs": [...], "best": [...]} as
// `hybridlm recall --json` prints them. Each run: the result's JSON, pattern, lr, seed, model config, and
// "error" when it diverged; each best: pattern, lr, accuracy (null and "error" when every lr diverged).
nlohmann::json run_recall_sweep(const std::vector<ModelConfig>& models, const std::vector<double>& lrs,
                                const std::vector<std::uint64_t>& seeds, const RecallOptions& base,
                                const std::function<void(const RecallEvent&)>& on_event = {});

}  // namespace hlm::study
