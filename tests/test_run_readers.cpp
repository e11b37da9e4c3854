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
#include "train/run_folder.h"

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
