#include "model/config.h"

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/file_io.h"

namespace hlm {

namespace {

const std::set<std::string> kTopKeys = {
    "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size", "max_seq_len",
    "pattern", "window", "rope_theta", "norm_eps", "init_scale", "chunk_size", "mamba_d_state", "mamba_expand",
    "mlp_activation", "sandwich_norm", "scale_embeddings", "tie_embeddings", "layer_types"};
const std::set<std::string> kTypeKeys = {"rope",         "window",        "n_heads",    "n_kv_heads",
                                         "head_dim",     "qk_norm",       "a_init_range", "dt_init_range",
                                         "rope_theta",   "query_pre_attn_scalar"};

const std::map<std::string, MlpActivation> kMlpActivations = {{"swiglu", MlpActivation::swiglu},
                                                              {"geglu_tanh", MlpActivation::geglu_tanh}};
std::string mlp_activation_name(MlpActivation a) {
  for (const auto& [name, value] : kMlpActivations)
    if (value == a) return name;
  return "?";
}

// Defaults of the M / G decay and step-size init ranges (docs/algorithms.md §4.4: mamba_ssm A_init_range (1, 16),
// fla GDN A ~ U[0, 16]; dt_min 1e-3, dt_max 0.1 for both).
std::array<double, 2> default_a_init_range(char ch) {
  return ch == 'M' ? std::array<double, 2>{1, 16} : std::array<double, 2>{0, 16};
}
constexpr std::array<double, 2> kDefaultDtInitRange{1e-3, 0.1};

// Upper bounds per field, each far past the largest published model (126 layers, d_model 16384, 128 heads,
// d_ff 53248, vocabularies of 256K): a config beyond them is a typo, refused before any estimate or allocation.
// They also keep the size arithmetic (products of a few fields) inside 64 bits.
constexpr i64 kMaxInt = i64{1} << 31;
i64 max_of(const std::string& key) {
  static const std::map<std::string, i64> kMax = {
      {"n_layers", 4096},        {"d_model", 1 << 17},     {"n_heads", 1 << 14},    {"n_kv_heads", 1 << 14},
      {"head_dim", 1 << 14},     {"d_ff", 1 << 20},        {"vocab_size", 1 << 24}, {"max_seq_len", 1 << 30},
      {"window", 1 << 30},       {"chunk_size", 1 << 16},  {"mamba_d_state", 1 << 14}, {"mamba_expand", 64}};
  auto it = kMax.find(key);
  return it == kMax.end() ? kMaxInt : it->second;
}

i64 get_int(const json& j, const char* key, i64 def, const std::string& src, i64 min_value = 1) {
  if (!j.contains(key)) return def;
  const json& v = j.at(key);
  if (!v.is_number_integer())
    fail("{}: field '{}' must be an integer, got {}", src, key, v.dump());
  i64 x = v.get<i64>();
  if (x < min_value) fail("{}: field '{}' must be >= {}, got {}", src, key, min_value, x);
  const i64 max_value = max_of(key);
  if (x > max_value) fail("{}: field '{}' must be <= {}, got {}", src, key, max_value, x);
  return x;
}
double get_num(const json& j, const char* key, double def, const std::string& src) {
  if (!j.contains(key)) return def;
  const json& v = j.at(key);
  if (!v.is_number()) fail("{}: field '{}' must be a number, got {}", src, key, v.dump());
  return v.get<double>();
}
// [lo, hi] with min_lo <= lo <= hi (min_lo excluded when strictly is set).
std::array<double, 2> get_range(const json& j, const char* key, std::array<double, 2> def, const std::string& src,
                                double min_lo, bool strictly) {
  if (!j.contains(key)) return def;
  const json& v = j.at(key);
  if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number())
    fail("{}: field '{}' must be a pair of numbers [lo, hi], got {}", src, key, v.dump());
  const std::array<double, 2> r{v[0].get<double>(), v[1].get<double>()};
  if (r[0] < min_lo || (strictly && r[0] == min_lo) || r[1] < r[0])
    fail("{}: field '{}' needs {} {} lo <= hi, got {}", src, key, min_lo, strictly ? "<" : "<=", v.dump());
  return r;
}
bool get_bool(const json& j, const char* key, bool def, const std::string& src) {
  if (!j.contains(key)) return def;
  const json& v = j.at(key);
  if (!v.is_boolean()) fail("{}: field '{}' must be true or false, got {}", src, key, v.dump());
  return v.get<bool>();
}

}  // namespace

std::string ModelConfig::layer_pattern() const {
  std::string s;
  for (i64 l = 0; l < n_layers; ++l) s += letter(l);
  return s;
}

float ModelConfig::embedding_scale() const {
  return scale_embeddings ? static_cast<float>(std::sqrt(static_cast<double>(d_model))) : 1.f;
}

const LayerTypeOptions& ModelConfig::type(char c) const {
  auto it = types.find(c);
  if (it == types.end()) fail("config: no options for layer type '{}'", c);
  return it->second;
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& src) {
  if (!j.is_object()) fail("{}: config must be a JSON object", src);
  for (auto& [k, v] : j.items())
    if (!kTopKeys.count(k)) fail("{}: unknown config key '{}'", src, k);
  ModelConfig c;
  c.d_model = get_int(j, "d_model", c.d_model, src);
  c.n_layers = get_int(j, "n_layers", c.n_layers, src);
  c.n_heads = get_int(j, "n_heads", c.n_heads, src);
  c.n_kv_heads = get_int(j, "n_kv_heads", c.n_heads, src);
  c.head_dim = get_int(j, "head_dim", c.d_model / c.n_heads, src);
  c.d_ff = get_int(j, "d_ff", c.d_ff, src);
  c.vocab_size = get_int(j, "vocab_size", c.vocab_size, src, 2);
  c.max_seq_len = get_int(j, "max_seq_len", c.max_seq_len, src);
  c.window = get_int(j, "window", c.window, src);
  c.rope_theta = get_num(j, "rope_theta", c.rope_theta, src);
  c.norm_eps = get_num(j, "norm_eps", c.norm_eps, src);
  c.init_scale = get_num(j, "init_scale", c.init_scale, src);
  c.chunk_size = get_int(j, "chunk_size", c.chunk_size, src);
  c.mamba_d_state = get_int(j, "mamba_d_state", c.mamba_d_state, src);
  c.mamba_expand = get_int(j, "mamba_expand", c.mamba_expand, src);
  if (c.rope_theta <= 0) fail("{}: field 'rope_theta' must be > 0", src);
  if (c.norm_eps <= 0) fail("{}: field 'norm_eps' must be > 0", src);
  if (!(c.init_scale > 0)) fail("{}: field 'init_scale' must be > 0", src);
  c.sandwich_norm = get_bool(j, "sandwich_norm", c.sandwich_norm, src);
  c.scale_embeddings = get_bool(j, "scale_embeddings", c.scale_embeddings, src);
  c.tie_embeddings = get_bool(j, "tie_embeddings", c.tie_embeddings, src);
  if (j.contains("mlp_activation")) {
    const json& v = j.at("mlp_activation");
    if (!v.is_string() || !kMlpActivations.count(v.get<std::string>()))
      fail("{}: field 'mlp_activation' must be \"swiglu\" or \"geglu_tanh\", got {}", src, v.dump());
    c.mlp_activation = kMlpActivations.at(v.get<std::string>());
  }
  if (j.contains("pattern")) {
    if (!j["pattern"].is_string()) fail("{}: field 'pattern' must be a string like \"SSSF\"", src);
    c.pattern = j["pattern"].get<std::string>();
  }
  if (c.pattern.empty()) fail("{}: field 'pattern' is empty", src);
  if (static_cast<i64>(c.pattern.size()) > max_of("n_layers"))
    fail("{}: field 'pattern' has {} letters, more than the most layers a model may have ({})", src,
         c.pattern.size(), max_of("n_layers"));
  for (char ch : c.pattern)
    if (std::string(kMixerLetters).find(ch) == std::string::npos)
      fail("{}: field 'pattern' has unknown layer letter '{}' (known: F full attention, S sliding window, "
           "L Lightning, M Mamba-2, G Gated DeltaNet)", src, ch);
  if (c.n_heads % c.n_kv_heads != 0)
    fail("{}: n_heads ({}) must be a multiple of n_kv_heads ({})", src, c.n_heads, c.n_kv_heads);

  json lt = j.value("layer_types", json::object());
  if (!lt.is_object()) fail("{}: field 'layer_types' must be an object keyed by layer letter", src);
  for (auto& [k, v] : lt.items()) {
    if (k.size() != 1 || std::string(kMixerLetters).find(k[0]) == std::string::npos)
      fail("{}: field 'layer_types' has unknown layer letter '{}'", src, k);
    if (!v.is_object()) fail("{}: field 'layer_types.{}' must be an object", src, k);
    for (auto& [kk, vv] : v.items())
      if (!kTypeKeys.count(kk)) fail("{}: unknown key 'layer_types.{}.{}'", src, k, kk);
  }
  for (char ch : std::string(kMixerLetters)) {
    // Options of a type the pattern does not use are parsed but not cross-checked: an all-attention model must not
    // be refused by a Mamba-2 width rule.
    const bool used = c.pattern.find(ch) != std::string::npos;
    json t = lt.value(std::string(1, ch), json::object());
    std::string tsrc = src;
    LayerTypeOptions o;
    o.rope = get_bool(t, "rope", true, tsrc);
    o.qk_norm = get_bool(t, "qk_norm", false, tsrc);
    o.n_heads = get_int(t, "n_heads", c.n_heads, tsrc);
    o.n_kv_heads = get_int(t, "n_kv_heads", ch == 'F' || ch == 'S' ? std::min(c.n_kv_heads, o.n_heads) : o.n_heads, tsrc);
    o.head_dim = get_int(t, "head_dim", c.head_dim, tsrc);
    o.window = ch == 'S' ? get_int(t, "window", c.window, tsrc) : 0;
    if (ch != 'S' && t.contains("window"))
      fail("{}: 'layer_types.{}.window' is only meaningful for S (sliding window) layers", src, ch);
    for (const char* k : {"a_init_range", "dt_init_range"})
      if (ch != 'M' && ch != 'G' && t.contains(k))
        fail("{}: 'layer_types.{}.{}' is only meaningful for M (Mamba-2) and G (Gated DeltaNet) layers", src, ch, k);
    for (const char* k : {"rope_theta", "query_pre_attn_scalar"})
      if (ch != 'F' && ch != 'S' && t.contains(k))
        fail("{}: 'layer_types.{}.{}' is only meaningful for F and S (attention) layers", src, ch, k);
    const std::string rsrc = fmt::format("{}: layer_types.{}", src, ch);
    o.a_init_range = get_range(t, "a_init_range", default_a_init_range(ch), rsrc, 0, false);
    o.dt_init_range = get_range(t, "dt_init_range", kDefaultDtInitRange, rsrc, 0, true);
    o.rope_theta = get_num(t, "rope_theta", c.rope_theta, rsrc);
    o.query_pre_attn_scalar = get_num(t, "query_pre_attn_scalar", 0, rsrc);
    if (!(o.rope_theta > 0)) fail("{}: field 'rope_theta' must be > 0", rsrc);
    if (t.contains("query_pre_attn_scalar") && !(o.query_pre_attn_scalar > 0))
      fail("{}: field 'query_pre_attn_scalar' must be > 0", rsrc);
    if (used && o.head_dim < 1)
      fail("{}: layer_types.{}: head_dim defaults to d_model / n_heads = 0; set head_dim or use fewer heads", src, ch);
    if (used && o.n_heads % o.n_kv_heads != 0)
      fail("{}: layer_types.{}: n_heads ({}) must be a multiple of n_kv_heads ({})", src, ch, o.n_heads,
           o.n_kv_heads);
    if (used && o.head_dim % 2 != 0 && o.rope && (ch == 'F' || ch == 'S'))
      fail("{}: layer_types.{}: head_dim ({}) must be even for RoPE", src, ch, o.head_dim);
    if (used && ch == 'M' && (c.mamba_expand * c.d_model) % o.head_dim != 0)
      fail("{}: Mamba-2 inner width mamba_expand*d_model ({}) must be a multiple of layer_types.M.head_dim ({})",
           src, c.mamba_expand * c.d_model, o.head_dim);
    c.types[ch] = o;
  }
  return c;
}

json ModelConfig::to_json() const {
  json j = {{"d_model", d_model}, {"n_layers", n_layers}, {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads},
            {"head_dim", head_dim}, {"d_ff", d_ff}, {"vocab_size", vocab_size}, {"max_seq_len", max_seq_len},
            {"pattern", pattern}, {"window", window}, {"rope_theta", rope_theta}, {"norm_eps", norm_eps},
            {"chunk_size", chunk_size}, {"mamba_d_state", mamba_d_state}, {"mamba_expand", mamba_expand}};
  json lt = json::object();
  for (char ch : std::string(kMixerLetters)) {
    if (pattern.find(ch) == std::string::npos) continue;
    const auto& o = type(ch);
    json t = {{"rope", o.rope}, {"n_heads", o.n_heads}, {"n_kv_heads", o.n_kv_heads}, {"head_dim", o.head_dim},
              {"qk_norm", o.qk_norm}};
    if (ch == 'S') t["window"] = o.window;
    if ((ch == 'F' || ch == 'S') && o.rope_theta != rope_theta) t["rope_theta"] = o.rope_theta;
    if ((ch == 'F' || ch == 'S') && o.query_pre_attn_scalar > 0) t["query_pre_attn_scalar"] = o.query_pre_attn_scalar;
    // Only when changed: config files written before these keys existed stay byte-identical.
    if ((ch == 'M' || ch == 'G') && o.a_init_range != default_a_init_range(ch)) t["a_init_range"] = o.a_init_range;
    if ((ch == 'M' || ch == 'G') && o.dt_init_range != kDefaultDtInitRange) t["dt_init_range"] = o.dt_init_range;
    lt[std::string(1, ch)] = t;
  }
  j["layer_types"] = lt;
  if (init_scale != 1.0) j["init_scale"] = init_scale;  // only when set: older config files stay byte-identical
  if (mlp_activation != MlpActivation::swiglu) j["mlp_activation"] = mlp_activation_name(mlp_activation);
  if (sandwich_norm) j["sandwich_norm"] = true;
  if (scale_embeddings) j["scale_embeddings"] = true;
  if (tie_embeddings) j["tie_embeddings"] = true;
  return j;
}

std::vector<std::string> preset_names() {
  return {"full", "swa128", "swa128-nope", "swa512", "swa2048", "lightning", "mamba2", "gdn", "gemma3-small"};
}

json preset_json(const std::string& name) {
  // The benchmark size of the issues: d_model 256, 4 heads of 64, SwiGLU 768, vocab 4096, 8 layers.
  json base = {{"d_model", 256}, {"n_layers", 8}, {"n_heads", 4}, {"n_kv_heads", 4}, {"head_dim", 64},
               {"d_ff", 768}, {"vocab_size", 4096}, {"max_seq_len", 1024}, {"rope_theta", 10000.0}};
  auto swa = [&](int w, bool full_rope) {
    json j = base;
    j["pattern"] = "SSSF";
    j["window"] = w;
    j["layer_types"] = {{"S", {{"rope", true}}}, {"F", {{"rope", full_rope}}}};
    return j;
  };
  auto efficient = [&](const char* pat) {
    json j = base;
    j["pattern"] = pat;
    j["layer_types"] = {{"F", {{"rope", true}}}};
    return j;
  };
  if (name == "full") {
    json j = base;
    j["pattern"] = "F";
    j["layer_types"] = {{"F", {{"rope", true}}}};
    return j;
  }
  if (name == "swa128") return swa(128, true);
  if (name == "swa128-nope") return swa(128, false);
  if (name == "swa512") return swa(512, true);
  if (name == "swa2048") return swa(2048, true);
  if (name == "lightning") return efficient("LLLF");
  if (name == "mamba2") return efficient("MMMF");
  if (name == "gdn") return efficient("GGGF");
  if (name == "gemma3-small") {
    // Gemma 3's block at the benchmark width (docs/model.md "Gemma 3"): five sliding layers then one full, one KV
    // head, QK-norm, sandwich norms, GeGLU, scaled and tied embeddings, a RoPE base per layer type.
    json j = base;
    j["n_layers"] = 6;
    j["n_kv_heads"] = 1;
    j["pattern"] = "SSSSSF";
    j["window"] = 128;
    j["rope_theta"] = 1000000.0;
    j["mlp_activation"] = "geglu_tanh";
    j["sandwich_norm"] = true;
    j["scale_embeddings"] = true;
    j["tie_embeddings"] = true;
    j["layer_types"] = {{"S", {{"rope_theta", 10000.0}, {"qk_norm", true}, {"query_pre_attn_scalar", 64}}},
                        {"F", {{"qk_norm", true}, {"query_pre_attn_scalar", 64}}}};
    return j;
  }
  std::string known;
  for (auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown preset '{}' (known: {})", name, known);
}

void apply_override(json& j, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("--set '{}': expected key=value (e.g. --set d_model=64)", assignment);
  std::string key = assignment.substr(0, eq), val = assignment.substr(eq + 1);
  json value;
  try {
    value = json::parse(val);
  } catch (const json::exception&) {
    value = val;
  }
  json* node = &j;
  size_t pos = 0;
  while (true) {
    auto dot = key.find('.', pos);
    std::string part = key.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (part.empty()) fail("--set '{}': empty key component", assignment);
    if (dot == std::string::npos) {
      (*node)[part] = value;
      break;
    }
    if (!node->contains(part)) (*node)[part] = json::object();
    node = &(*node)[part];
    if (!node->is_object()) fail("--set '{}': '{}' is not an object", assignment, part);
    pos = dot + 1;
  }
}

ModelConfig resolve_config(const std::string& preset, const std::string& config_file,
                           const std::vector<std::string>& overrides) {
  json j = json::object();
  std::string src = preset.empty() ? "default config" : "preset '" + preset + "'";
  if (!preset.empty()) j = preset_json(preset);
  if (!config_file.empty()) {
    const std::string text = read_text_file(config_file, "config file", std::size_t{16} << 20);
    json fj;
    try {
      fj = json::parse(text);
    } catch (const json::exception& e) {  // also out_of_range: a number too large
      fail("{}: malformed JSON: {}", config_file, e.what());
    }
    if (!fj.is_object()) fail("{}: config must be a JSON object", config_file);
    if (fj.contains("model") && fj["model"].is_object()) fj = fj["model"];  // a run's config.json
    for (auto& [k, v] : fj.items()) {
      if (k == "layer_types" && j.contains("layer_types") && v.is_object())
        j["layer_types"].merge_patch(v);
      else
        j[k] = v;
    }
    src = config_file;
  }
  for (auto& o : overrides) apply_override(j, o);
  if (!overrides.empty()) src += " (with --set overrides)";
  return ModelConfig::from_json(j, src);
}

}  // namespace hlm
