// Data-parallel training under mpirun (docs/distributed.md), run with
// `mpirun --allow-run-as-root --oversubscribe -np 2`: 2 ranks x batch b train exactly like one process
// x batch b x grad-accum 2 and like one process x batch 2b up to fp32 summation order; a checkpoint
// resumes across world sizes on the same curve; a killed rank or a non-finite loss ends every rank.
// Skipped (with the reason) when mpirun is absent or hybridlm was built without MPI. ctest label: mpi.
// With HLM_MPI_LAUNCHER=srun the same tests start the ranks with Slurm's `srun` instead (ctest label
// slurm; scripts/slurm_local.sh gives a one-node cluster), and Slurm.* tests run an emitted array script.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"

namespace fs = std::filesystem;

namespace {

struct Result {
  int code = -1;
  std::string err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

const fs::path& tmp_root() {
  static fs::path p = [] {
    fs::path d = fs::temp_directory_path() / ("hlm_mpi_test_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d / "corpus");
    for (int i = 0; i < 6; ++i) {
      std::ofstream f(d / "corpus" / ("doc" + std::to_string(i) + ".txt"));
      for (int j = 0; j < 200; ++j) f << "Document " << i << " line " << j << ": the quick brown fox jumps " << i * j << ".\n";
    }
    ::setenv("HLM_DATA_CACHE", (d / "cache").c_str(), 1);
    return d;
  }();
  return p;
}

// Removes this process's run folders when the tests end.
class CleanUp : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(tmp_root()); }
};
const auto* const kCleanUp = ::testing::AddGlobalTestEnvironment(new CleanUp);

// Whether the ranks are started by Slurm's srun (HLM_MPI_LAUNCHER=srun) rather than by mpirun.
bool under_slurm() {
  static const bool srun = [] {
    const char* l = std::getenv("HLM_MPI_LAUNCHER");
    return l != nullptr && std::string(l) == "srun";
  }();
  return srun;
}

// Why the MPI tests cannot run here ("" when they can).
std::string skip_reason() {
  static std::string why = [] () -> std::string {
    if (under_slurm()) {
      if (std::system("sinfo >/dev/null 2>&1") != 0)
        return "HLM_MPI_LAUNCHER=srun but no Slurm cluster answers (sinfo failed; scripts/slurm_local.sh start)";
    } else if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
      return "mpirun not found (apt-get install openmpi-bin)";
    }
    const fs::path v = fs::temp_directory_path() / ("hlm_mpi_version_" + std::to_string(::getpid()));
    std::system((std::string(HLM_BINARY) + " --version >" + v.string() + " 2>&1").c_str());
    std::string s = slurp(v);
    fs::remove(v);
    if (s.find("MPI: none") != std::string::npos) return "hybridlm was built without MPI (HLM_MPI=OFF or no MPI found)";
    return "";
  }();
  return why;
}

#define SKIP_WITHOUT_MPI()                                                    \
  do {                                                                        \
    if (!skip_reason().empty()) GTEST_SKIP() << "MPI tests skipped: " << skip_reason(); \
  } while (0)

// The command prefix that starts `np` ranks. srun passes the whole environment on by default and is
// used as documented (no --kill-on-bad-exit: the tests show a failing rank ends the step without it);
// --overcommit allows more ranks than this machine has CPUs.
std::string launcher(int np) {
  if (under_slurm()) return "srun --overcommit -n " + std::to_string(np) + " ";
  return "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(np) + " -x HLM_DATA_CACHE ";
}

// One run of `hybridlm train` (on `np` ranks under the launcher when np > 0, else as a plain process).
Result train(int np, const std::string& args) {
  const fs::path err = tmp_root() / "stderr.txt";
  const std::string cmd = (np > 0 ? launcher(np) : std::string()) + HLM_BINARY + " train " + args + " >/dev/null 2>" +
                          err.string();
  int st = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err);
  return r;
}

// `schedule`: steps, learning-rate and checkpoint flags (a test replaces them whole: a flag may be given once).
// The model flags; a resumed run takes its model from the checkpoint and refuses them.
const std::string kTinyModel =
    "--preset swa128-nope --set d_model=32 --set n_layers=2 --set n_heads=2 --set n_kv_heads=2 "
    "--set head_dim=16 --set d_ff=64 --set max_seq_len=64 --set window=8 ";

std::string tiny_run(const fs::path& out, const std::string& batch,
                     const std::string& schedule = "--steps 20 --lr 3e-3 --warmup 2 --ckpt-every 10") {
  const std::string model = batch == "--resume" ? "" : kTinyModel;
  return model + "--threads 1 --data " +
         (tmp_root() / "corpus").string() + " --tokenizer byte --seq-len 32 " + schedule +
         " --eval-every 0 --eval-batches 2 --keep-checkpoints 0 --quiet --out " + out.string() + " " +
         batch;
}

std::vector<double> losses(const fs::path& run) {
  std::vector<double> l;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) l.push_back(j["loss"].get<double>());
  }
  return l;
}

std::vector<float> weights(const fs::path& ckpt) {
  auto f = hlm::SafeTensorsFile::read((ckpt / "model.safetensors").string());
  std::vector<float> w;
  for (const auto& name : f.names()) {
    auto v = f.get(name).to_f32();
    w.insert(w.end(), v.begin(), v.end());
  }
  return w;
}

// A copy of a run folder whose `latest` names step 10, to resume from the middle of the run.
fs::path copy_at_step_10(const fs::path& run, const std::string& name) {
  const fs::path c = tmp_root() / name;
  fs::remove_all(c);
  fs::copy(run, c, fs::copy_options::recursive);
  fs::remove_all(c / "checkpoints" / "step_00000020");
  std::ofstream(c / "latest") << "step_00000010\n";
  // Keep the first 10 steps' metrics so the resumed run's rows follow them.
  std::vector<std::string> rows;
  {
    std::ifstream f(c / "metrics.jsonl");
    for (std::string line; std::getline(f, line);)
      if (nlohmann::json::parse(line).value("step", 0) <= 10) rows.push_back(line);
  }
  std::ofstream f(c / "metrics.jsonl", std::ios::trunc);
  for (auto& r : rows) f << r << "\n";
  return c;
}

// The three reference runs shared by the tests: 2 ranks x batch 2, 1 process x batch 2 x accum 2, and
// 1 process x batch 4 (same global batch of 4 rows, same data).
struct Runs {
  fs::path dp, accum, wide;
};
const Runs& runs() {
  static Runs r = [] {
    Runs x{tmp_root() / "dp2", tmp_root() / "accum2", tmp_root() / "batch4"};
    Result a = train(2, tiny_run(x.dp, "--batch 2"));
    EXPECT_EQ(a.code, 0) << a.err;
    Result b = train(0, tiny_run(x.accum, "--batch 2 --grad-accum 2"));
    EXPECT_EQ(b.code, 0) << b.err;
    Result c = train(0, tiny_run(x.wide, "--batch 4"));
    EXPECT_EQ(c.code, 0) << c.err;
    return x;
  }();
  return r;
}

}  // namespace

// Bitwise: with 2 ranks the all-reduce adds two partial gradients, g0 + g1 (float addition is commutative,
// so whichever rank adds), and one process with grad-accum 2 computes each micro-batch's gradient from
// zero and adds them the same way (Trainer::accumulate_micro_batch); losses and token counts likewise.
TEST(Distributed, TwoRanksEqualOneProcessWithGradAccumBitwise) {
  SKIP_WITHOUT_MPI();
  const Runs& r = runs();
  const std::vector<double> dp = losses(r.dp), acc = losses(r.accum);
  ASSERT_EQ(dp.size(), 20u);
  EXPECT_EQ(acc, dp);  // every step's loss, bit for bit
  EXPECT_EQ(weights(r.dp / "checkpoints" / "step_00000020"), weights(r.accum / "checkpoints" / "step_00000020"));
  auto run = nlohmann::json::parse(slurp(r.dp / "run.json"));
  EXPECT_EQ(run["train"]["world_size"], 2);
  EXPECT_EQ(run["train"]["global_batch"], 4);
}

// One process x batch 4 sums the same 4 rows' gradients inside each matmul (a K = 4*32-term fp32 dot
// product) instead of as two 64-term halves, so results differ by fp32 summation order only. Tolerance:
// reordering a K-term fp32 sum changes it by at most about K * 2^-24 relative to the sum of magnitudes
// (~1e-5 for K = 128); AdamW's m / sqrt(v) passes a relative gradient change through to the update, so
// after 20 steps the weights differ by at most ~20 * lr * 1e-5 = 6e-7 absolute and the losses (~5 at
// the start, gradient norm ~1) by about the same; 1e-5 relative on each loss and 1e-4 relative RMS on the
// weights leave an order of magnitude of margin and would still catch a wrong row or scale (>= 1e-2).
TEST(Distributed, TwoRanksMatchOneProcessWithTwiceTheBatchToFp32Tolerance) {
  SKIP_WITHOUT_MPI();
  const std::vector<double> dp = losses(runs().dp), wide = losses(runs().wide);
  ASSERT_EQ(dp.size(), 20u);
  ASSERT_EQ(wide.size(), dp.size());
  double worst = 0;
  for (size_t i = 0; i < dp.size(); ++i) {
    const double rel = std::abs(dp[i] - wide[i]) / std::abs(wide[i]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-5) << "step " << i + 1 << ": " << dp[i] << " vs " << wide[i];
  }
  std::vector<float> a = weights(runs().dp / "checkpoints" / "step_00000020"),
                     b = weights(runs().wide / "checkpoints" / "step_00000020");
  ASSERT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-4);
  std::printf("2 ranks x batch 2 vs 1 x batch 4: worst loss rel diff %.3g, weight rel RMS diff %.3g\n", worst,
              std::sqrt(num / den));
}

// A checkpoint of 2 ranks resumes on 1 (batch 2 x accum 2) and one of 1 process on 2 ranks (batch 2 x
// accum 1): the global batch and the data position are global, so the curve goes on bit for bit.
TEST(Distributed, ResumeAcrossWorldSizesContinuesTheCurve) {
  SKIP_WITHOUT_MPI();
  const Runs& r = runs();
  const std::vector<double> want = losses(r.accum);
  ASSERT_EQ(want.size(), 20u);
  const fs::path to1 = copy_at_step_10(r.dp, "dp2_to_1"), to2 = copy_at_step_10(r.accum, "accum2_to_2");
  Result a = train(0, tiny_run(to1, "--resume"));
  ASSERT_EQ(a.code, 0) << a.err;
  Result b = train(2, tiny_run(to2, "--resume"));
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(losses(to1), want) << a.err;
  EXPECT_EQ(losses(to2), want) << b.err;
  auto run1 = nlohmann::json::parse(slurp(to1 / "run.json"))["train"];
  EXPECT_EQ(run1["world_size"], 1);
  EXPECT_EQ(run1["grad_accum"], 2);
  auto run2 = nlohmann::json::parse(slurp(to2 / "run.json"))["train"];
  EXPECT_EQ(run2["world_size"], 2);
  EXPECT_EQ(run2["grad_accum"], 1);
  EXPECT_EQ(weights(to1 / "checkpoints" / "step_00000020"), weights(r.accum / "checkpoints" / "step_00000020"));
  // A global batch that does not split over the ranks is a clear error.
  Result c = train(3, tiny_run(copy_at_step_10(r.dp, "dp2_to_3"), "--resume"));
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.err.find("does not split evenly over 3 ranks"), std::string::npos) << c.err;
}

// A non-finite loss is seen by every rank (the loss is all-reduced): all stop with the error.
TEST(Distributed, NonFiniteLossStopsEveryRank) {
  SKIP_WITHOUT_MPI();
  const fs::path out = tmp_root() / "nan";
  Result r = train(2, tiny_run(out, "--batch 2 --grad-clip 0", "--steps 20 --lr 1e30 --schedule constant --warmup 1"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("non-finite"), std::string::npos) << r.err;
}

// A 2-rank training run of a million steps started in the background (its own process group).
class BackgroundRun {
 public:
  explicit BackgroundRun(const std::string& name) : out_(tmp_root() / name), err_(tmp_root() / (name + ".err")) {
    const std::string cmd = "exec " + launcher(2) + HLM_BINARY + " train " +
                            tiny_run(out_, "--batch 2", "--steps 1000000") + " >/dev/null 2>" + err_.string();
    pid_ = fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~BackgroundRun() {
    if (pid_ > 0 && !done_) ::kill(-pid_, SIGKILL), ::waitpid(pid_, nullptr, 0);
  }
  // Waits (up to 30 s) until rank 0 has logged two training steps.
  bool training() const {
    for (int i = 0; i < 600; ++i, usleep(50000))
      if (fs::exists(out_ / "metrics.jsonl") && losses(out_).size() >= 2) return true;
    return false;
  }
  // The pid of rank r: its command line has our run folder (and is not the launcher's) and its start-up
  // environment names the rank (mpirun: OMPI_COMM_WORLD_RANK; srun: SLURM_PROCID).
  pid_t rank_pid(int r) const {
    const std::string rank_var = (under_slurm() ? "SLURM_PROCID=" : "OMPI_COMM_WORLD_RANK=") + std::to_string(r) + '\0';
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::string cmdline = slurp(e.path() / "cmdline"), env = slurp(e.path() / "environ");
      if (cmdline.find(out_.string()) == std::string::npos || cmdline.rfind(HLM_BINARY, 0) != 0) continue;
      if (env.find(rank_var) != std::string::npos) return std::stoi(name);
    }
    return -1;
  }
  // Waits up to 30 s for the launcher (mpirun or srun) to exit; returns the seconds waited (>= 30: still running) and its status.
  double wait_exit(int* status) {
    const auto t0 = std::chrono::steady_clock::now();
    double waited = 0;
    while (waited < 30) {
      if (::waitpid(pid_, status, WNOHANG) == pid_) {
        done_ = true;
        return waited;
      }
      usleep(20000);
      waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return waited;
  }
  pid_t launcher_pid() const { return pid_; }
  const fs::path& out() const { return out_; }
  std::string err() const { return slurp(err_); }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  bool done_ = false;
};

// kill -9 of rank 1 mid-run: the launcher notices and ends rank 0 within seconds (no rank hangs in a collective).
TEST(Distributed, AKilledRankEndsTheRunWithinSeconds) {
  SKIP_WITHOUT_MPI();
  BackgroundRun run("killed");
  ASSERT_TRUE(run.training()) << run.err();
  const pid_t victim = run.rank_pid(1);
  ASSERT_GT(victim, 0) << "rank 1 not found; stderr: " << run.err();
  ::kill(victim, SIGKILL);
  int st = 0;
  const double waited = run.wait_exit(&st);
  ASSERT_LT(waited, 10.0) << "the launcher still running after rank 1 was killed";
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_NE(run.err().find(under_slurm() ? "task 1: Killed" : "exited on signal 9"), std::string::npos) << run.err();
  std::printf("the launcher ended %.2f s after rank 1 was killed\n", waited);
}

// SIGUSR1 to the launcher (mpirun or srun: each forwards it to every rank) is the graceful stop: the ranks agree
// to stop after the step, rank 0 saves a checkpoint, and all exit 130.
TEST(Distributed, SigUsr1ToMpirunSavesAndStopsEveryRank) {
  SKIP_WITHOUT_MPI();
  BackgroundRun run("usr1");
  ASSERT_TRUE(run.training()) << run.err();
  ::kill(run.launcher_pid(), SIGUSR1);
  int st = 0;
  const double waited = run.wait_exit(&st);
  ASSERT_LT(waited, 10.0) << "the launcher still running after SIGUSR1";
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 130) << run.err();
  EXPECT_TRUE(fs::exists(run.out() / "latest")) << run.err();
  EXPECT_NE(run.err().find("interrupted at step"), std::string::npos) << run.err();
}

// `mpirun -np 2 hybridlm sweep PLAN`: rank r trains runs r, r+2, ... each as a single process of its own (the
// launcher's variables are not passed on, so a child is not a rank), and rank 0 merges the ranks' status
// into one sweep.json.
// A sweep plan of 4 tiny runs (2 architectures, budgets of 2 and 3 steps) into `out`; returns the plan file.
fs::path tiny_sweep_plan(const fs::path& out) {
  const nlohmann::json plan = {
      {"out", out.string()}, {"data", (tmp_root() / "corpus").string()}, {"tokenizer", "byte"},
      {"archs", {"swa128", {{"name", "nope8"}, {"preset", "swa128-nope"}, {"set", {"window=8"}}}}},
      {"sizes", {{{"name", "s1"}, {"set", {"d_model=32", "n_layers=2", "n_heads=2", "n_kv_heads=2", "head_dim=16",
                                           "d_ff=64", "max_seq_len=64"}}}}},
      {"budgets", {2, 3}},
      {"train", {{"batch", 2}, {"seq_len", 32}, {"lr", 0.003}, {"eval_every", 1}, {"eval_batches", 1}, {"quiet", true}}}};
  const fs::path plan_file = out.string() + "_plan.json";
  std::ofstream(plan_file) << plan.dump(2);
  return plan_file;
}

TEST(Distributed, SweepSharesItsRunsAcrossRanks) {
  SKIP_WITHOUT_MPI();
  const fs::path out = tmp_root() / "sweep";
  const fs::path plan_file = tiny_sweep_plan(out);
  const fs::path err = tmp_root() / "sweep_stderr.txt";
  const std::string cmd = launcher(2) + HLM_BINARY + " sweep " + plan_file.string() + " >/dev/null 2>" + err.string();
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << slurp(err);
  const auto sweep = nlohmann::json::parse(slurp(out / "sweep.json"));
  ASSERT_EQ(sweep["runs"].size(), 4u);
  for (int rank = 0; rank < 2; ++rank) EXPECT_FALSE(fs::exists(out / ("sweep.rank-" + std::to_string(rank) + ".json")));
  const std::string log = slurp(err);
  for (size_t i = 0; i < 4; ++i) {
    const auto& e = sweep["runs"][i];
    const std::string name = e["name"];
    EXPECT_EQ(e["status"], "done") << e.dump();
    // Trained once, by the rank that owns it, on one process with this rank's one CPU.
    EXPECT_EQ(losses(out / name).size(), static_cast<size_t>(e["steps"].get<long>())) << name;
    EXPECT_NE(log.find("rank " + std::to_string(i % 2) + ": [" + std::to_string(i + 1) + "/4] " + name + ": done"),
              std::string::npos) << log;
    const auto run = nlohmann::json::parse(slurp(out / name / "run.json"));
    EXPECT_EQ(run["train"]["world_size"], 1) << name;
    EXPECT_NE(e["command"].get<std::string>().find("--threads "), std::string::npos) << e.dump();
  }
}

// reproduce under mpirun: each rank runs the tasks of its share of the runs (here finding c at the tiny budget:
// 3 trainings of 120 steps and their retrieval-head probes), learns of the other rank's through the study folder,
// and rank 0 writes the report; a single-process rerun then finds every task done. ~1 min.
TEST(Distributed, ReproduceSharesItsRunsAcrossRanks) {
  SKIP_WITHOUT_MPI();
  const fs::path out = tmp_root() / "study";
  const fs::path err = tmp_root() / "reproduce_stderr.txt";
  const std::string cmd = launcher(2) + HLM_BINARY + " reproduce --budget tiny --only c --out " + out.string() +
                          " >/dev/null 2>" + err.string();
  const int st = std::system(cmd.c_str());
  const std::string log = slurp(err);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << log;
  const auto findings = nlohmann::json::parse(slurp(out / "findings.json"));
  EXPECT_EQ(findings["run"]["tasks_failed"], 0) << findings["run"].dump();
  EXPECT_TRUE(fs::exists(out / "report.md"));
  EXPECT_FALSE(fs::exists(out / ".rank-markers"));
  // The runs in plan order go to ranks 0, 1, 0; each rank trains and probes its own, and hears of the other's.
  const char* runs[] = {"swa-small-x2-s1", "swa-mid-x2-s1", "swa-large-x2-s1"};  // c trains twice the steps
  for (int k = 0; k < 3; ++k) {
    const std::string me = "rank " + std::to_string(k % 2) + ": ", other = "rank " + std::to_string(1 - k % 2) + ": ";
    for (const std::string task : {"train ", "probe retrieval-heads "}) {
      const std::string label = task + runs[k];
      EXPECT_NE(log.find(me + "reproduce: ["), std::string::npos) << log;
      bool ran_here = false, heard_there = false;
      std::istringstream lines(log);
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind(me, 0) == 0 && line.find(": " + label + " (") != std::string::npos &&
            line.find("(rank ") == std::string::npos)
          ran_here = true;
        if (line.rfind(other, 0) == 0 && line.find(": " + label + " (rank " + std::to_string(k % 2) + ")") !=
                                             std::string::npos)
          heard_there = true;
      }
      EXPECT_TRUE(ran_here) << label << " not run by " << me << "\n" << log;
      EXPECT_TRUE(heard_there) << label << " not seen done by " << other << "\n" << log;
    }
    const auto run = nlohmann::json::parse(slurp(out / "runs" / runs[k] / "run.json"));
    EXPECT_EQ(run["train"]["world_size"], 1) << runs[k];  // a single-process child
  }
  // One process continues the same folder: nothing left to do.
  const std::string again = HLM_BINARY + std::string(" reproduce --budget tiny --only c --out ") + out.string() +
                            " >/dev/null 2>" + err.string();
  ASSERT_EQ(std::system(again.c_str()), 0) << slurp(err);
  EXPECT_NE(slurp(err).find("already done (resumed)"), std::string::npos) << slurp(err);
  EXPECT_EQ(slurp(err).find("train "), std::string::npos) << slurp(err);
}

// `sweep --emit-slurm` on a Slurm cluster: `sbatch --wait` runs one array task per run, each training its run
// on 2 ranks through srun; submitting again resumes every run at its last step (nothing retrained), and
// `hybridlm sweep` then finds every run done. Only with HLM_MPI_LAUNCHER=srun (~30 s).
TEST(Slurm, EmittedArrayScriptTrainsEveryRunAndResubmittingResumes) {
  SKIP_WITHOUT_MPI();
  if (!under_slurm()) GTEST_SKIP() << "needs a Slurm cluster (HLM_MPI_LAUNCHER=srun; scripts/slurm_local.sh start)";
  const fs::path out = tmp_root() / "slurm_sweep";
  const fs::path plan_file = tiny_sweep_plan(out), script = tmp_root() / "sweep.sbatch";
  const fs::path err = tmp_root() / "slurm_stderr.txt";
  const std::string emit = HLM_BINARY + std::string(" sweep ") + plan_file.string() + " --emit-slurm " +
                           script.string() + " --slurm-ranks 2 --slurm-threads 1 2>" + err.string();
  ASSERT_EQ(std::system(emit.c_str()), 0) << slurp(err);
  const std::string submit = "sbatch --wait --quiet " + script.string() + " >/dev/null 2>" + err.string();
  ASSERT_EQ(std::system(submit.c_str()), 0) << slurp(err);
  const char* names[] = {"swa128-s1-2", "swa128-s1-3", "nope8-s1-2", "nope8-s1-3"};
  std::vector<std::vector<double>> first;
  for (const char* name : names) {
    const fs::path run = out / name;
    ASSERT_TRUE(fs::exists(run / "run.json")) << name << "; logs in " << out;
    first.push_back(losses(run));
    EXPECT_EQ(first.back().size(), std::string(name).back() == '2' ? 2u : 3u) << name;
    EXPECT_EQ(nlohmann::json::parse(slurp(run / "run.json"))["train"]["world_size"], 2) << name;
  }
  size_t logs = 0;
  for (const auto& e : fs::directory_iterator(out)) logs += e.path().filename().string().rfind("slurm-", 0) == 0;
  EXPECT_EQ(logs, 4u);
  // Submitted again, every task takes the --resume branch and its run is already at its last step.
  ASSERT_EQ(std::system(submit.c_str()), 0) << slurp(err);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(losses(out / names[i]), first[i]) << names[i];
  // The plan's own command then sees every run done and writes sweep.json.
  const std::string sweep = HLM_BINARY + std::string(" sweep ") + plan_file.string() + " >/dev/null 2>" + err.string();
  ASSERT_EQ(std::system(sweep.c_str()), 0) << slurp(err);
  const auto status = nlohmann::json::parse(slurp(out / "sweep.json"));
  ASSERT_EQ(status["runs"].size(), 4u);
  for (const auto& e : status["runs"]) EXPECT_EQ(e["status"], "done") << e.dump();
}
