// Reliability of the readers of a run folder (docs/reliability.md): only regular files are read, a JSON number too
// large for a double is an error naming the file, `latest` stays inside its run, checkpoints are listed by step.
// Links only the readers of untrusted files, so it is also part of the sanitized reader tests.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_harness.h"
#include "core/error.h"
#include "core/file_io.h"
#include "train/checkpoint_reader.h"
#include "train/metrics_log.h"
#include "train/run_folder.h"
#include "train/run_json.h"
#include "train/run_protocol.h"

namespace fs = std::filesystem;
using hlm::testing::error_of;

TEST(Reliability, ReadTextFileRefusesWhatIsNotARegularFile) {
  const hlm::testing::ScratchDir scratch("hlm_rel_read_");
  const fs::path& d = scratch.path;
  EXPECT_NE(error_of([&] { hlm::read_text_file(d.string(), "config file"); }).find("is a directory"), std::string::npos);
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { hlm::read_text_file(fifo.string()); }).find("a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { hlm::read_text_file("/dev/zero"); }).find("character device"), std::string::npos);
  std::ofstream(d / "big") << std::string(100, 'z');
  EXPECT_NE(error_of([&] { hlm::read_text_file((d / "big").string(), "prompt", 10); }).find("over the limit"),
            std::string::npos);
  EXPECT_EQ(hlm::read_text_file((d / "big").string()).size(), 100u);
}

// Found by fuzz_run_json / fuzz_trainer_state: a number too large for a double is nlohmann's out_of_range, not a
// parse_error; it escaped the readers as an error naming no file.
TEST(Reliability, JsonNumberOverflowIsAnErrorNamingTheFile) {
  const hlm::testing::ScratchDir scratch("hlm_rel_overflow_");
  const fs::path& d = scratch.path;
  std::ofstream(d / "trainer_state.json") << "{\"step\": 3333333333333333355e5333333}";
  EXPECT_NE(error_of([&] { hlm::load_trainer_state(d.string()); }).find("trainer_state.json: malformed JSON"),
            std::string::npos);
}

TEST(Reliability, LatestMustNameACheckpointOfItsOwnRun) {
  const hlm::testing::ScratchDir scratch("hlm_rel_latest_");
  const fs::path& d = scratch.path;
  fs::create_directories(d / "other" / "checkpoints" / "step_00000001");
  std::ofstream(d / "other" / "checkpoints" / "step_00000001" / "model.safetensors") << "x";
  fs::create_directories(d / "run" / "checkpoints");
  for (const char* bad : {"../../other/checkpoints/step_00000001", "/etc", "step_1/../../x", ""}) {
    hlm::write_file_atomic((d / "run" / "latest").string(), std::string(bad) + "\n");
    const std::string err = error_of([&] { hlm::resolve_checkpoint((d / "run").string()); });
    EXPECT_NE(err.find("latest"), std::string::npos) << bad << ": " << err;
    EXPECT_NE(err.find("not a checkpoint of this run folder"), std::string::npos) << bad << ": " << err;
  }
}

// Every reader lists a run's checkpoints the same way: complete ones only (not the .tmp / .old folders of a
// killed write, not stray files), in step order also past 8 digits, where names stop sorting by step.
TEST(Reliability, CheckpointListingSkipsUnfinishedWritesAndSortsBySteps) {
  namespace fs = std::filesystem;
  hlm::testing::ScratchDir d("hlm_list_ckpt_");
  const fs::path run = d.path / "run";
  EXPECT_TRUE(hlm::run_folder::list_checkpoints(run).empty());
  for (const char* n : {"step_00000150", "step_00000300.tmp", "step_00000020.old", "step_123456789", "step_00000003",
                        "notes"})
    fs::create_directories(hlm::run_folder::checkpoints(run) / n);
  std::ofstream(hlm::run_folder::checkpoints(run) / "step_00000999") << "a file, not a checkpoint";
  std::vector<long> steps;
  for (auto& [step, dir] : hlm::run_folder::list_checkpoints(run)) {
    steps.push_back(step);
    EXPECT_EQ(dir.filename().string().substr(0, 5), "step_");
  }
  EXPECT_EQ(steps, (std::vector<long>{3, 150, 123456789}));
  EXPECT_EQ(hlm::run_folder::step_name(150), "step_00000150");
  EXPECT_EQ(hlm::run_folder::parse_step_name("step_00000150"), 150);
  EXPECT_EQ(hlm::run_folder::parse_step_name("step_00000150.tmp"), -1);
}

// run.json's protocol: written and read back whole; every field type- and range-checked with the file and field
// named; on resume a flag that changes what a row measures is refused, one that changes cadence or retention is
// taken and recorded with its step.
TEST(Reliability, RunProtocolRoundTripsAndResumeRefusesOrRecordsEachFlag) {
  hlm::RunProtocol p;
  p.eval_every = 5;
  p.eval_batches = 1;
  p.ckpt_every = 5;
  p.keep_checkpoints = 1;
  p.evals = hlm::ExtraEvalSettings::for_run({"longppl", "niah"}, 64, 5);
  EXPECT_EQ(p.evals.longppl_trunc_len, 16);
  EXPECT_EQ(p.evals.longppl_block, 8);
  EXPECT_EQ(p.evals.niah_lengths, std::vector<hlm::i64>{64});
  const hlm::RunProtocol q = hlm::RunProtocol::from_json(p.to_json(), "run.json");
  EXPECT_EQ(q.to_json(), p.to_json());
  EXPECT_TRUE(q.evals == p.evals);

  auto bad = [&](const std::string& key, const nlohmann::json& v, const std::string& needle) {
    nlohmann::json j = p.to_json();
    nlohmann::json::json_pointer ptr(key);
    if (v.is_null()) j.at(ptr.parent_pointer()).erase(ptr.back());
    else j[ptr] = v;
    const std::string err = hlm::testing::error_of([&] { hlm::RunProtocol::from_json(j, "r/run.json"); });
    EXPECT_NE(err.find("r/run.json: field 'protocol"), std::string::npos) << key << ": " << err;
    EXPECT_NE(err.find(needle), std::string::npos) << key << ": " << err;
  };
  bad("/eval_batches", 0, "'eval_batches' = 0 is outside");
  bad("/eval_every", "5", "'eval_every' must be an integer");
  bad("/ckpt_every", nullptr, "'ckpt_every' is missing");
  bad("/keep_checkpoints", -1, "outside");
  bad("/evals/niah/depths", {0.5, 2}, "not a depth in [0, 1]");
  bad("/evals/longppl/block", 0, "'block' = 0");
  bad("/evals/ruler", nlohmann::json::object(), "unknown field 'ruler'");
  bad("/changes", {{{"keep_checkpoints", 2}}}, "integer 'step'");
  bad("/typo", 1, "unknown field 'typo'");

  // Resume: --eval-batches and --eval must agree with the run; cadence and retention are recorded.
  hlm::RunProtocol flags = p;
  flags.eval_batches = 8;
  hlm::ProtocolFlagsGiven given;
  EXPECT_EQ(hlm::resume_protocol(p, flags, given, 10, "r/run.json").eval_batches, 1);  // not given: the run's
  given.eval_batches = true;
  EXPECT_NE(hlm::testing::error_of([&] { hlm::resume_protocol(p, flags, given, 10, "r/run.json"); })
                .find("--eval-batches 8 conflicts with the run's eval_batches = 1 (r/run.json)"),
            std::string::npos);
  flags = p;
  flags.evals = hlm::ExtraEvalSettings::for_run({"longppl"}, 64, 5);
  given = {};
  given.evals = true;
  EXPECT_NE(hlm::testing::error_of([&] { hlm::resume_protocol(p, flags, given, 10, "r/run.json"); })
                .find("--eval longppl conflicts with the run's extra evaluations (longppl,niah"),
            std::string::npos);
  flags = p;
  flags.keep_checkpoints = 4;
  flags.eval_every = 7;
  flags.ckpt_every = 5;  // given with the run's own value: no change recorded
  given = {};
  given.keep_checkpoints = given.eval_every = given.ckpt_every = true;
  const hlm::RunProtocol r = hlm::resume_protocol(p, flags, given, 10, "r/run.json");
  EXPECT_EQ(r.keep_checkpoints, 4);
  EXPECT_EQ(r.eval_every, 7);
  EXPECT_EQ(r.changes, nlohmann::json::parse(R"([{"step": 10, "eval_every": 7, "keep_checkpoints": 4}])"));
  // run.json's reader checks the protocol too.
  const hlm::testing::ScratchDir scratch("hlm_rel_protocol_");
  nlohmann::json run = {{"protocol", p.to_json()}};
  run["protocol"]["eval_batches"] = "8";
  std::ofstream(scratch.path / "run.json") << run.dump();
  EXPECT_NE(hlm::testing::error_of([&] { hlm::parse_run_json((scratch.path / "run.json").string()); })
                .find("field 'protocol': field 'eval_batches' must be an integer"),
            std::string::npos);
}

// A resumed run first drops the rows its stopped process logged after the checkpoint, and a row cut short by a
// kill; a malformed row before the end is an error naming the file and line.
TEST(Reliability, MetricsAreKeptThroughTheCheckpointStep) {
  const hlm::testing::ScratchDir scratch("hlm_rel_metrics_");
  const std::string path = (scratch.path / "metrics.jsonl").string();
  const std::string through_10 = "{\"step\":0,\"val_loss\":5.5}\n{\"step\":10,\"loss\":4.25}\n"
                                 "{\"step\":10,\"val_loss\":4.5}\n";
  std::ofstream(path) << through_10 << "{\"step\":11,\"loss\":4.0}\n{\"step\":12,\"lo";
  hlm::keep_metrics_through(path, 10);
  EXPECT_EQ(hlm::read_text_file(path), through_10);
  hlm::keep_metrics_through(path, 10);  // nothing to drop: unchanged
  EXPECT_EQ(hlm::read_text_file(path), through_10);
  hlm::keep_metrics_through((scratch.path / "none.jsonl").string(), 3);  // a missing file stays missing
  EXPECT_FALSE(fs::exists(scratch.path / "none.jsonl"));
  std::ofstream(path) << "{\"step\":1}\nnot json\n{\"step\":2}\n";
  EXPECT_NE(hlm::testing::error_of([&] { hlm::keep_metrics_through(path, 1); }).find("metrics.jsonl: line 2 is not"),
            std::string::npos);
}
