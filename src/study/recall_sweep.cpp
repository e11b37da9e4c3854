#include "study/recall_sweep.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace hlm::study {

BestLr best_learning_rate(const std::vector<RecallTrial>& trials) {
  std::vector<double> lrs;  // in order of first appearance
  for (auto& t : trials)
    if (std::find(lrs.begin(), lrs.end(), t.lr) == lrs.end()) lrs.push_back(t.lr);
  BestLr best;
  for (double lr : lrs) {
    double sum = 0;
    int n = 0;
    bool diverged = false;
    for (auto& t : trials)
      if (t.lr == lr) sum += t.accuracy, ++n, diverged |= t.diverged;
    if (diverged) continue;
    const double mean = sum / n;
    if (!best.found || mean > best.accuracy) best = {true, lr, mean};
  }
  return best;
}

nlohmann::json run_recall_sweep(const std::vector<ModelConfig>& models, const std::vector<double>& lrs,
                                const std::vector<std::uint64_t>& seeds, const RecallOptions& base,
                                const std::function<void(const RecallEvent&)>& on_event) {
  nlohmann::json out = {{"runs", nlohmann::json::array()}, {"best", nlohmann::json::array()}};
  const bool many = lrs.size() > 1 || seeds.size() > 1;
  for (const ModelConfig& cfg : models) {
    const std::string pat = cfg.layer_pattern();
    std::vector<RecallTrial> trials;
    for (double lr : lrs)
      for (std::uint64_t seed : seeds) {
        const std::string label = many ? fmt::format("{} lr {:g} seed {}", pat, lr, seed) : pat;
        Model model(cfg);
        model.init(seed);
        if (on_event) on_event({label, &model});
        RecallOptions ro = base;
        ro.lr = lr;
        RecallResult res;
        std::string error;
        try {
          res = train_recall(model, ro, [&](const RecallPoint& p) {
            if (on_event) on_event({label, &model, &p});
          });
        } catch (const Error& e) {
          error = e.what();  // a learning rate too high for the model (non-finite loss): recorded, the sweep goes on
        }
        nlohmann::json run = res.to_json();
        if (!error.empty()) run["error"] = error;
        run["pattern"] = pat;
        run["lr"] = lr;
        run["seed"] = seed;
        run["model"] = cfg.to_json();
        out["runs"].push_back(run);
        trials.push_back({lr, seed, res.accuracy, !error.empty()});
        if (on_event) on_event({label, &model, nullptr, &res, &error});
      }
    const BestLr best = best_learning_rate(trials);
    if (best.found)
      out["best"].push_back({{"pattern", pat}, {"lr", best.lr}, {"accuracy", best.accuracy}});
    else
      out["best"].push_back({{"pattern", pat}, {"lr", nullptr}, {"accuracy", nullptr}, {"error", "every learning rate diverged"}});
  }
  return out;
}

}  // namespace hlm::study
