#include "study/sweep_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "model/config.h"
#include "study/json_file.h"
#include "train/trainer.h"  // TrainConfig: the defaults of batch, seq_len and grad_accum

namespace hlm::study {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::set<std::string> kPlanKeys = {"out", "data", "tokenizer", "archs", "sizes", "budgets", "budget_unit",
                                         "train", "description"};
// Train flags the sweep sets itself.
const std::set<std::string> kReservedTrainKeys = {"steps", "out", "resume", "preset", "config", "set",
                                                  "data", "tokenizer", "json", "help"};

bool safe_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

std::string budget_label(long b, const std::string& unit) {
  if (unit == "steps") return std::to_string(b);
  if (b % 1000000000 == 0) return std::to_string(b / 1000000000) + "Gtok";
  if (b % 1000000 == 0) return std::to_string(b / 1000000) + "Mtok";
  if (b % 1000 == 0) return std::to_string(b / 1000) + "ktok";
  return std::to_string(b) + "tok";
}

// A JSON number that is a whole positive count (100 or 1e6, not 2.5 or -1).
bool whole_positive(const json& v, long* out) {
  if (!v.is_number()) return false;
  const double d = v.get<double>();
  if (!(d >= 1) || d != std::floor(d) || d > 9e15) return false;
  *out = static_cast<long>(d);
  return true;
}

std::vector<std::string> string_list(const json& v, const std::string& file, const std::string& field) {
  if (!v.is_array()) fail("{}: field '{}' must be an array of \"key=value\" strings", file, field);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get<std::string>().find('=') == std::string::npos)
      fail("{}: field '{}[{}]' must be a \"key=value\" string", file, field, i);
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::string set_key(const std::string& s) { return s.substr(0, s.find('=')); }

}  // namespace

namespace {

// The plan's train flags, checked against the real `train` subcommand, as arguments; batch, seq_len and
// grad_accum (the defaults of TrainConfig unless given) give the tokens per step.
std::vector<std::string> read_sweep_train_flags(const std::string& file, const json& j,
                                                const TrainOptionKind& train_option, double& tokens_per_step) {
  std::vector<std::string> train_args;
  TrainConfig tdef;
  double batch = static_cast<double>(tdef.batch), seq_len = static_cast<double>(tdef.seq_len), accum = tdef.grad_accum;
  if (j.contains("train")) {
    const json& t = j["train"];
    if (!t.is_object()) fail("{}: field 'train' must be an object of train flags (e.g. {{\"batch\": 8}})", file);
    for (auto& [k, v] : t.items()) {
      std::string flag = k;
      std::replace(flag.begin(), flag.end(), '_', '-');
      const std::string field = "train." + k;
      if (kReservedTrainKeys.count(flag))
        fail("{}: field '{}' is set by the sweep (budgets give --steps; out/data/tokenizer are plan fields; "
             "archs/sizes give the model)", file, field);
      const int kind = train_option("--" + flag);
      if (kind < 0) fail("{}: field '{}': `hybridlm train` has no option --{}", file, field, flag);
      const bool is_flag = kind == 0;
      if (is_flag) {
        if (!v.is_boolean()) fail("{}: field '{}' is a switch: use true or false", file, field);
        if (v.get<bool>()) train_args.push_back("--" + flag);
        continue;
      }
      auto text = [&](const json& x) -> std::string {
        if (x.is_number_integer()) return std::to_string(x.get<long long>());
        if (x.is_number()) return fmt::format("{}", x.get<double>());
        if (x.is_string()) return x.get<std::string>();
        fail("{}: field '{}' must be a number, a string, or a list of them", file, field);
      };
      for (const json& x : v.is_array() ? v : json::array({v})) {  // a list repeats the flag
        train_args.push_back("--" + flag);
        train_args.push_back(text(x));
      }
      if (flag == "batch" || flag == "seq-len" || flag == "grad-accum") {
        long n = 0;
        if (!whole_positive(v, &n)) fail("{}: field '{}' must be a positive integer", file, field);
        (flag == "batch" ? batch : flag == "seq-len" ? seq_len : accum) = static_cast<double>(n);
      }
    }
  }
  tokens_per_step = batch * seq_len * accum;
  return train_args;
}

// budgets: step counts, or token counts with budget_unit "tokens".
std::vector<long> read_sweep_budgets(const std::string& file, const json& j, const std::string& budget_unit) {
  if (!j.contains("budgets")) fail("{}: field 'budgets' is missing (a list of step counts, or tokens with budget_unit)", file);
  if (!j["budgets"].is_array() || j["budgets"].empty()) fail("{}: field 'budgets' must be a non-empty array", file);
  std::vector<long> budgets;
  for (size_t i = 0; i < j["budgets"].size(); ++i) {
    long b = 0;
    if (!whole_positive(j["budgets"][i], &b))
      fail("{}: field 'budgets[{}]' must be a positive whole number of {}", file, i, budget_unit);
    budgets.push_back(b);
  }
  return budgets;
}

struct SweepArch {
  std::string name, preset, config;
  std::vector<std::string> sets;
};

// archs: preset names or {"name", "preset", "config", "set"}.
std::vector<SweepArch> read_sweep_archs(const std::string& file, const json& j) {
  if (!j.contains("archs")) fail("{}: field 'archs' is missing (presets like \"swa128\" or objects)", file);
  if (!j["archs"].is_array() || j["archs"].empty()) fail("{}: field 'archs' must be a non-empty array", file);
  std::vector<SweepArch> archs;
  for (size_t i = 0; i < j["archs"].size(); ++i) {
    const json& a = j["archs"][i];
    const std::string field = fmt::format("archs[{}]", i);
    SweepArch ar;
    if (a.is_string()) {
      ar.name = ar.preset = a.get<std::string>();
    } else if (a.is_object()) {
      for (auto& [k, v] : a.items())
        if (k != "name" && k != "preset" && k != "config" && k != "set")
          fail("{}: unknown field '{}.{}' (known: name, preset, config, set)", file, field, k);
      if (!a.contains("name") || !a["name"].is_string()) fail("{}: field '{}.name' must be a string", file, field);
      ar.name = a["name"].get<std::string>();
      if (a.contains("preset")) {
        if (!a["preset"].is_string()) fail("{}: field '{}.preset' must be a string", file, field);
        ar.preset = a["preset"].get<std::string>();
      }
      if (a.contains("config")) {
        if (!a["config"].is_string()) fail("{}: field '{}.config' must be a string (a model config file)", file, field);
        ar.config = a["config"].get<std::string>();
      }
      if (a.contains("set")) ar.sets = string_list(a["set"], file, field + ".set");
    } else {
      fail("{}: field '{}' must be a preset name or an object {{\"name\", \"preset\", \"config\", \"set\"}}", file, field);
    }
    if (!safe_name(ar.name)) fail("{}: field '{}.name' \"{}\" must use only letters, digits, '-', '_', '.'", file, field, ar.name);
    if (!ar.preset.empty()) {
      try {
        preset_json(ar.preset);
      } catch (const Error& e) {
        fail("{}: field '{}': {}", file, a.is_string() ? field : field + ".preset", e.what());
      }
    }
    for (auto& o : archs)
      if (o.name == ar.name) fail("{}: field '{}.name': \"{}\" is used twice", file, field, ar.name);
    archs.push_back(ar);
  }
  return archs;
}

struct SweepSize {
  std::string name;
  std::vector<std::string> sets;
};

// sizes: {"name", "set"}; absent = one size "base" with the arch's own dimensions.
std::vector<SweepSize> read_sweep_sizes(const std::string& file, const json& j) {
  std::vector<SweepSize> sizes;
  if (j.contains("sizes")) {
    if (!j["sizes"].is_array() || j["sizes"].empty()) fail("{}: field 'sizes' must be a non-empty array", file);
    for (size_t i = 0; i < j["sizes"].size(); ++i) {
      const json& s = j["sizes"][i];
      const std::string field = fmt::format("sizes[{}]", i);
      if (!s.is_object()) fail("{}: field '{}' must be an object {{\"name\", \"set\"}}", file, field);
      for (auto& [k, v] : s.items())
        if (k != "name" && k != "set") fail("{}: unknown field '{}.{}' (known: name, set)", file, field, k);
      if (!s.contains("name") || !s["name"].is_string()) fail("{}: field '{}.name' must be a string", file, field);
      SweepSize sz{s["name"].get<std::string>(), {}};
      if (!safe_name(sz.name))
        fail("{}: field '{}.name' \"{}\" must use only letters, digits, '-', '_', '.'", file, field, sz.name);
      if (s.contains("set")) sz.sets = string_list(s["set"], file, field + ".set");
      for (auto& o : sizes)
        if (o.name == sz.name) fail("{}: field '{}.name': \"{}\" is used twice", file, field, sz.name);
      sizes.push_back(sz);
    }
  } else {
    sizes.push_back({"base", {}});
  }
  return sizes;
}

// The runs: every arch x size (their sets must not overlap, and must resolve to a model) x budget.
void plan_sweep_runs(const std::string& file, const std::vector<SweepArch>& archs, const std::vector<SweepSize>& sizes,
                     const std::vector<long>& budgets, const std::vector<std::string>& train_args, SweepPlan& p) {
  std::set<std::string> names;
  for (size_t ai = 0; ai < archs.size(); ++ai)
    for (size_t si = 0; si < sizes.size(); ++si) {
      const SweepArch& a = archs[ai];
      const SweepSize& s = sizes[si];
      std::set<std::string> arch_keys;
      for (auto& x : a.sets) arch_keys.insert(set_key(x));
      for (auto& x : s.sets)
        if (arch_keys.count(set_key(x)))
          fail("{}: archs[{}] ({}) and sizes[{}] ({}) both set '{}'; set it in one place", file, ai, a.name, si, s.name,
               set_key(x));
      std::vector<std::string> sets = a.sets;
      sets.insert(sets.end(), s.sets.begin(), s.sets.end());
      ModelConfig cfg;
      try {
        cfg = resolve_config(a.preset, a.config, sets);
      } catch (const Error& e) {
        fail("{}: archs[{}] ({}) x sizes[{}] ({}): {}", file, ai, a.name, si, s.name, e.what());
      }
      std::vector<std::string> model_args;
      if (!a.preset.empty()) model_args.insert(model_args.end(), {"--preset", a.preset});
      if (!a.config.empty()) model_args.insert(model_args.end(), {"--config", a.config});
      for (auto& x : sets) model_args.insert(model_args.end(), {"--set", x});
      for (long b : budgets) {
        PlannedRun r;
        r.arch = a.name;
        r.size = s.name;
        r.budget = b;
        r.steps = p.budget_unit == "steps" ? b : static_cast<long>(std::ceil(static_cast<double>(b) / p.tokens_per_step));
        r.tokens = static_cast<double>(r.steps) * p.tokens_per_step;
        r.name = a.name + "-" + s.name + "-" + budget_label(b, p.budget_unit);
        if (!names.insert(r.name).second) fail("{}: field 'budgets': run name {} occurs twice", file, r.name);
        r.dir = (fs::path(p.out) / r.name).string();
        r.model_args = model_args;
        r.train_args = train_args;
        r.model_config = cfg.to_json();
        p.runs.push_back(std::move(r));
      }
    }
}

}  // namespace

SweepPlan load_sweep_plan(const std::string& file, const TrainOptionKind& train_option) {
  const json j = read_json_file(file, " the plan file");
  if (!j.is_object()) fail("{}: a plan must be a JSON object", file);
  for (auto& [k, v] : j.items())
    if (!kPlanKeys.count(k))
      fail("{}: unknown field '{}' (known: out, data, tokenizer, archs, sizes, budgets, budget_unit, train, description)",
           file, k);
  SweepPlan p;
  p.file = file;
  auto str = [&](const char* k, std::string& dst, bool required) {
    if (!j.contains(k)) {
      if (required) fail("{}: field '{}' is missing", file, k);
      return;
    }
    if (!j[k].is_string() || j[k].get<std::string>().empty()) fail("{}: field '{}' must be a non-empty string", file, k);
    dst = j[k].get<std::string>();
  };
  str("out", p.out, true);
  str("data", p.data, false);
  str("tokenizer", p.tokenizer, false);
  str("budget_unit", p.budget_unit, false);
  if (p.budget_unit != "steps" && p.budget_unit != "tokens")
    fail("{}: field 'budget_unit' must be \"steps\" or \"tokens\", got \"{}\"", file, p.budget_unit);
  const std::vector<std::string> train_args = read_sweep_train_flags(file, j, train_option, p.tokens_per_step);
  const std::vector<long> budgets = read_sweep_budgets(file, j, p.budget_unit);
  const std::vector<SweepArch> archs = read_sweep_archs(file, j);
  const std::vector<SweepSize> sizes = read_sweep_sizes(file, j);
  plan_sweep_runs(file, archs, sizes, budgets, train_args, p);
  return p;
}

}  // namespace hlm::study
