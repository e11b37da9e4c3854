// Reliability (docs/reliability.md): checked writes (a full disk is an error naming the file, never a lost
// run), one trainer per run folder, `latest` confined to its run, pruning by step number, non-regular files
// refused, every flag range-checked at parse time, memory estimated before work, non-finite weights refused.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_harness.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/memory_estimate.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/run_folder.h"
#include "train/run_lock.h"

namespace fs = std::filesystem;
using hlm::testing::cli_tmp_root;
using hlm::testing::error_of;
using hlm::testing::CliResult;
using hlm::testing::expect_cli_error;
using hlm::testing::run_cli;

namespace {

fs::path scratch(const std::string& name) {
  static const hlm::testing::ScratchDir root("hlm_rel_");
  const fs::path d = root.path / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// RLIMIT_FSIZE makes writes past `bytes` fail with EFBIG (SIGXFSZ ignored): a portable full disk.
struct FileSizeLimit {
  rlimit old{};
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit r = old;
    r.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() { ::setrlimit(RLIMIT_FSIZE, &old); }
};

std::string train_flags(const fs::path& out) {
  return "train " + hlm::testing::tiny_model_flags() + hlm::testing::tiny_corpus_flags() +
         "--seq-len 32 --batch 2 --eval-batches 1 --quiet --out " + out.string() + " ";
}

}  // namespace

TEST(Reliability, AtomicWriteFailureNamesTheFileAndKeepsTheOldContents) {
  const fs::path d = scratch("write");
  const std::string f = (d / "state.json").string();
  hlm::write_file_atomic(f, "old\n");
  std::string err;
  {
    FileSizeLimit limit(16);
    err = error_of([&] { hlm::write_file_atomic(f, std::string(4096, 'x')); });
  }
  EXPECT_NE(err.find(f), std::string::npos) << err;
  EXPECT_NE(err.find("write failed"), std::string::npos) << err;
  EXPECT_EQ(hlm::testing::slurp(f), "old\n");
  EXPECT_FALSE(fs::exists(f + ".tmp"));
  {
    FileSizeLimit limit(16);
    err = error_of([&] { hlm::append_file((d / "metrics.jsonl").string(), std::string(100, 'y')); });
  }
  EXPECT_NE(err.find("metrics.jsonl"), std::string::npos) << err;
}

TEST(Reliability, PruneKeepsTheHighestStepsAndTheLatest) {
  const fs::path d = scratch("prune");
  // 9-digit steps sort before 8-digit ones by name: pruning must go by number.
  for (const char* s : {"step_00000002", "step_00000010", "step_99999999", "step_100000000"})
    fs::create_directories(d / "checkpoints" / s);
  fs::create_directories(d / "checkpoints" / "step_00000011.tmp");
  hlm::write_file_atomic((d / "latest").string(), "step_00000010\n");
  hlm::prune_checkpoints(d.string(), 2);
  EXPECT_TRUE(fs::exists(d / "checkpoints" / "step_00000010"));   // latest, whatever its number
  EXPECT_TRUE(fs::exists(d / "checkpoints" / "step_100000000"));  // the highest
  EXPECT_FALSE(fs::exists(d / "checkpoints" / "step_99999999"));
  EXPECT_FALSE(fs::exists(d / "checkpoints" / "step_00000002"));
  EXPECT_FALSE(fs::exists(d / "checkpoints" / "step_00000011.tmp"));  // a killed write's left-over
  hlm::prune_checkpoints(d.string(), 1);
  EXPECT_TRUE(fs::exists(d / "checkpoints" / "step_00000010"));
  EXPECT_FALSE(fs::exists(d / "checkpoints" / "step_100000000"));
}

TEST(Reliability, OneLockPerRunFolderNamingTheHolder) {
  const fs::path d = scratch("lock");
  {
    hlm::RunLock a(d.string());
    const std::string err = error_of([&] { hlm::RunLock b(d.string()); });
    EXPECT_NE(err.find("pid " + std::to_string(::getpid())), std::string::npos) << err;
  }
  // Released (the holder ended): the next one takes it, as it takes a lock file left by a dead process.
  hlm::write_file_atomic((d / "lock").string(), "999999999\n");
  EXPECT_EQ(error_of([&] { hlm::RunLock c(d.string()); }), "");
  // A trainer is refused while this process holds the folder.
  hlm::RunLock held(d.string());
  expect_cli_error(run_cli(train_flags(d) + "--steps 1"), "pid " + std::to_string(::getpid()));
}

TEST(Reliability, LayerTypeOptionsAreCheckedOnlyForTypesThePatternUses) {
  EXPECT_NO_THROW(hlm::resolve_config("full", "", {"head_dim=48"}));
  EXPECT_NO_THROW(hlm::resolve_config("swa128-nope", "", {"d_model=48", "n_heads=1", "n_kv_heads=1", "head_dim=48"}));
  const std::string err = error_of([] { hlm::resolve_config("mamba2", "", {"layer_types.M.head_dim=48"}); });
  EXPECT_NE(err.find("Mamba-2"), std::string::npos) << err;
  // n_heads > d_model leaves head_dim = d_model / n_heads = 0.
  EXPECT_NE(error_of([] { hlm::resolve_config("", "", {"d_model=64", "n_heads=128", "n_kv_heads=128"}); })
                .find("head_dim"),
            std::string::npos);
}

TEST(Reliability, MemoryEstimateCountsWeightsOptimizerAndActivations) {
  const hlm::ModelConfig cfg = hlm::resolve_config("swa128-nope", "", {});
  hlm::MemoryUse use;
  use.training = true;
  use.batch = 8;
  use.seq_len = 1024;
  const hlm::MemoryEstimate e = hlm::estimate_memory(cfg, use);
  // ~8.9M parameters: weights, gradients, and the two AdamW moments, 4 bytes each.
  EXPECT_NEAR(e.weights / 4, 8.9e6, 0.3e6);
  EXPECT_DOUBLE_EQ(e.grads, e.weights);
  EXPECT_DOUBLE_EQ(e.optimizer, 2 * e.weights);
  EXPECT_GT(e.activations, 8.0 * 1024 * 256 * 8 * 4);  // at least a few [B*T, D] buffers per layer
  EXPECT_EQ(e.caches, 0);
  use.training = false;
  use.decode_rows = 1;
  use.decode_context = 4096;
  const hlm::MemoryEstimate g = hlm::estimate_memory(cfg, use);
  EXPECT_EQ(g.optimizer, 0);
  EXPECT_GT(g.caches, 2.0 * 4096 * 256 * 4);  // the full-attention layers' K and V
  const hlm::ModelConfig huge = hlm::resolve_config("swa128-nope", "", {"n_layers=4096", "d_model=1024"});
  EXPECT_GT(hlm::estimate_memory(huge, hlm::MemoryUse{}).total(), 100e9);
}

// load_model refuses a config.json whose estimated weights are over twice what model.safetensors holds: the
// estimate must be the model's parameters (plus the registry's alignment padding, under 1%), or a checkpoint that
// fits could be refused.
TEST(Reliability, MemoryEstimateWeightsAreTheModelsParameters) {
  for (const std::string& preset : hlm::preset_names()) {
    SCOPED_TRACE(preset);
    const hlm::ModelConfig cfg = hlm::resolve_config(preset, "", {"n_layers=5", "d_model=64", "d_ff=96", "vocab_size=300"});
    const hlm::Model model(cfg);
    const double weights = hlm::estimate_memory(cfg, hlm::MemoryUse{}).weights, params = 4.0 * model.num_params();
    EXPECT_GE(weights, params);
    EXPECT_LE(weights, 1.01 * params);
  }
}

// Config fields have upper bounds far past any published model: a typo is refused naming the field and the bound
// before any estimate or allocation.
TEST(Reliability, ConfigFieldsHaveUpperBounds) {
  struct Case {
    std::string set, field;
  };
  for (const Case& c : std::vector<Case>{{"n_layers=4097", "n_layers"}, {"d_model=131073", "d_model"},
                                        {"n_heads=16385", "n_heads"}, {"d_ff=1048577", "d_ff"},
                                        {"vocab_size=16777217", "vocab_size"}, {"head_dim=16385", "head_dim"},
                                        {"mamba_expand=65", "mamba_expand"}, {"layer_types.F.n_heads=16385", "n_heads"}}) {
    SCOPED_TRACE(c.set);
    const std::string err = error_of([&] { hlm::resolve_config("full", "", {c.set}); });
    EXPECT_NE(err.find("field '" + c.field + "' must be <="), std::string::npos) << err;
  }
  EXPECT_NO_THROW(hlm::resolve_config("full", "", {"n_layers=4096", "d_model=131072", "vocab_size=16777216"}));
  EXPECT_NE(error_of([] { hlm::resolve_config("", "", {"pattern=" + std::string(5000, 'F')}); }).find("5000 letters"),
            std::string::npos);
}

// Every flag is range-checked when it is parsed: the error names the flag; nothing runs.
TEST(Reliability, BadFlagValuesAreRefusedNamingTheFlag) {
  const std::string t = "train " + hlm::testing::tiny_model_flags() + hlm::testing::tiny_corpus_flags();
  const fs::path run = cli_tmp_root() / "rel_flags_run";  // never created: every case fails before work
  struct Case {
    std::string args, flag;
  };
  const std::vector<Case> cases = {
      {t + "--log-every 0", "--log-every"},
      {t + "--lr -1", "--lr"},
      {t + "--lr nan", "--lr"},
      {t + "--grad-clip -1", "--grad-clip"},
      {t + "--decay-fraction 2", "--decay-fraction"},
      {t + "--seed -1", "--seed"},
      {t + "--steps 0", "--steps"},
      {t + "--batch 0", "--batch"},
      {t + "--warmup -1", "--warmup"},
      {t + "--eval-batches 0", "--eval-batches"},
      {t + "--mix-niah 1.5", "--mix-niah"},
      {t + "--schedule linear", "--schedule"},
      {t + "--threads -3", "--threads"},
      {t + "--max-memory 0", "--max-memory"},
      {"bench --preset full --steps 0", "--steps"},
      {"bench --preset full --steps -1", "--steps"},
      {"bench --preset full --warmup -1", "--warmup"},
      {"eval ppl --ckpt " + run.string() + " --tokens-per-batch 0", "--tokens-per-batch"},
      {"eval ppl --ckpt " + run.string() + " --max-tokens 0", "--max-tokens"},
      {"eval ppl --ckpt " + run.string() + " --seq-len 0", "--seq-len"},
      {"eval ppl --ckpt " + run.string() + " --seq-len 1", "--seq-len"},
      {"eval ppl --ckpt " + run.string() + " --buckets 0", "--buckets"},
      {"eval longppl --ckpt " + run.string() + " --docs 0", "--docs"},
      {"eval longppl --ckpt " + run.string() + " --trunc-len 0", "--trunc-len"},
      {"eval ruler --ckpt " + run.string() + " --samples 0", "--samples"},
      {"probe receptive-field --ckpt " + run.string() + " --span 4 --seq-len 0", "--seq-len"},
      {"probe receptive-field --ckpt " + run.string() + " --span 4 --lengths 64,0", "--lengths"},
      {"probe receptive-field --ckpt " + run.string() + " --span 0", "--span"},
      {"probe retrieval-heads --ckpt " + run.string() + " --lengths 1", "--lengths"},
      {"probe retrieval-heads --ckpt " + run.string() + " --samples 0", "--samples"},
      {"eval niah --ckpt " + run.string() + " --depths 0,nan", "--depths"},
      {"eval niah --ckpt " + run.string() + " --depths 1.5", "--depths"},
      {"eval niah --ckpt " + run.string() + " --samples 0", "--samples"},
      {"eval longppl --ckpt " + run.string() + " --doc-len 0", "--doc-len"},
      {"generate --ckpt " + run.string() + " --temperature nan", "--temperature"},
      {"generate --ckpt " + run.string() + " --top-k -1", "--top-k"},
      {"generate --ckpt " + run.string() + " --top-p 2", "--top-p"},
      {"generate --ckpt " + run.string() + " --seed -1", "--seed"},
      {"recall --steps 0", "--steps"},
      {"recall --lr 0.001,-1", "--lr"},
      {"probe attention-map --ckpt " + run.string() + " --prompt x --layer -1", "--layer"},
      {"tokenizer train --data x --out y --vocab-size 10", "--vocab-size"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    expect_cli_error(run_cli(c.args), c.flag);
  }
  EXPECT_FALSE(fs::exists(run));
}

// Bad inputs that pass the flag checks: clean refusals naming the file, field or size, before any work.
TEST(Reliability, BadInputsAreRefusedBeforeWork) {
  const std::string t = "train " + hlm::testing::tiny_model_flags() + hlm::testing::tiny_corpus_flags();
  const fs::path d = scratch("inputs");
  ::mkfifo((d / "fifo").c_str(), 0644);
  struct Case {
    std::string args, needle;
  };
  const std::vector<Case> cases = {
      // Past the config's bounds: refused naming the field and its bound, before any estimate.
      {t + "--set n_layers=100000", "field 'n_layers' must be <= 4096"},
      {"train --preset swa128-nope --set d_model=4194304 " + hlm::testing::tiny_corpus_flags(), "'d_model' must be <="},
      // Within the bounds, over any machine: 4096 layers of d_model 65536, ~200G parameters (d_model 65536 alone,
      // ~40 GB, fitted the 128 GB of a test machine, which then started training it).
      {"train --preset swa128-nope --set n_layers=4096 --set d_model=65536 " + hlm::testing::tiny_corpus_flags(),
       "needs an estimated"},
      {t + "--max-memory 0.001", "over --max-memory"},
      {"bench --preset full --batch 1000000 --seq-len 100000", "needs an estimated"},
      {"train --config " + d.string() + " " + hlm::testing::tiny_corpus_flags(), "is a directory"},
      {"train --config " + (d / "fifo").string() + " " + hlm::testing::tiny_corpus_flags(), "a FIFO"},
      {"train --preset full --set n_heads=1000000 " + hlm::testing::tiny_corpus_flags(), "'n_heads' must be <="},
      {"train --preset full --set n_heads=16384 --set n_kv_heads=16384 --set head_dim=4096 " +
           hlm::testing::tiny_corpus_flags(),
       "needs an estimated"},
      {"train --set d_model=64 --set n_heads=128 --set n_kv_heads=128 " + hlm::testing::tiny_corpus_flags(),
       "head_dim"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    expect_cli_error(run_cli(c.args, "timeout 60 "), c.needle);
  }
}

// The rows of metrics.jsonl without the fields that time the process (they differ between any two runs).
std::vector<std::string> untimed_rows(const fs::path& metrics) {
  std::vector<std::string> rows;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    nlohmann::json row = nlohmann::json::parse(line);
    for (const char* k : {"tokens_per_s", "step_ms", "elapsed_s"}) row.erase(k);
    rows.push_back(row.dump());  // shortest round-trip decimals: equal strings are equal doubles
  }
  return rows;
}

std::vector<long> checkpoint_steps(const fs::path& run) {
  std::vector<long> steps;
  for (const auto& [step, dir] : hlm::run_folder::list_checkpoints(run)) steps.push_back(step);
  return steps;
}

// A resumed run is the same run: resumed with no flags but --out --resume --steps, it validates at the run's
// cadence on the run's batches with the run's extra evaluation, checkpoints at the run's cadence and keeps as many;
// its metrics.jsonl equals an uninterrupted run's row for row and bit for bit (timings aside), also after a kill
// left rows past the checkpoint and a torn last row. A flag that changes what a row measures is refused; one that
// changes retention is recorded in run.json with its step. ~4 s.
TEST(Reliability, AResumedRunKeepsItsProtocolAndItsMetricsRowForRow) {
  const std::string protocol = "--eval-every 5 --ckpt-every 5 --keep-checkpoints 1 --eval longppl --schedule constant "
                               "--warmup 2 ";  // a constant schedule: 10 + 10 steps follow the same rates as 20
  const fs::path straight = cli_tmp_root() / "rel_protocol_straight", split = cli_tmp_root() / "rel_protocol_split",
                 killed = cli_tmp_root() / "rel_protocol_killed";
  for (const auto& d : {straight, split, killed}) fs::remove_all(d);
  CliResult r = run_cli(train_flags(straight) + protocol + "--steps 20");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_cli(train_flags(split) + protocol + "--steps 10");
  ASSERT_EQ(r.code, 0) << r.err;
  fs::copy(split, killed, fs::copy_options::recursive);
  r = run_cli("train --out " + split.string() + " --resume --steps 20");
  ASSERT_EQ(r.code, 0) << r.err;

  const std::vector<std::string> want = untimed_rows(straight / "metrics.jsonl");
  ASSERT_EQ(want.size(), 20u + 5u);  // a row per step, a validation at 0, 5, 10, 15, 20
  EXPECT_NE(want.back().find("\"longppl\""), std::string::npos) << want.back();
  EXPECT_EQ(untimed_rows(split / "metrics.jsonl"), want);
  EXPECT_EQ(checkpoint_steps(split), std::vector<long>{20});
  EXPECT_EQ(checkpoint_steps(straight), std::vector<long>{20});

  // A kill after step 12 of the second part: its rows 11-12 and a torn row are in the file, the checkpoint is 10.
  {
    std::ofstream m(killed / "metrics.jsonl", std::ios::app);
    m << "{\"step\":11,\"loss\":9.0}\n{\"step\":12,\"loss\":9.0}\n{\"step\":13,\"lo";
  }
  r = run_cli("train --out " + killed.string() + " --resume --steps 20");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(untimed_rows(killed / "metrics.jsonl"), want);

  // What a row measures cannot change on resume; retention can, recorded with the step it took effect.
  expect_cli_error(run_cli("train --out " + split.string() + " --resume --steps 25 --eval-batches 2"),
                   "--eval-batches 2 conflicts with the run's eval_batches = 1");
  expect_cli_error(run_cli("train --out " + split.string() + " --resume --steps 25 --eval niah"),
                   "--eval niah conflicts with the run's extra evaluations (longppl");
  r = run_cli("train --out " + split.string() + " --resume --steps 25 --keep-checkpoints 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(checkpoint_steps(split), (std::vector<long>{20, 25}));
  const nlohmann::json run = nlohmann::json::parse(hlm::testing::slurp(split / "run.json"));
  EXPECT_EQ(run.at("protocol").at("keep_checkpoints"), 2);
  EXPECT_EQ(run["protocol"].at("eval_batches"), 1);
  EXPECT_EQ(run["protocol"].at("changes"), nlohmann::json::parse(R"([{"step": 20, "keep_checkpoints": 2}])"));
}

// A run folder is continued (--resume, with the run's settings) or replaced (--overwrite) only when asked; a full
// disk during a checkpoint is an error naming the file and keeps the previous checkpoint; non-finite weights
// and non-regular prompt files are refused. ~3 s.
TEST(Reliability, RunFoldersAreOwnedAndCheckpointsSurviveAFullDisk) {
  const fs::path out = cli_tmp_root() / "rel_run";
  fs::remove_all(out);
  CliResult r = run_cli(train_flags(out) + "--steps 2 --ckpt-every 1");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json run_json = nlohmann::json::parse(hlm::testing::slurp(out / "run.json"));
  EXPECT_TRUE(fs::path(run_json.at("data").get<std::string>()).is_absolute()) << run_json.dump();

  expect_cli_error(run_cli(train_flags(out) + "--steps 2"), "already holds a run");
  expect_cli_error(run_cli("train --out " + out.string() + " --resume --lr 0.5 --quiet"), "--lr 0.5 conflicts");
  expect_cli_error(run_cli("train --out " + out.string() + " --resume --steps 1 --quiet"), "below the run's");
  expect_cli_error(run_cli("train --out " + out.string() + " --resume --preset full --quiet"), "--resume");
  expect_cli_error(run_cli("train --out " + out.string() + " --resume --overwrite --quiet"), "--overwrite");
  r = run_cli("train --out " + out.string() + " --resume --json --quiet --threads 1");  // the run's own 2 steps
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"steps\":2"), std::string::npos) << r.out;

  // eval ppl --max-tokens scores exactly that many tokens.
  r = run_cli("eval ppl --ckpt " + out.string() + " --max-tokens 100 --json --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("tokens").get<double>(), 100.0) << r.out;

  // A FIFO as the prompt is refused at once (it used to block forever).
  const fs::path fifo = cli_tmp_root() / "rel_prompt_fifo";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  expect_cli_error(run_cli("generate --ckpt " + out.string() + " --prompt-file " + fifo.string(), "timeout 60 "),
                   "a FIFO");

  // Full disk while the next checkpoint is written: the large file fails (RLIMIT_FSIZE, 20 KiB), the command
  // names it and exits non-zero, `latest` still names the complete step-2 checkpoint, which evaluates.
  r = run_cli("train --out " + out.string() + " --resume --steps 4 --keep-checkpoints 1 --quiet --threads 1",
              "trap '' XFSZ; ulimit -f 40; ");
  expect_cli_error(r, "model.safetensors");
  EXPECT_EQ(hlm::testing::slurp(out / "latest"), "step_00000002\n");
  EXPECT_TRUE(fs::exists(out / "checkpoints" / "step_00000002" / "trainer_state.json"));
  r = run_cli("eval ppl --ckpt " + out.string() + " --max-tokens 64 --json --threads 1");
  EXPECT_EQ(r.code, 0) << r.err;

  // Non-finite weights are refused at load, naming the tensor.
  const fs::path nan_run = cli_tmp_root() / "rel_run_nan";
  fs::remove_all(nan_run);
  fs::copy(out, nan_run, fs::copy_options::recursive);
  const std::string mp = (nan_run / "checkpoints" / "step_00000002" / "model.safetensors").string();
  {
    hlm::SafeTensorsFile f = hlm::SafeTensorsFile::read(mp);
    hlm::SafeTensorsWriter w;
    for (const auto& t : f.tensors()) {
      std::vector<float> v = t.to_f32();
      if (t.name == "model.norm.weight") v[3] = std::nanf("");
      w.add_f32(t.name, t.shape, v.data());
    }
    w.write(mp);
  }
  expect_cli_error(run_cli("eval ppl --ckpt " + nan_run.string() + " --threads 1"), "'model.norm.weight'");

  // --overwrite replaces the run (once the new one has passed its checks).
  r = run_cli(train_flags(out) + "--steps 1 --overwrite");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(hlm::testing::slurp(out / "latest"), "step_00000001\n");
  EXPECT_FALSE(fs::exists(out / "checkpoints" / "step_00000002"));
}

// The careless inputs of issue 56, class by class: each is refused before work with a message that names the flag,
// field or file and what would be accepted. ~3 s.
TEST(Reliability, CarelessInputsAreRefusedUpFront) {
  const fs::path out = cli_tmp_root() / "rel_careless";
  fs::remove_all(out);
  // S then F: the full-attention layer's KV cache grows with the context.
  CliResult r = run_cli(train_flags(out) + "--set pattern=SF --steps 1");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string ck = "--ckpt " + out.string() + " --threads 1 ";

  // Lengths: too short for the needle (the shortest is named), beyond the corpus haystack, beyond memory.
  r = run_cli("eval niah " + ck + "--lengths 10");
  expect_cli_error(r, "--lengths: length 10 is too short for the NIAH needle");
  EXPECT_NE(r.err.find("give lengths >= "), std::string::npos) << r.err;
  expect_cli_error(run_cli("eval niah " + ck + "--lengths 100000000"), "--lengths: length 100000000 is beyond the corpus haystack");
  expect_cli_error(run_cli("eval niah " + ck + "--lengths 1073741824 --haystack noise"), "--lengths 1073741824");
  expect_cli_error(run_cli("probe retrieval-heads " + ck + "--lengths 12"), "--lengths: length 12 is too short");
  expect_cli_error(run_cli("eval ppl " + ck + "--lengths 64,1000000"), "--lengths 1000000: only");

  // train --mix-niah with rows too short for the needle: refused naming the flags and the shortest --seq-len, before
  // the data is prepared (a corpus no build has seen leaves nothing in the cache).
  const fs::path fresh = cli_tmp_root() / "rel_niah_rows_corpus";
  fs::create_directories(fresh);
  { std::ofstream(fresh / "a.txt") << "one two three\n"; std::ofstream(fresh / "b.txt") << "four five six\n"; }
  const fs::path niah_run = cli_tmp_root() / "rel_niah_rows";
  r = run_cli("train " + hlm::testing::tiny_model_flags() + "--data " + fresh.string() +
              " --tokenizer byte --seq-len 32 --batch 2 --steps 1 --mix-niah 0.5 --quiet --out " + niah_run.string());
  expect_cli_error(r, "--mix-niah: rows of --seq-len 32");
  EXPECT_NE(r.err.find("--niah-digits 7"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("give --seq-len >= "), std::string::npos) << r.err;
  for (const auto& e : fs::directory_iterator(cli_tmp_root() / "cache"))
    EXPECT_EQ(e.path().filename().string().rfind("rel_niah_rows_corpus", 0), std::string::npos) << e.path();
  EXPECT_FALSE(fs::exists(niah_run / "run.json"));

  // A checkpoint folder without run.json: eval and probe name --data and --tokenizer instead of building the
  // default corpus; given both, it evaluates.
  const fs::path bare = cli_tmp_root() / "rel_bare_ckpt";
  fs::remove_all(bare);
  fs::copy(out / "checkpoints" / "step_00000001", bare, fs::copy_options::recursive);
  r = run_cli("eval ppl --ckpt " + bare.string() + " --threads 1");
  expect_cli_error(r, "give --data");
  EXPECT_NE(r.err.find("--tokenizer"), std::string::npos) << r.err;
  expect_cli_error(run_cli("probe receptive-field --ckpt " + bare.string() + " --span 4"), "give --data");
  EXPECT_FALSE(fs::exists(cli_tmp_root() / "cache" / "default"));
  r = run_cli("eval ppl --ckpt " + bare.string() + " --threads 1 --json --max-tokens 50 " +
              hlm::testing::tiny_corpus_flags());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("tokens").get<double>(), 50.0) << r.out;

  // A config.json that asks for more than its weights hold is refused before a model of that size is built.
  nlohmann::json cfg = nlohmann::json::parse(hlm::testing::slurp(bare / "config.json"));
  cfg["n_layers"] = 4000;
  hlm::write_file_atomic((bare / "config.json").string(), cfg.dump());
  expect_cli_error(run_cli("eval ppl --ckpt " + bare.string() + " --threads 1 " + hlm::testing::tiny_corpus_flags()),
                   "the config does not belong to these weights");

  // Every reader of a file the user names says what it is when it is not a regular file.
  expect_cli_error(run_cli("sweep " + cli_tmp_root().string()), "is a directory");
  expect_cli_error(run_cli("eval ruler " + ck + "--qa-file " + cli_tmp_root().string()), "is a directory");
}
