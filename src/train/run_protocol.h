#pragma once
// What a run measures and keeps, beside what it trains: the validation cadence and batches, the extra evaluations
// with their settings, the checkpoint cadence and how many are kept. It lives in run.json ("protocol") so that
// `train --resume` continues with the run's own protocol instead of the flags' defaults (docs/reliability.md,
// "Resume"). A flag that would change what a metrics row means is refused on resume; one that only changes how
// often rows or checkpoints are made, or how many are kept, takes effect and is recorded with its step.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace hlm {

// The extra evaluations logged with each validation row (`train --eval longppl,niah`), with the settings that
// define their numbers.
struct ExtraEvalSettings {
  bool longppl = false;
  i64 longppl_documents = 4;  // validation documents scored (each seq_len tokens)
  i64 longppl_trunc_len = 0;  // the short context K
  i64 longppl_block = 0;      // scored block size
  bool niah = false;
  std::vector<i64> niah_lengths;
  std::vector<double> niah_depths;
  i64 niah_samples = 2;
  i64 niah_digits = 7;

  // The settings `--eval` gives a run of rows of `seq_len` tokens with needles of `digits` digits.
  static ExtraEvalSettings for_run(const std::vector<std::string>& names, i64 seq_len, i64 digits);
  std::vector<std::string> names() const;  // "longppl", "niah" as enabled
  bool operator==(const ExtraEvalSettings&) const = default;
};

struct RunProtocol {
  long eval_every = 50;  // validate every N steps (0 = at the start and end only)
  int eval_batches = 8;  // the fixed validation batches each validation averages over
  long ckpt_every = 0;   // checkpoint every N steps (0 = at the end and on a stop only)
  int keep_checkpoints = 3;  // newest N kept (0 = all)
  ExtraEvalSettings evals;
  // The bookkeeping changes made by later resumes: [{"step": S, "<setting>": new value, ...}], oldest first.
  nlohmann::json changes = nlohmann::json::array();

  nlohmann::json to_json() const;
  // Strict parse of run.json's "protocol"; errors name `source` (the file) and the field.
  static RunProtocol from_json(const nlohmann::json& j, const std::string& source);
};

// Which protocol flags the user gave to `train --resume`.
struct ProtocolFlagsGiven {
  bool eval_every = false, eval_batches = false, ckpt_every = false, keep_checkpoints = false, evals = false;
};

// `train --resume`: the run's protocol with the flags given applied. A flag that redefines what a row measures
// (--eval-batches, --eval) must agree with the run's (else hlm::Error naming the flag and the run's value);
// cadence and retention (--eval-every, --ckpt-every, --keep-checkpoints) take the flag's value from `step` on,
// recorded in `changes`.
RunProtocol resume_protocol(const RunProtocol& run, const RunProtocol& flags, const ProtocolFlagsGiven& given,
                            long step, const std::string& source);

}  // namespace hlm
