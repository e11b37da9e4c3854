// End-to-end CLI behaviour: bad input gets a one-line error naming the file/field and a non-zero exit;
// NaN stops training keeping the last good checkpoint; --check-numerics names the tensor; Ctrl-C saves.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_harness.h"

namespace fs = std::filesystem;

namespace {

// Short names for the shared CLI harness (tests/cli_harness.h).
using Result = hlm::testing::CliResult;
const fs::path& tmp_root() { return hlm::testing::cli_tmp_root(); }
Result run(const std::string& args) { return hlm::testing::run_cli(args); }
std::string tiny_model() { return hlm::testing::tiny_model_flags(); }
std::string corpus() { return hlm::testing::tiny_corpus_flags(); }
void expect_error(const Result& r, const std::string& needle) { hlm::testing::expect_cli_error(r, needle); }

}  // namespace

TEST(Cli, BadConfigsAndPresetsAreOneLineErrors) {
  expect_error(run("train --preset nope " + corpus() + "--steps 1"), "unknown preset 'nope'");
  expect_error(run("train " + tiny_model() + "--set pattern=SQF " + corpus()), "unknown layer letter 'Q'");
  expect_error(run("train " + tiny_model() + "--set d_modle=3 " + corpus()), "unknown config key 'd_modle'");
  const fs::path bad = tmp_root() / "bad.json";
  std::ofstream(bad) << "{\"d_model\": 64,,}";
  expect_error(run("train --config " + bad.string() + " " + corpus()), bad.string());
  const fs::path unk = tmp_root() / "unknown_key.json";
  std::ofstream(unk) << "{\"d_model\": 64, \"n_layerz\": 2}";
  expect_error(run("train --config " + unk.string() + " " + corpus()), "n_layerz");
}

TEST(Cli, MissingOrEmptyDataAndTooLongSequencesAreErrors) {
  expect_error(run("train " + tiny_model() + "--data /nonexistent/corpus --tokenizer byte --steps 1"),
               "/nonexistent/corpus");
  expect_error(run("train " + tiny_model() + "--data " + (tmp_root() / "empty").string() + " --tokenizer byte --steps 1"),
               "no documents found");
  expect_error(run("train " + tiny_model() + corpus() + "--steps 1 --seq-len 128"), "max_seq_len");
}

TEST(Cli, TrainEvalAndCorruptCheckpoints) {
  const fs::path out = tmp_root() / "run_ok";
  Result r = run("train " + tiny_model() + corpus() + "--steps 4 --seq-len 32 --batch 2 --eval-batches 2 --json --out " +
                 out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* key : {"\"steps\":4", "\"first_val_loss\"", "\"final_val_loss\"", "\"train_tokens_per_s\"",
                          "\"checkpoint\"", "\"tokens\""})
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_TRUE(fs::exists(out / "metrics.jsonl"));
  const fs::path ck = out / "checkpoints" / "step_00000004";
  EXPECT_TRUE(fs::exists(ck / "model.safetensors"));
  Result e = run("eval ppl --ckpt " + out.string() + " --json --threads 1");
  ASSERT_EQ(e.code, 0) << e.err;
  for (const char* key : {"\"loss\"", "\"ppl\"", "\"tokens\""}) EXPECT_NE(e.out.find(key), std::string::npos) << e.out;
  // A barely trained byte-level model samples lone bytes >= 0x80 (invalid UTF-8): --json still prints the
  // result, with U+FFFD in their place, and the raw ids in "tokens".
  Result g = run("generate --ckpt " + out.string() + " --prompt Doc --max-tokens 48 --temperature 3 --seed 5 " +
                 "--json --threads 1");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_NE(g.out.find("\"new_tokens\":48"), std::string::npos) << g.out;
  EXPECT_NE(g.out.find("\xef\xbf\xbd"), std::string::npos) << g.out;

  // Truncated checkpoint.
  fs::copy(out, tmp_root() / "run_trunc", fs::copy_options::recursive);
  const fs::path tm = tmp_root() / "run_trunc" / "checkpoints" / "step_00000004" / "model.safetensors";
  fs::resize_file(tm, fs::file_size(tm) - 100);
  expect_error(run("eval ppl --ckpt " + (tmp_root() / "run_trunc").string()), "model.safetensors");
  // A header that lies about the data size: bump the first shape dimension of some tensor.
  fs::copy(out, tmp_root() / "run_lie", fs::copy_options::recursive);
  const fs::path lm = tmp_root() / "run_lie" / "checkpoints" / "step_00000004" / "model.safetensors";
  std::string bytes;
  {
    std::ifstream f(lm, std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  const auto pos = bytes.find("\"shape\":[32]");
  ASSERT_NE(pos, std::string::npos);
  bytes.replace(pos, 12, "\"shape\":[99]");
  std::ofstream(lm, std::ios::binary) << bytes;
  expect_error(run("eval ppl --ckpt " + (tmp_root() / "run_lie").string()), "model.safetensors");
}

// --niah-digits: validated up front, stored in run.json (where eval niah and the probes read it). ~1 s.
TEST(Cli, NiahDigitsIsValidatedAndStoredInRunJson) {
  expect_error(run("train " + tiny_model() + corpus() + "--steps 1 --niah-digits 0"), "--niah-digits");
  const fs::path out = tmp_root() / "run_digits";
  Result r = run("train " + tiny_model() + corpus() + "--steps 1 --seq-len 32 --batch 2 --eval-batches 1 --niah-digits 3 "
                 "--quiet --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream f(out / "run.json");
  const std::string run_json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(run_json.find("\"niah_digits\": 3"), std::string::npos) << run_json;
  expect_error(run("eval niah --ckpt " + out.string() + " --niah-digits -2 --threads 1"), "--niah-digits");
  expect_error(run("probe retrieval-heads --ckpt " + out.string() + " --niah-digits 0 --threads 1"), "--niah-digits");
}

TEST(Cli, NonFiniteLossStopsAndKeepsTheLastGoodCheckpoint) {
  const fs::path out = tmp_root() / "run_nan";
  Result r = run("train " + tiny_model() + corpus() +
                 "--steps 50 --seq-len 32 --batch 2 --eval-batches 1 --lr 1e30 --warmup 1 --grad-clip 0 "
                 "--schedule constant --ckpt-every 1 --keep-checkpoints 0 --out " + out.string());
  expect_error(r, "non-finite");
  EXPECT_NE(r.err.find("at step"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(out / "latest")) << r.err;
  EXPECT_NE(r.err.find("the last good checkpoint, step "), std::string::npos) << r.err;
  // Before any checkpoint exists the message says nothing is kept instead of promising a checkpoint.
  const fs::path early = tmp_root() / "run_nan_early";
  fs::remove_all(early);
  r = run("train " + tiny_model() + corpus() +
          "--steps 50 --seq-len 32 --batch 2 --eval-batches 1 --lr 1e30 --warmup 1 --grad-clip 0 "
          "--schedule constant --ckpt-every 40 --out " + early.string());
  expect_error(r, "non-finite");
  EXPECT_NE(r.err.find("no checkpoint of this run exists yet (the first was due at step 40)"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("last good checkpoint"), std::string::npos) << r.err;
  // --steps beyond any run that can finish is refused at parse time.
  expect_error(run("train " + tiny_model() + corpus() + "--steps 1e12"), "--steps");
  Result c = run("train " + tiny_model() + corpus() +
                 "--steps 50 --seq-len 32 --batch 2 --eval-batches 1 --lr 1e30 --warmup 1 --grad-clip 0 "
                 "--schedule constant --check-numerics");
  expect_error(c, "check-numerics: non-finite");
  EXPECT_TRUE(c.err.find("layer") != std::string::npos || c.err.find("loss") != std::string::npos) << c.err;
}

TEST(Cli, CtrlCSavesACheckpointAndExits) {
  const fs::path out = tmp_root() / "run_sigint";
  const std::string cmd = std::string(HLM_BINARY) + " train " + tiny_model() + corpus() +
                          "--steps 100000 --seq-len 32 --batch 2 --eval-batches 1 --eval-every 0 --quiet --out " +
                          out.string();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", ("exec " + cmd + " 2>/dev/null").c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until run.json exists (the Ctrl-C handler is installed before it is written), then interrupt.
  for (int i = 0; i < 300 && !fs::exists(out / "run.json"); ++i) usleep(50000);
  usleep(500000);
  ::kill(pid, SIGINT);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 130);
  EXPECT_TRUE(fs::exists(out / "latest"));
}

// hybridlm recall: trains the small recall model on MQAR (one per pattern and learning rate), prints one line
// per curve point, writes the JSON result (with the best lr per pattern) and the chart. ~1 s.
TEST(Cli, RecallTrainsAndWritesItsCurves) {
  const fs::path out = tmp_root() / "recall.json", svg = tmp_root() / "recall.svg";
  Result r = run("recall --pattern SL,SM --lr 0.003,0.001 --steps 30 --eval-every 15 --eval-rows 64 --out " +
                 out.string() + " --plot " + svg.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("SL lr 0.003 seed 1 step     15  accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SM lr 0.001 seed 1: accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SM: best lr"), std::string::npos) << r.out;
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j.at("runs").size(), 4u);
  for (const auto& run : j["runs"]) {
    ASSERT_EQ(run.at("curve").size(), 3u);
    EXPECT_EQ(run["curve"][0]["step"], 0);
    EXPECT_EQ(run["curve"][2]["step"], 30);
    EXPECT_EQ(run["accuracy"], run["curve"][2]["accuracy"]);
    EXPECT_GE(run["accuracy"].get<double>(), 0.0);
    EXPECT_LE(run["accuracy"].get<double>(), 1.0);
    EXPECT_EQ(run["model"]["vocab_size"], 128);
  }
  EXPECT_EQ(j["runs"][0]["pattern"], "SL");
  EXPECT_DOUBLE_EQ(j["runs"][1]["lr"].get<double>(), 0.001);
  EXPECT_EQ(j["runs"][2]["model"]["pattern"], "SM");
  ASSERT_EQ(j.at("best").size(), 2u);
  for (int k = 0; k < 2; ++k) {  // the best lr's accuracy is the higher of the pattern's two runs
    const double a = j["runs"][2 * k]["accuracy"], b = j["runs"][2 * k + 1]["accuracy"];
    EXPECT_DOUBLE_EQ(j["best"][k]["accuracy"].get<double>(), std::max(a, b));
    EXPECT_DOUBLE_EQ(j["best"][k]["lr"].get<double>(), a >= b ? 0.003 : 0.001);
  }
  EXPECT_DOUBLE_EQ(j["chance"].get<double>(), 1.0 / 64);
  EXPECT_EQ(j["task"]["num_kv_pairs"], 8);
  std::ifstream p(svg);
  const std::string chart((std::istreambuf_iterator<char>(p)), std::istreambuf_iterator<char>());
  EXPECT_NE(chart.find("<svg"), std::string::npos);
  EXPECT_NE(chart.find("SM"), std::string::npos);
}

// Bad task sizes, patterns, learning rates and config keys are one-line errors.
TEST(Cli, RecallRefusesBadTaskAndModelFlags) {
  expect_error(run("recall --kv-pairs 40"), "seq_len");
  expect_error(run("recall --pattern SQ"), "unknown layer letter 'Q'");
  expect_error(run("recall --pattern SL,,SM"), "empty pattern");
  expect_error(run("recall --lr 0.001,0"), "--lr");
  expect_error(run("recall --preset gdn --pattern SG"), "--set pattern");
  expect_error(run("recall --pattern SM --set layer_types.S.a_init_range=[1,2]"), "a_init_range");
}

// A diverging learning rate is recorded and the sweep goes on; when every one diverges, the report says so.
TEST(Cli, RecallRecordsADivergingLearningRateAndGoesOn) {
  Result d = run("recall --pattern SL --lr 1000,0.003 --steps 6 --eval-every 0 --eval-rows 16 --json");
  ASSERT_EQ(d.code, 0) << d.err;
  const nlohmann::json dj = nlohmann::json::parse(d.out);
  ASSERT_EQ(dj.at("runs").size(), 2u);
  EXPECT_NE(dj["runs"][0].value("error", "").find("non-finite"), std::string::npos) << d.out;
  EXPECT_FALSE(dj["runs"][1].contains("error"));
  EXPECT_DOUBLE_EQ(dj["best"][0]["lr"].get<double>(), 0.003);
  Result all = run("recall --pattern SL --lr 1000 --steps 6 --eval-every 0 --eval-rows 16 --json");
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_NE(all.out.find("every learning rate diverged"), std::string::npos) << all.out;
}

// bench --ckpt: prefill and decode of a checkpoint timed apart, every run's value and their median in the JSON;
// --decode-tokens 0 times the prefill alone; model flags next to --ckpt and a missing checkpoint are refused.
TEST(Cli, BenchCkptTimesPrefillAndDecode) {
  const fs::path out = tmp_root() / "run_bench_ckpt";
  Result t = run("train " + tiny_model() + corpus() + "--steps 1 --seq-len 32 --batch 1 --eval-batches 1 --out " +
                 out.string());
  ASSERT_EQ(t.code, 0) << t.err;
  Result r = run("bench --ckpt " + out.string() + " --prompt-tokens 40 --prefill-chunk 16 --decode-tokens 5 " +
                 "--steps 3 --warmup 1 --threads 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("prompt_tokens").get<int>(), 40);
  EXPECT_EQ(j.at("decode_tokens").get<int>(), 5);
  EXPECT_EQ(j.at("prefill_chunk").get<int>(), 16);
  EXPECT_EQ(j.at("runs").get<int>(), 3);
  EXPECT_EQ(j.at("decode_threads").get<int>(), 1);
  for (const char* phase : {"prefill", "decode"}) {
    auto all = j.at(std::string(phase) + "_tokens_per_s_all").get<std::vector<double>>();
    ASSERT_EQ(all.size(), 3u) << phase;
    for (double v : all) EXPECT_GT(v, 0) << phase;
    std::sort(all.begin(), all.end());
    EXPECT_DOUBLE_EQ(j.at(std::string(phase) + "_tokens_per_s").get<double>(), all[1]) << phase;
  }
  EXPECT_GT(j.at("peak_rss_mb").get<double>(), 0);
  Result p = run("bench --ckpt " + out.string() + " --prompt-tokens 8 --decode-tokens 0 --steps 1 --warmup 0 --json");
  ASSERT_EQ(p.code, 0) << p.err;
  const auto jp = nlohmann::json::parse(p.out);
  EXPECT_GT(jp.at("prefill_tokens_per_s").get<double>(), 0);
  EXPECT_EQ(jp.at("decode_tokens_per_s").get<double>(), 0);
  EXPECT_TRUE(jp.at("decode_tokens_per_s_all").empty());
  expect_error(run("bench --ckpt " + out.string() + " --preset full"), "drop --preset");
  expect_error(run("bench --ckpt " + (tmp_root() / "no_such_run").string()), "no_such_run");
}

// bench --recompute: the same step in a smaller activation arena, reported in the JSON; the memory estimate
// follows the flag (a budget the plain step is refused under lets the recomputing step run).
TEST(Cli, BenchRecomputeUsesLessActivationMemory) {
  const std::string b = "bench " + tiny_model() + "--batch 2 --seq-len 256 --steps 1 --warmup 0 --set n_layers=6 --json ";
  Result plain = run(b), rec = run(b + "--recompute");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(rec.code, 0) << rec.err;
  const auto jp = nlohmann::json::parse(plain.out), jr = nlohmann::json::parse(rec.out);
  EXPECT_FALSE(jp.at("recompute").get<bool>());
  EXPECT_TRUE(jr.at("recompute").get<bool>());
  EXPECT_GT(jr.at("train_tokens_per_s").get<double>(), 0);
  EXPECT_LT(jr.at("arena_mb").get<double>(), 0.8 * jp.at("arena_mb").get<double>());
}
