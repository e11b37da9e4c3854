// MQAR (associative recall, src/data/mqar.*, src/eval/recall.*): the generator's format and determinism, and
// the task doing its job. Tiny 1- and 2-layer models (eval/recall.h's recall model: d_model 64, init_scale 3)
// are trained in the test on one thread: a model whose Lightning, Mamba-2 or Gated DeltaNet layer carries the
// pairs across the gap learns 8-pair recall in 5-40 s, while a purely local model (two window-4 SWA layers)
// stays at chance. Mamba-2 and GDN need a long-memory init of their decay for that, and a GDN layer below another
// layer a lower learning rate (docs/mixers.md "Recall").
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "data/mqar.h"
#include "eval/recall.h"
#include "model/config.h"
#include "model/model.h"

using namespace hlm;

namespace {

data::MqarConfig task(i64 kv_pairs = 8) {
  data::MqarConfig c;
  c.vocab_size = 128;
  c.seq_len = 64;
  c.num_kv_pairs = kv_pairs;
  return c;
}

// The M / G decay init that remembers for hundreds of tokens (per-step decay exp(-A dt) >= 0.985) instead of the
// default's few to few tens; see docs/model.md (a_init_range, dt_init_range).
const std::vector<std::string> kLongMemory = {
    "layer_types.M.a_init_range=[0.01,0.05]", "layer_types.M.dt_init_range=[0.1,0.3]",
    "layer_types.G.a_init_range=[0.01,0.05]", "layer_types.G.dt_init_range=[0.1,0.3]"};

// Trains `pattern` (eval/recall.h's small model, plus `overrides`) for `steps` steps of 32 rows at `lr` and
// checks the recall accuracy on 256 held-out rows against `bound` (above or below), recording accuracy and time.
// One thread: at this size (2048 tokens x d 64 per step) the work per parallel region is tiny, and on a shared,
// oversubscribed machine every OpenMP barrier can cost a scheduler time slice (measured: the same 400 steps took
// 56 s with 2 threads under load, 6 s with 1).
void expect_recall(const std::string& pattern, long steps, i64 kv_pairs, double bound, bool above,
                   const std::vector<std::string>& overrides = {}, double lr = 3e-3) {
  RecallOptions o;
  o.task = task(kv_pairs);
  o.steps = steps;
  o.lr = lr;
  json j = recall_model_json(pattern, o.task);
  for (const auto& s : overrides) apply_override(j, s);
  Model m(ModelConfig::from_json(j, "recall test"));
  m.init(1);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const RecallResult r = train_recall(m, o);
  omp_set_num_threads(threads);
  ::testing::Test::RecordProperty("accuracy", fmt::format("{:.3f}", r.accuracy));
  ::testing::Test::RecordProperty("seconds", fmt::format("{:.1f}", r.seconds));
  if (above)
    EXPECT_GT(r.accuracy, bound) << pattern << " recall accuracy (" << kv_pairs << " pairs) after " << r.seconds << " s";
  else
    EXPECT_LT(r.accuracy, bound) << pattern << " recall accuracy (" << kv_pairs << " pairs) after " << r.seconds << " s";
}

}  // namespace

TEST(Mqar, RowsHaveTheZoologyFormat) {
  const data::MqarConfig c = task();
  data::MqarGenerator gen(c, 5);
  data::MqarBatch b;
  gen.next(200, b);
  ASSERT_EQ(b.inputs.size(), 200u * 64u);
  const i64 kv = c.num_kv_pairs, half = c.vocab_size / 2;
  std::map<i64, int> gap_hist;
  for (i64 r = 0; r < b.B; ++r) {
    const int32_t* in = b.inputs.data() + r * b.T;
    const int32_t* tg = b.targets.data() + r * b.T;
    std::map<int32_t, int32_t> kvmap;
    std::set<int32_t> vals;
    for (i64 i = 0; i < kv; ++i) {
      ASSERT_GE(in[2 * i], 1);
      ASSERT_LT(in[2 * i], half);
      ASSERT_GE(in[2 * i + 1], half);
      ASSERT_LT(in[2 * i + 1], c.vocab_size);
      ASSERT_TRUE(kvmap.emplace(in[2 * i], in[2 * i + 1]).second) << "keys repeat within a row";
      ASSERT_TRUE(vals.insert(in[2 * i + 1]).second) << "values repeat within a row";
      ASSERT_EQ(tg[2 * i], -1);
      ASSERT_EQ(tg[2 * i + 1], -1);
    }
    int queries = 0;
    for (i64 t = 2 * kv; t < b.T; ++t) {
      ASSERT_GE(in[t], 0);
      ASSERT_LT(in[t], c.vocab_size);
      if (tg[t] >= 0) {
        ++queries;
        ASSERT_EQ((t - 2 * kv) % 2, 0) << "queries sit at even offsets of the query region";
        ASSERT_EQ(kvmap.count(in[t]), 1u);
        ASSERT_EQ(tg[t], kvmap[in[t]]) << "target = the queried key's value";
        gap_hist[(t - 2 * kv) / 2]++;
      }
    }
    ASSERT_EQ(queries, kv) << "every key is queried exactly once";
  }
  // power_a = 0.01 favours early slots: slot 0 is used far more often than the last slot.
  EXPECT_GT(gap_hist[0], 4 * std::max(1, gap_hist[(64 - 16) / 2 - 1]));
}

TEST(Mqar, DeterministicBySeedAndResumable) {
  data::MqarGenerator a(task(), 3), b(task(), 3), c(task(), 4);
  data::MqarBatch x, y, z;
  a.next(8, x);
  b.next(8, y);
  c.next(8, z);
  EXPECT_EQ(x.inputs, y.inputs);
  EXPECT_EQ(x.targets, y.targets);
  EXPECT_NE(x.inputs, z.inputs);
  a.next(8, x);  // second batch
  b.set_position(8);
  b.next(8, y);
  EXPECT_EQ(x.inputs, y.inputs);
  EXPECT_EQ(a.position(), 16u);
}

TEST(Mqar, BadConfigsAreErrorsNamingTheField) {
  data::MqarConfig c = task();
  c.vocab_size = 16;  // keys [1, 8) hold only 7
  EXPECT_THROW(data::MqarGenerator(c, 1), Error);
  c = task();
  c.seq_len = 30;  // 16 context + 7 query slots < 8
  try {
    data::MqarGenerator g(c, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seq_len"), std::string::npos) << e.what();
  }
}

TEST(Mqar, AccuracyScorer) {
  const float logits[3 * 4] = {0, 1, 0, 0, /**/ 5, 0, 0, 0, /**/ 0, 0, 0, 9};
  const int32_t targets[3] = {1, -1, 2};
  EXPECT_DOUBLE_EQ(data::mqar_accuracy(logits, targets, 3, 4), 0.5);
  const int32_t pred[3] = {1, 0, 2};
  EXPECT_DOUBLE_EQ(data::mqar_accuracy_from_predictions(pred, targets, 3), 1.0);
}

// Chance is 1/64 (the value range); knowing which 8 values the row holds gives 1/8.
TEST(Recall, LightningHybridLearnsMqar) { expect_recall("SL", 400, 8, 0.9, true); }

// The efficient layer doing the long-range recall. With the default init (A in [1, 16], dt in [1e-3, 0.1]) the
// state forgets within a few to a few tens of tokens and M / G stay on the plateau for thousands of steps
// (docs/mixers.md); with a long-memory init: SM 0.96 after 1000 steps on AVX2, 0.98 with init seed 2 (14-16 s, 1
// thread). 1500 steps, not 1000: at 1000 SM was 0.953 on AVX-512 (Zen 4), 0.879 on the portable fallback and 0.875
// on an Intel Emerald Rapids (AVX-512 + AMX: oneDNN's kernels round differently), under the 0.9 bound; at 1500 it
// is 0.976 (AVX-512) / 0.967 (fallback), so the test checks learning, not rounding.
TEST(Recall, Mamba2HybridLearnsMqarWithLongMemoryInit) { expect_recall("SM", 1500, 8, 0.9, true, kLongMemory); }

// A single Gated DeltaNet layer (its short conv binds each value to its key, its delta-rule state holds the pairs):
// 0.98 after 750 steps for init seeds 1 and 3 (8 s).
TEST(Recall, GatedDeltaNetLearnsMqarWithLongMemoryInit) { expect_recall("G", 1000, 8, 0.9, true, kLongMemory); }

// Below a SWA layer the G layer needs a lower learning rate: at 3e-3 SG sits on the "which 8 values are in the
// row" plateau (~0.12) for 2000+ steps; at 1e-3 it leaves it after 1000-2000 steps (init seed 1: 0.94 after 2000,
// 0.99 after 2500; seed 2: 0.98 after 1500; seed 3: 0.99 after 1500). ~40 s.
TEST(Recall, GatedDeltaNetHybridLearnsMqarWithLongMemoryInit) {
  expect_recall("SG", 2500, 8, 0.9, true, kLongMemory, 1e-3);
}

// The presets' kinds of hybrid (efficient layer + full attention, as `mamba2` = MMMF and `gdn` = GGGF) with the
// presets' default init: here the full-attention layer looks up the key and the M / G layer below it must bind
// each value to its key (its short conv and recurrence are the model's only local mixing), so a broken M / G
// forward or backward shows as a failure to learn. MF > 0.9 after 400 steps (7 s); GF binds more slowly (0.12
// after 400 steps, 0.88 after 800, ~0.9 after 1000, 0.93 after 1300).
// 800 steps, not 400: at 400 the outcome depended on the init seed and on summation order (recall CLI, AVX2 and
// the portable attention path alike: seed 1 0.78-0.80, seeds 2 and 3 at chance); at 800 seeds 1-3 reach
// 0.992 / 0.991 / 0.987, so the test checks learning, not luck.
TEST(Recall, Mamba2PlusFullAttentionHybridLearnsMqar) { expect_recall("MF", 800, 8, 0.9, true); }

// 1300 steps, not 1000: at 1000 GF sat on the bound (0.904 with the scalar gate loops, 0.892 with the SIMD
// gates of ops/mixer_gates, 0.906 on the portable fallback: rounding alone moved it across 0.9); at 1300 it is
// 0.931 (AVX2) / 0.935 (fallback), so the test checks learning, not rounding.
TEST(Recall, GatedDeltaNetPlusFullAttentionHybridLearnsMqar) { expect_recall("GF", 1300, 8, 0.9, true); }

TEST(Recall, LocalOnlyModelStaysNearChance) { expect_recall("SS", 400, 8, 0.1, false); }
