// The data-parallel pieces that need no second process: how a global batch is split over ranks, the
// weights checksum, and the one-process behaviour of train/distributed.h (tests/mpi/ runs real ranks).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/data_parallel.h"
#include "train/distributed.h"

using namespace hlm;

TEST(DataParallel, SplitKeepsTheMicroBatchWhenItDividesTheRowsPerRank) {
  auto s = split_global_batch(16, 2, 4);  // 8 rows per rank
  EXPECT_EQ(s.batch, 4);
  EXPECT_EQ(s.grad_accum, 2);
  s = split_global_batch(16, 1, 4);
  EXPECT_EQ(s.batch, 4);
  EXPECT_EQ(s.grad_accum, 4);
  s = split_global_batch(16, 8, 4);  // 2 rows per rank: the micro-batch shrinks
  EXPECT_EQ(s.batch, 2);
  EXPECT_EQ(s.grad_accum, 1);
  s = split_global_batch(24, 2, 5);  // 12 rows: the largest divisor below 5
  EXPECT_EQ(s.batch, 4);
  EXPECT_EQ(s.grad_accum, 3);
  EXPECT_THROW(split_global_batch(4, 3, 2), Error);
  try {
    split_global_batch(4, 3, 2);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not split evenly over 3 ranks"), std::string::npos) << e.what();
  }
}

TEST(DataParallel, ChecksumSeesOneBitAndOneProcessIsItsOwnReplica) {
  std::vector<float> w(1000, 0.25f);
  const auto h = checksum(w.data(), 1000);
  EXPECT_EQ(h, checksum(w.data(), 1000));
  w[777] = std::nextafter(w[777], 1.0f);
  EXPECT_NE(h, checksum(w.data(), 1000));
  EXPECT_NO_THROW(check_replicas_identical(w.data(), 1000, 5));
}

TEST(Distributed, OneProcessCollectivesLeaveBuffersAlone) {
  if (dist::world_size() != 1) GTEST_SKIP() << "the unit tests run as one process";
  EXPECT_EQ(dist::rank(), 0);
  EXPECT_TRUE(dist::is_root());
  std::vector<float> g = {1.5f, -2.f, 3.f};
  dist::allreduce_sum(g.data(), 3, 2);
  EXPECT_EQ(g, (std::vector<float>{1.5f, -2.f, 3.f}));
  double d = 7;
  dist::allreduce_sum(&d, 1);
  EXPECT_EQ(d, 7);
  EXPECT_TRUE(dist::any(true));
  EXPECT_FALSE(dist::any(false));
  EXPECT_TRUE(dist::all_equal(42));
  std::string s = "x";
  dist::broadcast(s);
  EXPECT_EQ(s, "x");
  EXPECT_GE(dist::default_threads(), std::getenv("OMP_NUM_THREADS") ? 0 : 1);
  EXPECT_EQ(dist::built_with_mpi(), dist::backend() != "none");
}

// sweep --emit-slurm writes a job-array script with one task per run of the plan, each resuming its run
// folder when it holds a checkpoint; the script is valid bash.
TEST(SweepSlurm, EmitsOneArrayTaskPerRun) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("hlm_slurm_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  const nlohmann::json plan = {
      {"out", (d / "sweep").string()}, {"data", (d / "corpus").string()}, {"tokenizer", "byte"},
      {"archs", {"swa128", "gdn"}},
      {"sizes", {{{"name", "s1"}, {"set", {"d_model=32", "n_layers=2", "n_heads=2", "n_kv_heads=2", "head_dim=16",
                                           "d_ff=64", "max_seq_len=64"}}}}},
      {"budgets", {2, 3}},
      {"train", {{"batch", 2}, {"seq_len", 32}}}};
  std::ofstream(d / "plan.json") << plan.dump();
  const fs::path script = d / "sweep.sbatch";
  const std::string cmd = std::string(HLM_BINARY) + " sweep " + (d / "plan.json").string() + " --emit-slurm " +
                          script.string() + " --slurm-ranks 2 --slurm-threads 4 --slurm-option time=1:00:00 " +
                          "--slurm-option=--partition=cpu 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream f(script);
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* want : {"#SBATCH --array=0-3\n", "#SBATCH --ntasks=2\n", "#SBATCH --cpus-per-task=4\n",
                           "#SBATCH --time=1:00:00\n", "#SBATCH --chdir=", "#SBATCH --partition=cpu\n", "  3)  # gdn-s1-3\n",
                           "sweep/gdn-s1-3/latest ]", "--steps 3", "--resume"})
    EXPECT_NE(s.find(want), std::string::npos) << want << " not in\n" << s;
  EXPECT_EQ(s.find("  4)"), std::string::npos);
  EXPECT_EQ(std::system(("bash -n " + script.string()).c_str()), 0) << s;
  // Token budgets with several ranks per run would multiply the tokens: refused, naming the flag.
  nlohmann::json tok = plan;
  tok["budget_unit"] = "tokens";
  tok["budgets"] = {1000};
  std::ofstream(d / "plan_tok.json") << tok.dump();
  const std::string bad = std::string(HLM_BINARY) + " sweep " + (d / "plan_tok.json").string() + " --emit-slurm " +
                          (d / "x.sbatch").string() + " --slurm-ranks 2 2>/dev/null";
  EXPECT_NE(std::system(bad.c_str()), 0);
  fs::remove_all(d);
}
