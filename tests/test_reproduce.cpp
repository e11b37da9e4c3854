// `hybridlm reproduce` end to end at the tiny budget of the shipped plan (studies/paper.json): trains the
// hybrids and the shared evaluator, evaluates, probes, fits and writes report.md, the figures and
// findings.json; --report-only rewrites the report from findings.json alone; a rerun redoes nothing; a
// study killed mid-run (kill -9) continues when started again. Bad plans and options are refused before
// anything runs. Cost (Release, measured on the shared 2-core machine): see docs/reproduce.md.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_harness.h"
#include "ops/bf16_pairs.h"
#include "ops/precision.h"

extern char** environ;

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path& tmp_dir() {
  static hlm::testing::ScratchDir d("hlm_reproduce_test_");
  return d.path;
}

using Result = hlm::testing::CliResult;
using hlm::testing::slurp;
Result run(const std::string& args) { return hlm::testing::run_cli_in(tmp_dir(), args); }
void expect_error(const Result& r, const std::string& needle) { hlm::testing::expect_cli_error(r, needle); }

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

}  // namespace

TEST(Reproduce, RefusesBadPlansAndOptionsBeforeAnythingRuns) {
  const fs::path out = tmp_dir() / "refused";
  const fs::path plan = tmp_dir() / "plan_bad_preset.json";
  json j = read_json(fs::path(HLM_SOURCE_DIR) / "studies" / "paper.json");
  j["hybrids"]["gdn"]["preset"] = "gdnx";
  std::ofstream(plan) << j.dump();
  expect_error(run("reproduce " + plan.string() + " --budget tiny --out " + out.string()),
               plan.string() + ": field 'hybrids.gdn.preset'");
  EXPECT_FALSE(fs::exists(out));
  expect_error(run("reproduce --budget huge --out " + out.string()), "--budget huge: the plan");
  expect_error(run("reproduce --budget tiny --only e --out " + out.string()), "--only e: unknown finding");
  expect_error(run("reproduce --report-only --out " + out.string()), "findings.json does not exist");
  EXPECT_FALSE(fs::exists(out / "runs"));
}

TEST(Reproduce, TinyBudgetEndToEndThenReportOnlyAndRerun) {
  const fs::path out = tmp_dir() / "tiny";
  const auto t0 = std::chrono::steady_clock::now();
  Result r = run("reproduce --budget tiny --jobs 2 --out " + out.string());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("reproduce --budget tiny: %.1f s\n", secs);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("report: " + (out / "report.md").string()), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << r.err;  // the progress line
  EXPECT_NE(r.err.find(": train swa-small-s1 ("), std::string::npos) << r.err;  // a training task's progress line
  const json f = read_json(out / "findings.json");
  ASSERT_EQ(f["findings"].size(), 4u);
  for (auto& x : f["findings"]) {
    const std::string v = x["verdict"];
    EXPECT_TRUE(v == "holds" || v == "does not hold" || v == "inconclusive") << v;
    EXPECT_FALSE(x["reason"].get<std::string>().empty());
  }
  // One seed: no finding can be decided at the tiny budget (the rules need two).
  for (auto& x : f["findings"]) EXPECT_EQ(x["verdict"], "inconclusive") << x.dump();
  // Every run was measured: LongPPL at every checkpoint, probes and evals.
  EXPECT_EQ(f["run"]["tasks_failed"], 0);
  for (auto& [h, seeds] : f["findings"][0]["data"]["curves"].items())
    for (auto& p : seeds[0]) EXPECT_TRUE(p["val_loss"].is_number()) << h << p.dump();
  EXPECT_TRUE(f["findings"][1]["data"]["per_seed"]["gdn"][0]["full"]["niah"].is_number());
  EXPECT_EQ(f["findings"][2]["data"]["curves"]["swa-large"][0].size(), 6u);  // 6 checkpoints of 120 steps
  // d: NIAH over training for RoPE and NoPE, and the step each learned retrieval at ("never" is a value too).
  // c's and d's runs train twice the budget's steps (steps_factor 2) in folders of their own (c's small window is
  // d's RoPE run); a and b share the others.
  EXPECT_EQ(f["findings"][3]["steps"], 120);
  EXPECT_EQ(f["findings"][2]["steps"], 120);
  EXPECT_EQ(f["findings"][1]["steps"], 60);
  for (const char* h : {"swa-small", "swa-small-nope"}) {
    const json& row = f["findings"][3]["data"]["per_seed"][h][0];
    EXPECT_EQ(row["over_training"].size(), 6u) << h;  // 6 checkpoints of 120 steps
    EXPECT_TRUE(fs::exists(out / "runs" / (std::string(h) + "-x2-s1") / "checkpoints" / "step_00000120")) << h;
    EXPECT_TRUE(row["learned_at"].is_number() || row["learned_at"] == "never") << row["learned_at"];
  }
  EXPECT_TRUE(fs::exists(out / "runs" / "swa-large-x2-s1" / "checkpoints" / "step_00000120"));  // c's
  EXPECT_TRUE(fs::exists(out / "runs" / "swa-small-s1" / "checkpoints" / "step_00000060"));  // a's and b's run
  EXPECT_FALSE(fs::exists(out / "runs" / "swa-small-s1" / "checkpoints" / "step_00000080"));
  EXPECT_EQ(f["hybrids"]["swa-large"]["window"], 192);  // half of the tiny budget's 384-token rows
  EXPECT_EQ(f["run"]["precision"], "fp32");
  // One sitting, recorded with its machine, job layout, time and the tasks it ran.
  ASSERT_EQ(f["run"]["sittings"].size(), 1u) << f["run"].dump();
  const json& sitting = f["run"]["sittings"][0];
  EXPECT_EQ(sitting["tasks_done"], 41);
  EXPECT_EQ(sitting["jobs"], 2);
  EXPECT_EQ(sitting["interrupted"], false);
  EXPECT_EQ(sitting["cpu"], f["run"]["cpu"]);
  EXPECT_GT(sitting["seconds"].get<double>(), 0.0);
  EXPECT_EQ(sitting["seconds"], f["run"]["wall_seconds"]);
  EXPECT_EQ(read_json(out / "study.json")["sittings"], f["run"]["sittings"]);
  EXPECT_EQ(f["plan"]["file"], "studies/paper.json");  // named relative to the source tree, not this machine's path
  const std::string report = slurp(out / "report.md");
  for (const char* s : {"| a. Scaling |", "| d. NoPE on the full layers |", "Miniature proxy", "shared evaluator",
                        "loss-vs-compute.svg", "receptive-field.svg", "niah-over-training.svg", "nope-vs-rope.svg",
                        "learned retrieval at step (per seed)", "nope-rope-over-training.svg",
                        "**Training.** This finding's runs train 120 steps", "LongPPL read on up to 2 validation"})
    EXPECT_NE(report.find(s), std::string::npos) << s;
  for (const char* svg : {"loss-vs-compute.svg", "receptive-field.svg", "niah-over-training.svg",
                          "heads-over-training.svg", "nope-vs-rope.svg", "nope-rope-over-training.svg"})
    EXPECT_TRUE(fs::exists(out / svg)) << svg;
  // log LongPPL is drawn when the evaluator found key tokens (at this budget it may find none; the reason says so).
  const bool key_tokens = f["findings"][0]["details"]["longppl_key_tokens"].get<long>() > 0;
  EXPECT_EQ(fs::exists(out / "longppl-vs-compute.svg"), key_tokens);
  if (!key_tokens) {
    EXPECT_NE(f["findings"][0]["reason"].get<std::string>().find("no key tokens"), std::string::npos);
  }

  // A dry run over the finished folder: every run done, its training FLOPs those its training logged.
  Result dry = run("reproduce --budget tiny --dry-run --json --out " + out.string());
  ASSERT_EQ(dry.code, 0) << dry.err;
  const json dj = json::parse(dry.out);
  EXPECT_EQ(dj["runs"].size(), 11u);
  for (auto& x : dj["runs"]) {
    EXPECT_EQ(x["on_disk"], "done") << x.dump();
    double logged = 0;
    std::ifstream metrics(out / "runs" / x["name"].get<std::string>() / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);)
      if (const json row = json::parse(line); row.contains("flops")) logged = row["flops"].get<double>();
    EXPECT_NEAR(x["train_flops"].get<double>(), logged, 1e-6 * logged) << x.dump();
  }
  EXPECT_EQ(dj["total"]["tasks"], 41);
  for (auto& [kind, n] : dj["tasks"].items()) EXPECT_EQ(n[0], n[1]) << kind;  // every task done

  // The report again from findings.json alone, with the run folders gone.
  fs::remove(out / "report.md");
  fs::rename(out / "runs", tmp_dir() / "runs-aside");
  Result again = run("reproduce --report-only --out " + out.string());
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(slurp(out / "report.md"), report);
  fs::rename(tmp_dir() / "runs-aside", out / "runs");

  // A rerun finds everything done and only rewrites the report.
  Result rerun = run("reproduce --budget tiny --out " + out.string());
  ASSERT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_NE(rerun.err.find("already done (resumed)"), std::string::npos) << rerun.err;
  EXPECT_EQ(rerun.err.find(": train "), std::string::npos) << rerun.err;
  // ... a second sitting on the same machine, which ran no task; one machine reads as one line.
  const json sittings = read_json(out / "findings.json")["run"]["sittings"];
  ASSERT_EQ(sittings.size(), 2u) << sittings.dump();
  EXPECT_EQ(sittings[0], f["run"]["sittings"][0]);
  EXPECT_EQ(sittings[1]["tasks_done"], 0);
  EXPECT_NE(slurp(out / "report.md").find("- Wall time: "), std::string::npos);
  EXPECT_NE(slurp(out / "report.md").find(" over all sittings, on a machine with "), std::string::npos);
  // Another budget in the same folder is refused.
  expect_error(run("reproduce --budget small --out " + out.string()), "field 'budget' is \"tiny\"");

  // A study grows its seeds: --seeds 2 trains seed 2 of what is asked for and keeps seed 1 as it was.
  const json one_seed = read_json(out / "findings.json");
  EXPECT_TRUE(one_seed["run"]["seeds_added"].empty()) << one_seed["run"].dump();
  const fs::path seed1 = out / "runs" / "swa-small-nope-x2-s1" / "run.json";
  const std::string seed1_before = slurp(seed1);
  const auto seed1_time = fs::last_write_time(seed1);
  Result grown = run("reproduce --budget tiny --only d --seeds 2 --out " + out.string());
  ASSERT_EQ(grown.code, 0) << grown.err;
  EXPECT_NE(grown.err.find("adding seed 2..2"), std::string::npos) << grown.err;
  for (const char* r : {"swa-small-x2-s2", "swa-small-nope-x2-s2"})
    EXPECT_TRUE(fs::exists(out / "runs" / r / "latest")) << r;
  EXPECT_FALSE(fs::exists(out / "runs" / "swa-small-s2"));  // d's runs only
  EXPECT_FALSE(fs::exists(out / "runs" / "gdn-s2"));  // not asked for
  EXPECT_EQ(slurp(seed1), seed1_before);
  EXPECT_EQ(fs::last_write_time(seed1), seed1_time);
  const json g = read_json(out / "findings.json");
  EXPECT_EQ(g["seeds"], 2);
  EXPECT_EQ(g["findings"][0]["data"]["per_seed"]["swa-small-nope"].size(), 2u);
  // ... and records that it did so over a 1-seed report, with that report's verdicts, which its own report repeats.
  ASSERT_EQ(g["run"]["seeds_added"].size(), 1u) << g["run"].dump();
  const json& grew = g["run"]["seeds_added"][0];
  EXPECT_EQ(grew["from"], 1);
  EXPECT_EQ(grew["to"], 2);
  EXPECT_EQ(grew["report_finished"], one_seed["run"]["finished"]);
  ASSERT_EQ(grew["report_verdicts"].size(), 4u) << grew.dump();
  for (auto& f : one_seed["findings"]) EXPECT_EQ(grew["report_verdicts"][f["id"].get<std::string>()], f["verdict"]);
  const std::string grown_report = slurp(out / "report.md");
  EXPECT_NE(grown_report.find("**Seeds added after a report.** The study grew from 1 to 2 seeds after its 1-seed "
                              "report (finished " + one_seed["run"]["finished"].get<std::string>() + ")"),
            std::string::npos) << grown_report;
  EXPECT_NE(grown_report.find("(verdicts: a " + one_seed["findings"][0]["verdict"].get<std::string>() + "; b "),
            std::string::npos) << grown_report;
  // Without --seeds a rerun keeps the folder's 2; fewer seeds than the folder holds are refused.
  Result kept = run("reproduce --budget tiny --only d --out " + out.string());
  ASSERT_EQ(kept.code, 0) << kept.err;
  EXPECT_EQ(kept.err.find(": train "), std::string::npos) << kept.err;
  EXPECT_EQ(read_json(out / "study.json")["seeds"], 2);
  EXPECT_EQ(read_json(out / "findings.json")["run"]["seeds_added"], g["run"]["seeds_added"]);  // kept, not repeated
  expect_error(run("reproduce --budget tiny --seeds 1 --out " + out.string()), "field 'seeds' is 2");
  // The folder's seeds start at 1: another first seed is another study.
  expect_error(run("reproduce --budget tiny --first-seed 7 --out " + out.string()), "field 'first_seed' is 1");

  // A study of fresh seeds (--first-seed) says which seeds it ran; a report of a study from before the option (no
  // first_seed in findings.json) reads as before.
  json fresh = g;
  fresh["first_seed"] = 101;
  const fs::path fresh_dir = tmp_dir() / "fresh-seeds-report";
  fs::create_directories(fresh_dir);
  std::ofstream(fresh_dir / "findings.json") << fresh.dump();
  ASSERT_EQ(run("reproduce --report-only --out " + fresh_dir.string()).code, 0);
  const std::string fresh_report = slurp(fresh_dir / "report.md");
  EXPECT_NE(fresh_report.find("2 seeds (seeds 101..102: a sample of fresh seeds, `--first-seed 101`) per hybrid"),
            std::string::npos) << fresh_report;
  // The legend of the figure of NIAH over training names the runs by their seeds.
  EXPECT_NE(slurp(fresh_dir / "nope-rope-over-training.svg").find("swa-small-nope s102"), std::string::npos);
  fresh.erase("first_seed");
  std::ofstream(fresh_dir / "findings.json") << fresh.dump();
  ASSERT_EQ(run("reproduce --report-only --out " + fresh_dir.string()).code, 0);
  EXPECT_NE(slurp(fresh_dir / "report.md").find(" 2 seeds per hybrid;"), std::string::npos);

  // A study resumed on other machines lists each with its time; a killed sitting and one from before sittings were
  // recorded say so. A findings.json from before sittings (none in "run") reads as one line, as it always did.
  json moved = g;
  const json cpu_a = {{"cpu", "CPU A"}, {"cores", 2}, {"simd", "AVX2"}, {"jobs", 2}, {"threads_per_job", 1}};
  json cpu_b = {{"cpu", "CPU B"}, {"cores", 16}, {"simd", "AVX3_DL"}, {"jobs", 16}, {"threads_per_job", 1}};
  json sits = json::array({{{"seconds", 600.0}}});  // from before sittings were recorded
  for (double sec : {3600.0, 1800.0}) {
    json a = cpu_a;
    a["seconds"] = sec;
    sits.push_back(a);
  }
  cpu_b["seconds"] = nullptr;  // killed
  sits.push_back(cpu_b);
  cpu_b["seconds"] = 7200.0;
  sits.push_back(cpu_b);
  moved["run"]["sittings"] = sits;
  std::ofstream(fresh_dir / "findings.json") << moved.dump();
  ASSERT_EQ(run("reproduce --report-only --out " + fresh_dir.string()).code, 0);
  EXPECT_NE(slurp(fresh_dir / "report.md").find(
                "- Wall time: 3h40m over 5 sittings: 10m00s in 1 sitting on a machine not recorded; 1h30m in 2 "
                "sittings on a machine with 2 cores (CPU A, SIMD kernels AVX2) (2 jobs at a time x 1 thread); 2h00m "
                "in 2 sittings on a machine with 16 cores (CPU B, SIMD kernels AVX3_DL) (16 jobs at a time x 1 "
                "thread) (the time of 1 sitting not recorded: stopped by a kill); "),
            std::string::npos) << slurp(fresh_dir / "report.md");
  moved["run"].erase("sittings");
  moved["run"]["wall_seconds"] = 5400.0;
  std::ofstream(fresh_dir / "findings.json") << moved.dump();
  ASSERT_EQ(run("reproduce --report-only --out " + fresh_dir.string()).code, 0);
  EXPECT_NE(slurp(fresh_dir / "report.md").find("- Wall time: 1h30m over all sittings, on a machine with " +
                                                 std::to_string(g["run"]["cores"].get<int>()) + " cores ("),
            std::string::npos) << slurp(fresh_dir / "report.md");
}

// --precision bf16 trains every run in bf16 (and says so in findings.json and the report); where the CPU lacks
// native bf16 it is refused before anything runs, naming what is missing.
TEST(Reproduce, PrecisionBf16TrainsEveryRunInBf16OrIsRefusedUpFront) {
  const fs::path out = tmp_dir() / "bf16";
  const std::string missing = hlm::ops::bf16_native_missing();
  if (!missing.empty()) {
    expect_error(run("reproduce --budget tiny --only d --precision bf16 --out " + out.string()),
                 "--precision bf16: " + missing);
    EXPECT_FALSE(fs::exists(out / "runs"));
    return;
  }
  Result r = run("reproduce --budget tiny --only d --jobs 2 --precision bf16 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json f = read_json(out / "findings.json");
  EXPECT_EQ(f["run"]["precision"], "bf16");
  EXPECT_EQ(f["run"]["tasks_failed"], 0);
  int runs = 0;
  for (auto& e : fs::directory_iterator(out / "runs")) {
    EXPECT_EQ(read_json(e.path() / "run.json")["train"]["precision"], "bf16") << e.path();
    ++runs;
  }
  EXPECT_EQ(runs, 2);  // swa-small and swa-small-nope, one seed
  const std::string report = slurp(out / "report.md");
  EXPECT_NE(report.find("`--precision bf16`"), std::string::npos);
  // ... and which bf16 product path ran, which sets its rounding (AMX tiles or vdpbf16ps).
  EXPECT_EQ(f["run"]["bf16_amx"], hlm::ops::bf16_pairs::amx_active());
  EXPECT_NE(report.find(hlm::ops::bf16_pairs::amx_active() ? "ran on AMX tiles" : "ran with `vdpbf16ps`"),
            std::string::npos);
  // The folder keeps its precision: an fp32 rerun into it is refused.
  expect_error(run("reproduce --budget tiny --only d --out " + out.string()), "field 'precision' is \"bf16\"");
}

TEST(Reproduce, ContinuesAfterAKillMidRun) {
  const fs::path out = tmp_dir() / "killed";
  const std::string log = (tmp_dir() / "killed.log").string();
  const std::string cmd = "exec " + std::string(HLM_BINARY) + " reproduce --budget tiny --only b --jobs 2 --out " +
                          out.string() + " >" + log + " 2>&1";
  pid_t pid = 0;
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  // Wait for the first checkpoint of any run, then kill the study (not its children: they get SIGINT from
  // the kernel when their parent dies, save and exit).
  bool checkpointed = false;
  for (int i = 0; i < 1200 && !checkpointed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (fs::exists(out / "runs"))
      for (auto& e : fs::directory_iterator(out / "runs")) checkpointed |= fs::exists(e.path() / "latest");
  }
  ASSERT_TRUE(checkpointed) << slurp(log);
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  EXPECT_FALSE(fs::exists(out / "findings.json"));
  std::this_thread::sleep_for(std::chrono::seconds(2));  // the orphaned trainings save and exit
  Result r = run("reproduce --budget tiny --only b --jobs 2 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  bool resumed = false;
  for (auto& e : fs::directory_iterator(out / "runs"))
    resumed |= slurp(e.path() / "train.log").find("resumed from") != std::string::npos;
  EXPECT_TRUE(resumed) << "no run continued from a checkpoint";
  const json f = read_json(out / "findings.json");
  ASSERT_EQ(f["findings"].size(), 1u);
  EXPECT_EQ(f["findings"][0]["id"], "b");
  // The killed sitting is on record with its machine but without its time; the report says so.
  const json& sittings = f["run"]["sittings"];
  ASSERT_EQ(sittings.size(), 2u) << sittings.dump();
  EXPECT_TRUE(sittings[0]["seconds"].is_null()) << sittings.dump();
  EXPECT_EQ(sittings[0]["cpu"], sittings[1]["cpu"]);
  EXPECT_GT(sittings[1]["tasks_done"].get<int>(), 0);
  EXPECT_NE(slurp(out / "report.md").find("(the time of 1 sitting not recorded: stopped by a kill)"), std::string::npos);
  EXPECT_EQ(f["run"]["tasks_failed"], 0);
}

// --dry-run plans the study and lists it (runs with their size, FLOPs and passes over the data, tasks by kind, what
// LongPPL can read), writing nothing into the folder; --measure times each model with a short `hybridlm bench`.
// The medium budget, never run on the 2-core machine, is planned in full here (on the tiny budget's corpus).
TEST(Reproduce, DryRunListsRunsTasksAndDataAndWritesNothing) {
  const fs::path out = tmp_dir() / "dry";
  Result r = run("reproduce --budget tiny --dry-run --json --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(out));
  const json d = json::parse(r.out);
  // The evaluator, a's six hybrids (b shares them), and c's three and d's two runs of twice the steps (c's small
  // window is d's RoPE run).
  ASSERT_EQ(d["runs"].size(), 11u);
  EXPECT_EQ(d["total"]["runs"], 11);
  std::map<std::string, json> by_name;
  for (auto& x : d["runs"]) {
    by_name[x["name"]] = x;
    EXPECT_EQ(x["on_disk"], "new");
    EXPECT_DOUBLE_EQ(x["tokens"].get<double>(), x["steps"].get<double>() * 4 * 384) << x.dump();  // batch x seq_len
    EXPECT_GT(x["params"].get<double>(), 1e4);
  }
  EXPECT_EQ(by_name["evaluator"]["steps"], 120);
  EXPECT_EQ(by_name["swa-small-x2-s1"]["steps"], 120);
  EXPECT_EQ(by_name["swa-large-s1"]["window"], 192);
  EXPECT_EQ(by_name["swa-large-x2-s1"]["steps"], 120);
  EXPECT_EQ(by_name["swa-large-x2-s1"]["window"], 192);
  // The same model trained twice the tokens: twice the FLOPs and passes.
  EXPECT_DOUBLE_EQ(by_name["swa-small-x2-s1"]["train_flops"].get<double>(),
                   2 * by_name["swa-small-s1"]["train_flops"].get<double>());
  EXPECT_DOUBLE_EQ(by_name["swa-small-x2-s1"]["text_passes"].get<double>(),
                   2 * by_name["swa-small-s1"]["text_passes"].get<double>());
  // 6 hybrids x 3 checkpoints of LongPPL; receptive field on b's 4; retrieval heads on c's 3 and d's NoPE run (its
  // RoPE run is c's small window); NIAH and RULER on d's 2; 11 trainings.
  EXPECT_EQ(d["tasks"]["eval longppl"], json({18, 0}));
  EXPECT_EQ(d["tasks"]["probe receptive-field"], json({4, 0}));
  EXPECT_EQ(d["tasks"]["probe retrieval-heads"], json({4, 0}));
  EXPECT_EQ(d["tasks"]["eval niah"], json({2, 0}));
  EXPECT_EQ(d["tasks"]["eval ruler"], json({2, 0}));
  EXPECT_EQ(d["tasks"]["train"], json({11, 0}));
  EXPECT_EQ(d["total"]["tasks"], 41);
  // LongPPL reads what the validation split has, at most the budget's 2 documents.
  EXPECT_GE(d["data"]["longppl_docs"].get<int>(), 1);
  EXPECT_LE(d["data"]["longppl_docs"].get<int>(), 2);
  EXPECT_TRUE(d["measured"].is_null());

  // medium, on the tiny corpus: 31 runs of 10000 steps (c's, d's and the evaluator 20000), every task planned.
  const fs::path plan = tmp_dir() / "plan_medium_on_tiny_data.json";
  json j = read_json(fs::path(HLM_SOURCE_DIR) / "studies" / "paper.json");
  j["budgets"]["medium"]["data"] = (fs::path(HLM_SOURCE_DIR) / "docs").string();
  j["budgets"]["medium"]["tokenizer"] = j["budgets"]["tiny"]["tokenizer"];
  std::ofstream(plan) << j.dump();
  Result m = run("reproduce " + plan.string() + " --budget medium --dry-run --out " + out.string());
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_FALSE(fs::exists(out));
  for (const char* s : {"budget medium, findings a,b,c,d, 3 seed(s)", "swa-small-nope-x2-s3", "180 eval longppl",
                        "total: 31 runs", "note: runs see the training text"})
    EXPECT_NE(m.out.find(s), std::string::npos) << s << "\n" << m.out;

  // --first-seed: a sample of fresh seeds (101, 102) names and seeds every run by its seed; the evaluator stays seed 1.
  Result fs101 = run("reproduce --budget tiny --only a,d --seeds 2 --first-seed 101 --dry-run --json --out " +
                     out.string());
  ASSERT_EQ(fs101.code, 0) << fs101.err;
  const json fd = json::parse(fs101.out);
  EXPECT_EQ(fd["first_seed"], 101);
  std::map<std::string, int> seed_of;
  for (auto& x : fd["runs"]) seed_of[x["name"]] = x["seed"].get<int>();
  EXPECT_EQ(seed_of["evaluator"], 1);
  for (const char* name : {"gdn-s101", "swa-large-s101", "swa-small-x2-s101", "swa-small-nope-x2-s101"})
    EXPECT_EQ(seed_of[name], 101) << name;
  for (const char* name : {"gdn-s102", "swa-small-nope-x2-s102"}) EXPECT_EQ(seed_of[name], 102) << name;
  EXPECT_EQ(seed_of.count("gdn-s1"), 0u);
  EXPECT_EQ(seed_of.size(), 1u + 2 * (6 + 2));
  expect_error(run("reproduce --budget tiny --first-seed 0 --dry-run --out " + out.string()), "--first-seed");

  // --measure: a training rate per model and the training time it gives.
  Result t = run("reproduce --budget tiny --only d --jobs 2 --dry-run --measure --json --out " + out.string());
  ASSERT_EQ(t.code, 0) << t.err;
  const json md = json::parse(t.out);
  ASSERT_EQ(md["runs"].size(), 2u);
  double seconds = 0, longest = 0;
  for (auto& x : md["runs"]) {
    EXPECT_GT(x["tokens_per_s"].get<double>(), 0) << x.dump();
    EXPECT_NEAR(x["train_seconds"].get<double>(), x["tokens"].get<double>() / x["tokens_per_s"].get<double>(), 1e-6);
    seconds += x["train_seconds"].get<double>();
    longest = std::max(longest, x["train_seconds"].get<double>());
  }
  EXPECT_NEAR(md["measured"]["train_seconds_left"].get<double>(), seconds, 1e-6 * seconds);
  // Two runs on two children: the wall time is the longer run's.
  EXPECT_NEAR(md["measured"]["wall_seconds_left"].get<double>(), longest, 1e-6 * longest);
  EXPECT_FALSE(fs::exists(out));
  expect_error(run("reproduce --budget tiny --measure --out " + out.string()), "--measure requires --dry-run");
}
