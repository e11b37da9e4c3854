#include "study/plan.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "model/config.h"
#include "study/json_file.h"

namespace hlm::study {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One JSON object of the plan with its path ("budgets.tiny"), for errors that name file and field.
class Node {
 public:
  Node(const std::string& file, const json& j, std::string path) : file_(file), j_(j), path_(std::move(path)) {
    if (!j_.is_object()) fail("{}: field '{}' must be an object", file_, path_.empty() ? "(plan)" : path_);
  }
  std::string field(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }
  void only(const std::set<std::string>& known) const {
    for (auto& [k, v] : j_.items())
      if (!known.count(k)) {
        std::string list;
        for (auto& x : known) list += (list.empty() ? "" : ", ") + x;
        fail("{}: unknown field '{}' (known: {})", file_, field(k), list);
      }
  }
  bool has(const std::string& k) const { return j_.contains(k); }
  const json& at(const std::string& k) const {
    if (!j_.contains(k)) fail("{}: field '{}' is missing", file_, field(k));
    return j_.at(k);
  }
  Node child(const std::string& k) const { return Node(file_, at(k), field(k)); }
  std::string str(const std::string& k, const std::string& def = "", bool required = false) const {
    if (!has(k)) {
      if (required) fail("{}: field '{}' is missing", file_, field(k));
      return def;
    }
    if (!j_[k].is_string() || j_[k].get<std::string>().empty())
      fail("{}: field '{}' must be a non-empty string", file_, field(k));
    return j_[k].get<std::string>();
  }
  double num(const std::string& k, double def, bool required = false) const {
    if (!has(k)) {
      if (required) fail("{}: field '{}' is missing", file_, field(k));
      return def;
    }
    if (!j_[k].is_number() || !std::isfinite(j_[k].get<double>()))
      fail("{}: field '{}' must be a number", file_, field(k));
    return j_[k].get<double>();
  }
  // A whole number >= lo.
  long count(const std::string& k, long def, long lo, bool required = false) const {
    const double d = num(k, static_cast<double>(def), required);
    if (d != std::floor(d) || d < static_cast<double>(lo) || d > 9e15)
      fail("{}: field '{}' must be a whole number >= {}, got {}", file_, field(k), lo, j_.contains(k) ? j_[k].dump() : "");
    return static_cast<long>(d);
  }
  double fraction(const std::string& k, double def, bool required = false) const {
    const double d = num(k, def, required);
    if (!(d >= 0 && d <= 1)) fail("{}: field '{}' must be in [0, 1], got {}", file_, field(k), d);
    return d;
  }
  std::vector<std::string> strings(const std::string& k, bool sets) const {
    std::vector<std::string> out;
    if (!has(k)) return out;
    const json& v = j_[k];
    if (!v.is_array()) fail("{}: field '{}' must be an array of strings", file_, field(k));
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string() || v[i].get<std::string>().empty() ||
          (sets && v[i].get<std::string>().find('=') == std::string::npos))
        fail("{}: field '{}[{}]' must be a {}string", file_, field(k), i, sets ? "\"key=value\" " : "non-empty ");
      out.push_back(v[i].get<std::string>());
    }
    return out;
  }
  const json& raw() const { return j_; }
  const std::string& file() const { return file_; }

 private:
  const std::string& file_;
  const json& j_;
  std::string path_;
};

bool safe_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return false;
  return true;
}

// Train flags of a budget ({"lr": 0.003, "warmup": 10}), checked like a sweep's.
std::vector<std::string> train_flags(const Node& n, const TrainOptionKind& train_option) {
  // Flags the study sets itself from the plan's own fields.
  static const std::set<std::string> kReserved = {"steps", "out", "resume", "preset", "config", "set", "data",
                                                  "tokenizer", "json", "help", "seq-len", "batch", "seed",
                                                  "eval-every", "ckpt-every", "keep-checkpoints", "mix-niah",
                                                  "mix-haystack", "niah-digits", "threads", "eval"};
  std::vector<std::string> out;
  for (auto& [k, v] : n.raw().items()) {
    std::string flag = k;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const std::string field = n.field(k);
    if (kReserved.count(flag)) fail("{}: field '{}' is set by the study from the plan's own fields", n.file(), field);
    if (flag == "precision")  // how the runs compute, not what the plan studies: one CPU may lack bf16
      fail("{}: field '{}': the precision is not part of a plan; use `hybridlm reproduce --precision`", n.file(),
           field);
    const int kind = train_option("--" + flag);
    if (kind < 0) fail("{}: field '{}': `hybridlm train` has no option --{}", n.file(), field, flag);
    if (kind == 0) {
      if (!v.is_boolean()) fail("{}: field '{}' is a switch: use true or false", n.file(), field);
      if (v.get<bool>()) out.push_back("--" + flag);
      continue;
    }
    out.push_back("--" + flag);
    if (v.is_number_integer()) out.push_back(std::to_string(v.get<long long>()));
    else if (v.is_number()) out.push_back(fmt::format("{}", v.get<double>()));
    else if (v.is_string()) out.push_back(v.get<std::string>());
    else fail("{}: field '{}' must be a number or a string", n.file(), field);
  }
  return out;
}

HybridSpec read_hybrid(const Node& n, const std::string& name, const StudyPlan& p) {
  n.only({"preset", "window", "label", "set"});
  HybridSpec h;
  h.name = name;
  h.preset = n.str("preset", "", true);
  try {
    preset_json(h.preset);
  } catch (const Error& e) {
    fail("{}: field '{}': {}", n.file(), n.field("preset"), e.what());
  }
  h.window = n.str("window");
  if (!h.window.empty() && !p.windows.count(h.window))
    fail("{}: field '{}': \"{}\" is not a window class of the plan's 'windows'", n.file(), n.field("window"), h.window);
  h.label = n.str("label", name);
  h.sets = n.strings("set", true);
  return h;
}

// Rule parameters: the finding's own numbers (all required), min_seeds, and how the seed spread is read
// (`interval`: "range" or "t", with `confidence` for "t"; study/verdict.h).
json read_rule(const Node& n, const std::set<std::string>& known) {
  std::set<std::string> all = known;
  all.insert({"interval", "confidence"});
  n.only(all);
  for (auto& k : known) n.num(k, 0, true);
  if (n.raw().contains("min_seeds")) n.count("min_seeds", 1, 1);
  const std::string interval = n.str("interval", "range");
  if (interval != "range" && interval != "t")
    fail("{}: field '{}' is \"{}\"; it must be \"range\" (mean against the seeds' max - min) or \"t\" (one-sided "
         "Student-t bounds at `confidence`)", n.file(), n.field("interval"), interval);
  if (n.has("confidence")) {
    if (interval != "t") fail("{}: field '{}' only applies with \"interval\": \"t\"", n.file(), n.field("confidence"));
    const double c = n.num("confidence", 0.95);
    if (!(c >= 0.5 && c < 1)) fail("{}: field '{}' must be in [0.5, 1), got {}", n.file(), n.field("confidence"), c);
  }
  if (interval == "t" && n.raw().value("min_seeds", 2) < 2)
    fail("{}: field '{}' must be >= 2 with \"interval\": \"t\" (one seed has no spread)", n.file(),
         n.field("min_seeds"));
  return n.raw();
}

}  // namespace

const HybridSpec& StudyPlan::hybrid(const std::string& name) const {
  if (name == evaluator.name) return evaluator;
  for (auto& h : hybrids)
    if (h.name == name) return h;
  fail("{}: no hybrid named '{}'", file, name);
}

const FindingSpec* StudyPlan::finding(const std::string& id) const {
  for (auto& f : findings)
    if (f.id == id) return &f;
  return nullptr;
}

long StudyPlan::window_tokens(const HybridSpec& h, const BudgetSpec& b) const {
  if (h.window.empty()) return 0;
  return std::max(1L, std::lround(windows.at(h.window) * static_cast<double>(b.seq_len)));
}

long scaled_steps(const BudgetSpec& b, double factor) {
  return std::max(1L, std::lround(factor * static_cast<double>(b.steps) / static_cast<double>(b.eval_every))) *
         b.eval_every;
}

std::string default_plan_path() { return (fs::path(HLM_SOURCE_DIR) / "studies" / "paper.json").string(); }

namespace {

// windows: classes as fractions of the training length, with the mapping said in words.
void read_windows(const std::string& file, const Node& root, StudyPlan& p) {
  Node w = root.child("windows");
  for (auto& [k, v] : w.raw().items()) {
    if (k == "mapping") continue;
    if (!safe_name(k)) fail("{}: field 'windows.{}': a window class is a plain name", file, k);
    const double f = w.fraction(k, 0, true);
    if (!(f > 0)) fail("{}: field 'windows.{}' must be > 0 (a fraction of the training length)", file, k);
    p.windows[k] = f;
  }
  p.window_mapping = w.str("mapping", "", true);
}

// hybrids and the evaluator (a hybrid run longer by steps_factor).
void read_hybrids(const std::string& file, const Node& root, StudyPlan& p) {
  Node hs = root.child("hybrids");
  for (auto& [k, v] : hs.raw().items()) {
    if (!safe_name(k)) fail("{}: field 'hybrids.{}': names use letters, digits, '-' and '_'", file, k);
    p.hybrids.push_back(read_hybrid(hs.child(k), k, p));
  }
  if (p.hybrids.empty()) fail("{}: field 'hybrids' is empty", file);
  {
    Node e = root.child("evaluator");
    e.only({"preset", "set", "steps_factor", "label"});
    json h = e.raw();
    h.erase("steps_factor");
    Node hn(file, h, "evaluator");
    p.evaluator = read_hybrid(hn, "evaluator", p);
    p.evaluator_steps_factor = e.num("steps_factor", 1);
    if (!(p.evaluator_steps_factor >= 1) || p.evaluator_steps_factor > 100)
      fail("{}: field 'evaluator.steps_factor' must be in [1, 100]", file);
  }
}

// the miniature proxy: NIAH rows mixed into training.
void read_proxy(const std::string& file, const Node& root, StudyPlan& p) {
  Node x = root.child("proxy");
  x.only({"mix_niah", "mix_haystack", "niah_digits", "note"});
  p.mix_niah = x.fraction("mix_niah", 0, true);
  p.mix_haystack = x.str("mix_haystack", "noise");
  if (p.mix_haystack != "noise" && p.mix_haystack != "corpus")
    fail("{}: field 'proxy.mix_haystack' must be \"noise\" or \"corpus\"", file);
  p.niah_digits = static_cast<int>(x.count("niah_digits", 7, 1));
  if (p.niah_digits > 9) fail("{}: field 'proxy.niah_digits' must be 1..9", file);
  p.proxy_note = x.str("note", "", p.mix_niah > 0);
}

// Every hybrid (and the evaluator) must resolve at budget s (presets + size + window), and its rows fit the model.
void check_hybrids_fit_budget(const std::string& file, const Node& b, const BudgetSpec& s, const StudyPlan& p) {
  for (const HybridSpec* h : [&] {
         std::vector<const HybridSpec*> v;
         for (auto& x : p.hybrids) v.push_back(&x);
         v.push_back(&p.evaluator);
         return v;
       }()) {
    std::vector<std::string> sets = s.sets;
    sets.insert(sets.end(), h->sets.begin(), h->sets.end());
    const long win = p.window_tokens(*h, s);
    if (win > 0) sets.push_back(fmt::format("window={}", win));
    ModelConfig cfg;
    try {
      cfg = resolve_config(h->preset, "", sets);
    } catch (const Error& e) {
      fail("{}: field '{}' with hybrid '{}': {}", file, b.field("set"), h->name, e.what());
    }
    if (cfg.max_seq_len < s.seq_len)
      fail("{}: field '{}': seq_len {} is over hybrid '{}''s max_seq_len {} (add \"max_seq_len=N\" to 'set')", file,
           b.field("seq_len"), s.seq_len, h->name, cfg.max_seq_len);
  }
}

// One budget: data, tokenizer, sizes, training length (steps or tokens), evaluation settings.
BudgetSpec read_budget(const std::string& file, const Node& bs, const std::string& k, const StudyPlan& p,
                       const TrainOptionKind& train_option) {
  Node b = bs.child(k);
  b.only({"data", "tokenizer", "set", "train", "seq_len", "batch", "steps", "tokens", "eval_every", "seeds",
          "niah_samples", "longppl_docs", "max_eval_tokens", "note"});
  BudgetSpec s;
  s.name = k;
  s.data = b.str("data", "default");
  // A data path is relative to the plan file (so a plan in studies/ can name ../docs).
  if (s.data != "default" && fs::path(s.data).is_relative())
    s.data = (fs::absolute(file).parent_path() / s.data).lexically_normal().string();
  s.tokenizer = b.str("tokenizer", "bpe:4096");
  s.sets = b.strings("set", true);
  if (b.has("train")) s.train_args = train_flags(b.child("train"), train_option);
  s.seq_len = b.count("seq_len", 0, 8, true);
  s.batch = b.count("batch", 0, 1, true);
  if (b.has("steps") == b.has("tokens"))
    fail("{}: field '{}': give the training length as 'steps' or as 'tokens' (one of them)", file, b.field("steps"));
  if (b.has("steps")) {
    s.steps = b.count("steps", 0, 1);
  } else {
    const long tokens = b.count("tokens", 0, 1);
    if (tokens % (s.batch * s.seq_len) != 0)
      fail("{}: field '{}': {} tokens is not a whole number of steps of batch x seq_len = {} tokens", file,
           b.field("tokens"), tokens, s.batch * s.seq_len);
    s.steps = tokens / (s.batch * s.seq_len);
  }
  s.eval_every = b.count("eval_every", 0, 1, true);
  if (s.steps % s.eval_every != 0)
    fail("{}: field '{}': {} steps is not a multiple of eval_every {} (checkpoints are compared step for step)", file,
         b.field("eval_every"), s.steps, s.eval_every);
  if (s.steps / s.eval_every < 3)
    fail("{}: field '{}': {} steps give {} checkpoints at eval_every {}; the scaling fits and the curves over "
         "training need at least 3", file, b.field("steps"), s.steps, s.steps / s.eval_every, s.eval_every);
  s.seeds = static_cast<int>(b.count("seeds", 1, 1));
  s.niah_samples = static_cast<int>(b.count("niah_samples", 2, 1));
  s.longppl_docs = static_cast<int>(b.count("longppl_docs", 4, 1));
  s.max_eval_tokens = b.count("max_eval_tokens", 16384, 1);
  if (s.max_eval_tokens < s.seq_len)
    fail("{}: field '{}' must be at least seq_len ({})", file, b.field("max_eval_tokens"), s.seq_len);
  if (p.mix_niah > 0 && s.seq_len < 48)
    fail("{}: field '{}': NIAH rows need seq_len >= 48 (prompt + answer), got {}", file, b.field("seq_len"), s.seq_len);
  check_hybrids_fit_budget(file, b, s, p);
  return s;
}

// One of the findings a-d: what it compares and its pre-declared rule.
FindingSpec read_finding(const std::string& file, const Node& fs_node, const std::string& k, const StudyPlan& p) {
  static const std::map<std::string, std::set<std::string>> kRuleKeys = {
      {"a", {"loss_spread_max", "margin", "min_seeds"}},
      {"b", {"learned_min", "margin", "min_seeds"}},
      {"c", {"margin_fraction", "min_seeds", "heads_min"}},
      {"d", {"learned_min", "margin", "loss_tolerance", "min_seeds"}}};
  if (!kRuleKeys.count(k)) fail("{}: unknown field 'findings.{}' (the findings are a, b, c, d)", file, k);
  Node f = fs_node.child(k);
  f.only({"title", "claim", "metric", "rule", "rule_text", "hybrids", "options", "steps_factor"});
  FindingSpec s;
  s.id = k;
  s.title = f.str("title", "", true);
  s.claim = f.str("claim", "", true);
  s.metric = f.str("metric", "", true);
  s.rule_text = f.str("rule_text", "", true);
  s.rule = read_rule(f.child("rule"), kRuleKeys.at(k));
  s.hybrids = f.strings("hybrids", false);
  s.steps_factor = f.num("steps_factor", 1);
  if (!(s.steps_factor >= 1) || s.steps_factor > 100)
    fail("{}: field '{}' must be in [1, 100]", file, f.field("steps_factor"));
  const size_t need = k == "d" ? 2 : k == "b" ? 1 : 2;
  if (s.hybrids.size() < need || (k == "d" && s.hybrids.size() != 2))
    fail("{}: field '{}' must list {} hybrids", file, f.field("hybrids"), k == "d" ? "exactly 2 (RoPE, NoPE)" : "at least " + std::to_string(need));
  for (size_t i = 0; i < s.hybrids.size(); ++i) {
    bool found = false;
    for (auto& h : p.hybrids) found |= h.name == s.hybrids[i];
    if (!found) fail("{}: field '{}[{}]': no hybrid named '{}' in 'hybrids'", file, f.field("hybrids"), i, s.hybrids[i]);
  }
  s.options = f.has("options") ? f.at("options") : json::object();
  Node o(file, s.options, f.field("options"));
  if (k == "b") {
    o.only({"span_fraction"});
    if (!(o.fraction("span_fraction", 0, true) > 0)) fail("{}: field '{}' must be > 0", file, o.field("span_fraction"));
  } else if (k == "c") {
    o.only({});
    for (auto& name : s.hybrids)
      if (p.hybrid(name).window.empty())
        fail("{}: field '{}': hybrid '{}' has no SWA window to compare", file, f.field("hybrids"), name);
  } else if (k == "d") {
    o.only({"lengths", "ruler_tasks", "ruler_lengths"});
    for (const char* key : {"lengths", "ruler_lengths"}) {
      if (!o.has(key)) continue;
      const json& a = o.at(key);
      if (!a.is_array() || a.empty()) fail("{}: field '{}' must be a non-empty array", file, o.field(key));
      for (size_t i = 0; i < a.size(); ++i)
        if (!a[i].is_number_integer() || a[i].get<long>() < 1)
          fail("{}: field '{}[{}]' must be a whole multiple (>= 1) of the training length", file, o.field(key), i);
    }
    if (!o.has("lengths")) fail("{}: field '{}' is missing", file, o.field("lengths"));
    o.strings("ruler_tasks", false);
  } else {  // a
    o.only({"longppl_alpha", "longppl_beta"});
    o.num("longppl_alpha", 2.0);
    o.num("longppl_beta", -2.0);
  }
  return s;
}

// Lengths beyond training (finding d) must fit the model at every budget.
void check_finding_d_lengths(const std::string& file, const StudyPlan& p) {
  if (const FindingSpec* d = p.finding("d"))
    for (auto& [bn, b] : p.budgets)
      for (const char* key : {"lengths", "ruler_lengths"}) {
        if (!d->options.contains(key)) continue;
        for (auto& x : d->options[key])
          for (auto& name : d->hybrids) {
            std::vector<std::string> sets = b.sets;
            const HybridSpec& h = p.hybrid(name);
            sets.insert(sets.end(), h.sets.begin(), h.sets.end());
            const ModelConfig cfg = resolve_config(h.preset, "", sets);
            if (x.get<long>() * b.seq_len > cfg.max_seq_len)
              fail("{}: field 'findings.d.options.{}': {} x seq_len {} is over the max_seq_len {} of budget '{}' "
                   "(add \"max_seq_len=N\" to budgets.{}.set)", file, key, x.get<long>(), b.seq_len, cfg.max_seq_len,
                   bn, bn);
          }
      }
}

}  // namespace

StudyPlan load_study_plan(const std::string& file, const TrainOptionKind& train_option) {
  const json j = read_json_file(file, " the plan file");
  Node root(file, j, "");
  root.only({"version", "name", "description", "amendments", "windows", "hybrids", "evaluator", "proxy", "budgets",
             "findings"});
  if (root.count("version", 0, 1, true) != 1) fail("{}: field 'version' must be 1", file);
  StudyPlan p;
  p.file = file;
  p.name = root.str("name", "", true);
  p.description = root.str("description");
  p.amendments = root.strings("amendments", false);
  read_windows(file, root, p);
  read_hybrids(file, root, p);
  read_proxy(file, root, p);
  Node bs = root.child("budgets");
  for (auto& [k, v] : bs.raw().items()) p.budgets[k] = read_budget(file, bs, k, p, train_option);
  if (p.budgets.empty()) fail("{}: field 'budgets' is empty", file);
  Node fs_node = root.child("findings");
  for (auto& [k, v] : fs_node.raw().items()) p.findings.push_back(read_finding(file, fs_node, k, p));
  std::sort(p.findings.begin(), p.findings.end(), [](auto& x, auto& y) { return x.id < y.id; });
  if (p.findings.empty()) fail("{}: field 'findings' is empty", file);
  check_finding_d_lengths(file, p);
  return p;
}

}  // namespace hlm::study
