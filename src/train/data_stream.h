#pragma once
// Adapts the data layer's BatchLoader (token shards) to the trainer's BatchStream.
#include <memory>

#include "data/loader.h"
#include "train/trainer.h"

namespace hlm {

class ShardBatchStream final : public BatchStream {
 public:
  ShardBatchStream(std::shared_ptr<const data::TokenShard> shard, const data::LoaderOptions& opt)
      : loader_(std::move(shard), opt) {}
  void next(Batch& b) override;
  nlohmann::json state() const override { return loader_.state().to_json(); }
  void set_state(const nlohmann::json& s) override { loader_.restore(data::LoaderState::from_json(s)); }
  data::BatchLoader& loader() { return loader_; }

 private:
  data::BatchLoader loader_;
  data::Batch tmp_;
};

}  // namespace hlm
