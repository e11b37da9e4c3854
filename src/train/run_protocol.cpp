#include "train/run_protocol.h"

#include <algorithm>

#include "core/error.h"

namespace hlm {

ExtraEvalSettings ExtraEvalSettings::for_run(const std::vector<std::string>& names, i64 seq_len, i64 digits) {
  ExtraEvalSettings e;
  for (const auto& n : names) {
    if (n == "longppl") e.longppl = true;
    else if (n == "niah") e.niah = true;
    else fail("--eval: unknown evaluation '{}' (longppl, niah)", n);
  }
  if (e.longppl) {
    e.longppl_trunc_len = std::max<i64>(1, seq_len / 4);
    e.longppl_block = std::max<i64>(1, seq_len / 8);
  }
  if (e.niah) {
    e.niah_lengths = {seq_len};
    e.niah_depths = {0.1, 0.5, 0.9};
    e.niah_digits = digits;
  }
  return e;
}

std::vector<std::string> ExtraEvalSettings::names() const {
  std::vector<std::string> n;
  if (longppl) n.emplace_back("longppl");
  if (niah) n.emplace_back("niah");
  return n;
}

nlohmann::json RunProtocol::to_json() const {
  nlohmann::json ev = nlohmann::json::object();
  if (evals.longppl)
    ev["longppl"] = {{"documents", evals.longppl_documents}, {"trunc_len", evals.longppl_trunc_len},
                     {"block", evals.longppl_block}};
  if (evals.niah)
    ev["niah"] = {{"lengths", evals.niah_lengths}, {"depths", evals.niah_depths}, {"samples", evals.niah_samples},
                  {"digits", evals.niah_digits}};
  return {{"eval_every", eval_every}, {"eval_batches", eval_batches}, {"ckpt_every", ckpt_every},
          {"keep_checkpoints", keep_checkpoints}, {"evals", ev}, {"changes", changes}};
}

namespace {

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) fail("{}: field '{}' is missing", where, key);
  return j[key];
}

i64 integer(const nlohmann::json& j, const char* key, i64 lo, i64 hi, const std::string& where) {
  const auto& v = field(j, key, where);
  if (!v.is_number_integer()) fail("{}: field '{}' must be an integer", where, key);
  const i64 x = v.get<i64>();
  if (x < lo || x > hi) fail("{}: field '{}' = {} is outside [{}, {}]", where, key, x, lo, hi);
  return x;
}

void only_keys(const nlohmann::json& j, std::initializer_list<const char*> keys, const std::string& where) {
  if (!j.is_object()) fail("{}: expected an object", where);
  for (const auto& item : j.items()) {
    const std::string& k = item.key();
    if (std::none_of(keys.begin(), keys.end(), [&k](const char* a) { return k == a; }))
      fail("{}: unknown field '{}'", where, k);
  }
}

}  // namespace

RunProtocol RunProtocol::from_json(const nlohmann::json& j, const std::string& source) {
  const std::string where = source + ": field 'protocol'";
  only_keys(j, {"eval_every", "eval_batches", "ckpt_every", "keep_checkpoints", "evals", "changes"}, where);
  constexpr i64 kMaxCount = i64{1} << 30;
  RunProtocol p;
  p.eval_every = integer(j, "eval_every", 0, kMaxCount, where);
  p.eval_batches = static_cast<int>(integer(j, "eval_batches", 1, i64{1} << 20, where));
  p.ckpt_every = integer(j, "ckpt_every", 0, kMaxCount, where);
  p.keep_checkpoints = static_cast<int>(integer(j, "keep_checkpoints", 0, kMaxCount, where));
  const auto& ev = field(j, "evals", where);
  only_keys(ev, {"longppl", "niah"}, where + ".evals");
  if (ev.contains("longppl")) {
    const std::string w = where + ".evals.longppl";
    const auto& l = ev["longppl"];
    only_keys(l, {"documents", "trunc_len", "block"}, w);
    p.evals.longppl = true;
    p.evals.longppl_documents = integer(l, "documents", 1, kMaxCount, w);
    p.evals.longppl_trunc_len = integer(l, "trunc_len", 1, kMaxCount, w);
    p.evals.longppl_block = integer(l, "block", 1, kMaxCount, w);
  }
  if (ev.contains("niah")) {
    const std::string w = where + ".evals.niah";
    const auto& n = ev["niah"];
    only_keys(n, {"lengths", "depths", "samples", "digits"}, w);
    p.evals.niah = true;
    const auto& lengths = field(n, "lengths", w);
    const auto& depths = field(n, "depths", w);
    if (!lengths.is_array() || lengths.empty() || lengths.size() > 64)
      fail("{}: field 'lengths' must be an array of 1 to 64 integers", w);
    for (const auto& x : lengths) {
      if (!x.is_number_integer() || x.get<i64>() < 1 || x.get<i64>() > kMaxCount)
        fail("{}: field 'lengths' holds {}, not a length in [1, {}]", w, x.dump(), kMaxCount);
      p.evals.niah_lengths.push_back(x.get<i64>());
    }
    if (!depths.is_array() || depths.empty() || depths.size() > 64)
      fail("{}: field 'depths' must be an array of 1 to 64 numbers", w);
    for (const auto& x : depths) {
      if (!x.is_number() || !(x.get<double>() >= 0 && x.get<double>() <= 1))
        fail("{}: field 'depths' holds {}, not a depth in [0, 1]", w, x.dump());
      p.evals.niah_depths.push_back(x.get<double>());
    }
    p.evals.niah_samples = integer(n, "samples", 1, 1 << 20, w);
    p.evals.niah_digits = integer(n, "digits", 1, 64, w);
  }
  const auto& ch = field(j, "changes", where);
  if (!ch.is_array()) fail("{}: field 'changes' must be an array", where);
  for (const auto& c : ch) {
    if (!c.is_object() || !c.contains("step") || !c["step"].is_number_integer())
      fail("{}: every entry of 'changes' must be an object with an integer 'step', got {}", where, c.dump());
  }
  p.changes = ch;
  return p;
}

RunProtocol resume_protocol(const RunProtocol& run, const RunProtocol& flags, const ProtocolFlagsGiven& given,
                            long step, const std::string& source) {
  const char* how = "--resume continues with the run's protocol (drop the flag, or start a new run with --overwrite "
                    "or another --out)";
  if (given.eval_batches && flags.eval_batches != run.eval_batches)
    fail("--eval-batches {} conflicts with the run's eval_batches = {} ({}): a validation row's loss is the mean "
         "over these batches, so changing them mid-run changes what the curve measures; {}",
         flags.eval_batches, run.eval_batches, source, how);
  if (given.evals && !(flags.evals == run.evals)) {
    auto list = [](const ExtraEvalSettings& e) {
      std::string s;
      for (const auto& n : e.names()) s += (s.empty() ? "" : ",") + n;
      return s.empty() ? std::string("none") : s;
    };
    fail("--eval {} conflicts with the run's extra evaluations ({}, {}): every validation row of a run carries the "
         "same evaluations with the same settings; {}",
         list(flags.evals), list(run.evals), source, how);
  }
  RunProtocol p = run;
  nlohmann::json change = {{"step", step}};
  auto take = [&](bool is_given, auto RunProtocol::*member, const char* key) {
    if (is_given && flags.*member != run.*member) {
      p.*member = flags.*member;
      change[key] = flags.*member;
    }
  };
  take(given.eval_every, &RunProtocol::eval_every, "eval_every");
  take(given.ckpt_every, &RunProtocol::ckpt_every, "ckpt_every");
  take(given.keep_checkpoints, &RunProtocol::keep_checkpoints, "keep_checkpoints");
  if (change.size() > 1) p.changes.push_back(change);
  return p;
}

}  // namespace hlm
