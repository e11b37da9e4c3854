#include "data/loader.h"

#include "core/error.h"
#include "core/rng.h"
#include "data/corpus.h"

namespace hlm::data {

namespace {

const char* mode_name(SampleMode m) { return m == SampleMode::kRandom ? "random" : "sequential"; }

template <typename T>
T get_field(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) fail("loader state: missing field \"{}\"", key);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    fail("loader state: field \"{}\" has the wrong type: {}", key, e.what());
  }
}

}  // namespace

nlohmann::json LoaderState::to_json() const {
  return {{"version", 1},           {"mode", mode_name(mode)}, {"seed", seed},
          {"epoch", epoch},         {"cursor", cursor},        {"seq_len", seq_len},
          {"windows_per_epoch", windows_per_epoch}};
}

LoaderState LoaderState::from_json(const nlohmann::json& j) {
  LoaderState s;
  int version = get_field<int>(j, "version");
  if (version != 1) fail("loader state: unsupported version {} (field version)", version);
  std::string mode = get_field<std::string>(j, "mode");
  if (mode == "random")
    s.mode = SampleMode::kRandom;
  else if (mode == "sequential")
    s.mode = SampleMode::kSequential;
  else
    fail("loader state: unknown mode \"{}\" (field mode; expected random or sequential)", mode);
  s.seed = get_field<std::uint64_t>(j, "seed");
  s.epoch = get_field<std::uint64_t>(j, "epoch");
  s.cursor = get_field<std::uint64_t>(j, "cursor");
  s.seq_len = get_field<std::int64_t>(j, "seq_len");
  s.windows_per_epoch = get_field<std::int64_t>(j, "windows_per_epoch");
  return s;
}

BatchLoader::BatchLoader(std::shared_ptr<const TokenShard> shard, const LoaderOptions& opt)
    : shard_(std::move(shard)), opt_(opt) {
  HLM_CHECK(shard_, "BatchLoader: null shard");
  HLM_CHECK(opt.batch > 0 && opt.seq_len > 0, "BatchLoader: batch {} and seq_len {} must be positive", opt.batch,
            opt.seq_len);
  HLM_CHECK(opt.world_size > 0 && opt.rank >= 0 && opt.rank < opt.world_size,
            "BatchLoader: rank {} outside [0, world_size {})", opt.rank, opt.world_size);
  const std::int64_t n = shard_->n_tokens(), T = opt.seq_len;
  if (n < T + 1)
    fail("BatchLoader: shard {} holds {} tokens, fewer than seq_len + 1 = {}; use a shorter sequence or more data",
         shard_->path(), n, T + 1);
  if (opt.mode == SampleMode::kRandom) {
    // Stride-T windows that still fit after any offset in [0, T); tiny shards fall back to offset 0.
    n_windows_ = (n - T) / T;
    random_offset_ = n_windows_ > 0;
    if (!random_offset_) n_windows_ = (n - 1) / T;
  } else {
    n_windows_ = (n - 1) / T;
  }
  HLM_CHECK(n_windows_ < (std::int64_t{1} << 32), "BatchLoader: {} windows in {} exceed the 2^32 limit",
            n_windows_, shard_->path());
  state_.mode = opt.mode;
  state_.seed = opt.seed;
  state_.seq_len = T;
  state_.windows_per_epoch = n_windows_;
}

void BatchLoader::reset() {
  state_.epoch = 0;
  state_.cursor = 0;
}

void BatchLoader::restore(const LoaderState& s) {
  if (s.mode != opt_.mode)
    fail("loader state: mode {} but this loader is {} (field mode)", mode_name(s.mode), mode_name(opt_.mode));
  if (s.seq_len != opt_.seq_len)
    fail("loader state: seq_len {} but this loader has seq_len {} (field seq_len)", s.seq_len, opt_.seq_len);
  if (s.windows_per_epoch != n_windows_)
    fail("loader state: windows_per_epoch {} but {} gives {} (field windows_per_epoch); the data changed",
         s.windows_per_epoch, shard_->path(), n_windows_);
  if (s.cursor > static_cast<std::uint64_t>(n_windows_) + std::uint64_t(opt_.batch) * opt_.world_size)
    fail("loader state: cursor {} beyond the {} windows of an epoch (field cursor)", s.cursor, n_windows_);
  state_ = s;
  opt_.seed = s.seed;
  cache_[0] = cache_[1] = EpochOrder{};
}

const BatchLoader::EpochOrder& BatchLoader::order_for(std::uint64_t epoch) {
  EpochOrder& slot = cache_[epoch & 1];
  if (slot.epoch == epoch) return slot;
  // The order of an epoch depends only on (seed, epoch): that is what makes {seed, epoch, cursor} a
  // complete resume state.
  std::uint64_t key[2] = {state_.seed, epoch};
  Rng rng(hash64(std::string_view(reinterpret_cast<const char*>(key), sizeof key), 0x10adeULL));
  slot.epoch = epoch;
  slot.offset = random_offset_ ? static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(opt_.seq_len))) : 0;
  slot.perm.resize(static_cast<size_t>(n_windows_));
  for (std::int64_t i = 0; i < n_windows_; ++i) slot.perm[i] = static_cast<std::uint32_t>(i);
  for (std::int64_t i = n_windows_ - 1; i > 0; --i) {
    std::int64_t j = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(i + 1)));
    std::swap(slot.perm[i], slot.perm[j]);
  }
  return slot;
}

void BatchLoader::fill_row(std::int64_t start, int row, Batch& out) const {
  const int T = opt_.seq_len;
  std::int32_t* in = out.inputs.data() + static_cast<size_t>(row) * T;
  std::int32_t* tg = out.targets.data() + static_cast<size_t>(row) * T;
  std::int32_t* ds = out.doc_start.data() + static_cast<size_t>(row) * T;
  shard_->read(start, T, in);
  shard_->read(start + 1, T, tg);
  const std::int32_t eos = shard_->eos_id();
  std::int32_t doc = 0;
  for (int t = 0; t < T; ++t) {
    ds[t] = doc;
    if (in[t] == eos) doc = t + 1;  // <eos> closes its document; the next one starts after it
  }
}

bool BatchLoader::next(Batch& out) {
  const int B = opt_.batch, T = opt_.seq_len;
  const std::uint64_t N = static_cast<std::uint64_t>(n_windows_);
  const std::uint64_t global = std::uint64_t(B) * opt_.world_size;
  if (opt_.mode == SampleMode::kSequential && state_.cursor >= N) return false;
  out.B = B;
  out.T = T;
  out.rows = 0;
  const size_t n = static_cast<size_t>(B) * T;
  out.inputs.assign(n, 0);
  out.targets.assign(n, -1);
  out.doc_start.assign(n, 0);
  for (int b = 0; b < B; ++b) {
    std::uint64_t g = state_.cursor + std::uint64_t(opt_.rank) * B + b;
    if (opt_.mode == SampleMode::kSequential) {
      if (g >= N) {
        // Padding row: a valid token id in, ignored targets out.
        std::fill_n(out.inputs.data() + size_t(b) * T, T, shard_->eos_id());
        continue;
      }
      fill_row(static_cast<std::int64_t>(g) * T, b, out);
    } else {
      // A global step may run past the end of the epoch into the next one.
      std::uint64_t epoch = state_.epoch + g / N;
      const EpochOrder& ord = order_for(epoch);
      fill_row(ord.offset + static_cast<std::int64_t>(ord.perm[g % N]) * T, b, out);
    }
    ++out.rows;
  }
  state_.cursor += global;
  if (opt_.mode == SampleMode::kRandom) {
    state_.epoch += state_.cursor / N;
    state_.cursor %= N;
  }
  return true;
}

}  // namespace hlm::data
