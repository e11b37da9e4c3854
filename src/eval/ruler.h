#pragma once
// RULER-style synthetic long-context tasks (NVIDIA/RULER families that need no outside data): NIAH
// single / multi-key / multi-value / multi-query, variable tracking, common and frequent words
// extraction; QA when the user supplies a data file. Every prompt has exactly the requested number of
// tokens; generation is greedy; scores are RULER's string_match_all / string_match_part (x100).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/haystack.h"
#include "core/error.h"
#include "model/model.h"

namespace hlm {

struct RulerSample {
  std::string task;
  std::vector<int32_t> prompt;         // exactly the requested length
  std::vector<std::string> references;  // expected strings
  std::string metric = "all";           // "all" | "part"
  i64 max_new_tokens = 32;
};

struct QaItem {
  std::string question;
  std::vector<std::string> answers, documents;  // documents[0..] hold the gold evidence
};
// JSONL: one {"question": str, "answers": [str], "documents": [str]} per line. hlm::Error naming the file,
// line and field on problems.
std::vector<QaItem> load_qa_file(const std::string& path);

std::vector<std::string> ruler_task_names();  // the synthetic tasks (qa added when a QA file is given)

// One sample of `task` at `length` tokens; deterministic for a given rng state. `corpus` may be null
// (tasks with an essay haystack then use noise); `qa` is needed for task "qa".
RulerSample make_ruler_sample(const std::string& task, i64 length, const data::Tokenizer& tok,
                              const Haystack& noise, const Haystack* corpus, const std::vector<QaItem>* qa,
                              Rng& rng);

// RULER metrics on one prediction, in [0, 100].
double string_match_all(const std::string& pred, const std::vector<std::string>& refs);
double string_match_part(const std::string& pred, const std::vector<std::string>& refs);

struct RulerConfig {
  std::vector<std::string> tasks;
  std::vector<i64> lengths;
  int samples = 8;
  std::uint64_t seed = 42;
  bool progress = true;
  // A (task, length) whose fixed text alone does not fit the length (with this tokenizer): scored null and
  // listed under "skipped" instead of failing the run; the length's average is over the tasks that fit.
  bool skip_too_short = false;
};
// A length too short for a task's fixed text (prompt, needles, question) with this tokenizer.
class RulerTooShort : public Error {
 public:
  using Error::Error;
};
// {"lengths", "tasks": {task: [score per length]}, "average": [per length], "samples", "examples"} and with
// skip_too_short "skipped": [{task, length, reason}] (a skipped cell is null; an average over no task null).
nlohmann::json run_ruler(Model& model, const data::Tokenizer& tok, const Haystack& noise, const Haystack* corpus,
                         const std::vector<QaItem>* qa, const RulerConfig& c);

}  // namespace hlm
