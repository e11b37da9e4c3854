#include "data/vocab_tokenizer.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/file_io.h"
#include "data/byte_level_bpe.h"
#include "data/spm_vocab_tokenizer.h"

namespace hlm::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "hybridlm-gguf-vocab";

// The pre-tokenizer regexes, as the Hugging Face tokenizer.json files of each family write them. llama.cpp's
// tokenizer.ggml.pre names them; it applies a list of regexes one after another, each splitting the pieces the
// previous one left into its matches and the text between them (a `Split` with behaviour `Isolated`).
const char* const kGpt2Regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* const kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct PreTokenizerSpec {
  std::vector<std::string> regexes;
  bool ignore_merges = false;  // a piece that is itself a token is that token (Llama 3)
  bool default_add_bos = false;
};

// tokenizer.ggml.pre -> what llama.cpp (src/llama-vocab.cpp, llm_tokenizer_bpe) runs for it.
const std::unordered_map<std::string, PreTokenizerSpec>& pre_tokenizers() {
  static const std::unordered_map<std::string, PreTokenizerSpec> table = [] {
    std::unordered_map<std::string, PreTokenizerSpec> t;
    // No name, or "default": llama.cpp's fallback, which it warns degrades generation.
    const PreTokenizerSpec fallback{{"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2Regex, "\\p{N}+", "[0-9][0-9][0-9]"}};
    t[""] = fallback;
    t["default"] = fallback;
    for (const char* name : {"gpt-2", "phi-2", "mpt", "olmo"}) t[name] = {{kGpt2Regex}};
    for (const char* name : {"llama3", "llama-v3", "llama-bpe"}) t[name] = {{kLlama3Regex}, true, true};
    for (const char* name : {"qwen2", "deepseek-r1-qwen", "stablelm2"}) t[name] = {{kQwen2Regex}};
    for (const char* name : {"smollm", "starcoder", "refact"}) t[name] = {{"\\p{N}", kGpt2Regex}};
    return t;
  }();
  return table;
}

std::string known_pre_names() {
  std::vector<std::string> names;
  for (const auto& [name, spec] : pre_tokenizers())
    if (!name.empty()) names.push_back(name);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The special ids after llama.cpp's defaults for the model, each checked against the vocabulary.
struct SpecialIds {
  std::int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
};

SpecialIds special_ids(const TokenizerVocab& v, const std::string& where) {
  const std::int64_t n = static_cast<std::int64_t>(v.tokens.size());
  for (const auto& [key, id] : {std::pair{"bos_token_id", v.bos},
                                {"eos_token_id", v.eos},
                                {"unknown_token_id", v.unk},
                                {"padding_token_id", v.pad}})
    if (id != -1 && (id < 0 || id >= n))
      fail("{}: tokenizer.ggml.{} = {} is outside the vocabulary of {} tokens", where, key, id, n);
  const bool spm = v.model == "llama";
  // llama.cpp's defaults for a key that is absent: <unk> 0, <s> 1, </s> 2 for SentencePiece vocabularies.
  auto or_default = [&](std::int64_t id, std::int64_t fallback) {
    return static_cast<std::int32_t>(id >= 0 ? id : (spm && fallback < n ? fallback : -1));
  };
  SpecialIds s;
  s.bos = or_default(v.bos, 1);
  s.eos = or_default(v.eos, 2);
  s.unk = or_default(v.unk, 0);
  const bool pre_adds_bos = !spm && pre_tokenizers().count(v.pre) && pre_tokenizers().at(v.pre).default_add_bos;
  s.add_bos = v.add_bos.value_or(spm || pre_adds_bos);
  s.add_eos = v.add_eos.value_or(false);
  s.add_space_prefix = v.add_space_prefix.value_or(spm);
  if (s.eos < 0) fail("{}: tokenizer.ggml.eos_token_id is missing; hybridlm needs it to separate documents", where);
  if (s.add_bos && s.bos < 0)
    fail("{}: tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing", where);
  if (s.add_eos && s.eos < 0)
    fail("{}: tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is missing", where);
  return s;
}

// The checks every model shares; returns the tokens with llama.cpp's name for an empty one.
std::vector<std::string> checked_tokens(const TokenizerVocab& v, const std::string& where) {
  const size_t n = v.tokens.size();
  if (n == 0) fail("{}: tokenizer.ggml.tokens is missing or empty", where);
  if (n >= static_cast<size_t>(INT32_MAX))
    fail("{}: tokenizer.ggml.tokens has {} tokens, more than ids can number", where, n);
  if (!v.scores.empty() && v.scores.size() != n)
    fail("{}: tokenizer.ggml.scores has {} entries for {} tokens", where, v.scores.size(), n);
  if (!v.token_type.empty() && v.token_type.size() != n)
    fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", where, v.token_type.size(), n);
  for (size_t i = 0; i < v.scores.size(); ++i)
    if (!std::isfinite(v.scores[i])) fail("{}: tokenizer.ggml.scores[{}] is not a finite number", where, i);
  for (size_t i = 0; i < v.token_type.size(); ++i)
    if (v.token_type[i] < 0 || v.token_type[i] > 6)
      fail("{}: tokenizer.ggml.token_type[{}] = {} is not a token type (0..6)", where, i, v.token_type[i]);
  std::vector<std::string> tokens = v.tokens;
  std::unordered_map<std::string_view, size_t> seen;
  seen.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i].empty()) tokens[i] = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp names it
    auto [it, fresh] = seen.emplace(tokens[i], i);
    if (!fresh) fail("{}: tokenizer.ggml.tokens[{}] '{}' repeats token {}", where, i, tokens[i], it->second);
  }
  return tokens;
}

TokenType type_of(const TokenizerVocab& v, size_t id) {
  return v.token_type.empty() ? TokenType::kNormal : static_cast<TokenType>(v.token_type[id]);
}

// A gpt2 vocabulary as the tokenizer.json ByteLevelBpeTokenizer reads: every token in the BPE vocabulary,
// user-defined tokens also as added tokens (cut out of the text before BPE, as llama.cpp does; control tokens
// are not, as with its parse_special off), the named pre-tokenizer, no normalizer (llama.cpp has none).
std::unique_ptr<Tokenizer> make_gpt2(const TokenizerVocab& v, const std::vector<std::string>& tokens,
                                     const SpecialIds& ids, const std::string& where, const std::string& spec) {
  auto pre = pre_tokenizers().find(v.pre);
  if (pre == pre_tokenizers().end())
    fail("{}: tokenizer.ggml.pre '{}' is not a pre-tokenizer hybridlm knows (it runs: {})", where, v.pre,
         known_pre_names());
  if (v.merges.empty())
    fail("{}: tokenizer.ggml.merges is missing or empty (a gpt2 vocabulary needs its merges)", where);
  json vocab = json::object(), added = json::array();
  ByteLevelBpeTokenizer::Specials specials;
  for (size_t id = 0; id < tokens.size(); ++id) {
    vocab[tokens[id]] = id;
    const TokenType type = type_of(v, id);
    if (type == TokenType::kUserDefined) {
      added.push_back({{"id", id}, {"content", tokens[id]}, {"special", false}, {"normalized", false}});
      specials.raw_decode.push_back(static_cast<std::int32_t>(id));
    }
    // llama.cpp decodes these to nothing.
    if (type != TokenType::kNormal && type != TokenType::kUserDefined && type != TokenType::kByte)
      specials.silent.push_back(static_cast<std::int32_t>(id));
  }
  json merges = json::array();
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const size_t sp = m.find(' ', 1);  // the first space after the first character, as llama.cpp splits
    if (sp == std::string::npos || sp + 1 >= m.size())
      fail("{}: tokenizer.ggml.merges[{}] '{}' is not two tokens separated by a space", where, r, m);
    merges.push_back(json::array({m.substr(0, sp), m.substr(sp + 1)}));
  }
  json steps = json::array();
  for (const std::string& regex : pre->second.regexes)
    steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}});
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}});
  const json tokenizer = {
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", steps}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", pre->second.ignore_merges}}}};
  specials.eos = ids.eos, specials.bos = ids.bos, specials.add_bos = ids.add_bos, specials.add_eos = ids.add_eos;
  // The errors of the BPE loader name tokenizer.json keys; here they are about tokenizer.ggml.merges and .tokens.
  return std::make_unique<ByteLevelBpeTokenizer>(tokenizer, where + " (tokenizer.ggml.tokens/merges as a BPE)", spec,
                                                 "gguf-bpe" + std::to_string(tokens.size()), specials);
}

json parse_json_file(const std::string& path) {
  const std::string text = read_text_file(path, "GGUF vocabulary dump");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // also out_of_range: a number too large
    fail("{}: malformed JSON: {}", path, e.what());
  }
}

}  // namespace

std::unique_ptr<Tokenizer> make_vocab_tokenizer(const TokenizerVocab& vocab, const std::string& where,
                                                const std::string& spec) {
  if (vocab.model != "llama" && vocab.model != "gpt2")
    fail(
        "{}: tokenizer.ggml.model '{}' is not supported (hybridlm runs \"llama\", SentencePiece BPE, and \"gpt2\", "
        "byte-level BPE)",
        where, vocab.model);
  const std::vector<std::string> tokens = checked_tokens(vocab, where);
  const SpecialIds ids = special_ids(vocab, where);
  if (vocab.model == "gpt2") return make_gpt2(vocab, tokens, ids, where, spec);
  TokenizerVocab named = vocab;
  named.tokens = tokens;
  return std::make_unique<SpmVocabTokenizer>(named, where, spec, ids.eos, ids.bos, ids.unk, ids.add_bos, ids.add_eos,
                                             ids.add_space_prefix);
}

void write_vocab_json(const TokenizerVocab& v, const std::string& path) {
  json j = {{"format", kFormat}, {"tokenizer.ggml.model", v.model}, {"tokenizer.ggml.tokens", v.tokens}};
  if (!v.pre.empty()) j["tokenizer.ggml.pre"] = v.pre;
  if (!v.scores.empty()) j["tokenizer.ggml.scores"] = v.scores;
  if (!v.token_type.empty()) j["tokenizer.ggml.token_type"] = v.token_type;
  if (!v.merges.empty()) j["tokenizer.ggml.merges"] = v.merges;
  for (const auto& [key, id] : {std::pair{"bos_token_id", v.bos},
                                {"eos_token_id", v.eos},
                                {"unknown_token_id", v.unk},
                                {"padding_token_id", v.pad}})
    if (id != -1) j[std::string("tokenizer.ggml.") + key] = id;
  for (const auto& [key, flag] :
       {std::pair{"add_bos_token", v.add_bos}, {"add_eos_token", v.add_eos}, {"add_space_prefix", v.add_space_prefix}})
    if (flag) j[std::string("tokenizer.ggml.") + key] = *flag;
  std::string text;
  try {
    text = j.dump();
  } catch (const json::exception& e) {  // a token that is not valid UTF-8
    fail("{}: cannot write the vocabulary as JSON: {}", path, e.what());
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot write", path);
  f << text << "\n";
  if (!f) fail("{}: short write", path);
}

TokenizerVocab read_vocab_json(const std::string& path) {
  const json j = parse_json_file(path);
  if (!j.is_object() || j.value("format", json()) != kFormat)
    fail("{}: not a GGUF vocabulary dump (\"format\" must be \"{}\")", path, kFormat);
  auto field = [&](const char* key) -> const json* {
    const std::string full = std::string("tokenizer.ggml.") + key;
    return j.contains(full) ? &j.at(full) : nullptr;
  };
  // Every value is checked for its JSON type here; what the values mean is checked by make_vocab_tokenizer.
  auto get = [&]<typename T>(const char* key, T& out) {
    const json* f = field(key);
    if (!f) return;
    try {
      out = f->get<T>();
    } catch (const json::exception&) {
      fail("{}: tokenizer.ggml.{} has the wrong type ({})", path, key, f->dump().substr(0, 60));
    }
  };
  TokenizerVocab v;
  get("model", v.model);
  get("pre", v.pre);
  get("tokens", v.tokens);
  get("scores", v.scores);
  get("token_type", v.token_type);
  get("merges", v.merges);
  get("bos_token_id", v.bos);
  get("eos_token_id", v.eos);
  get("unknown_token_id", v.unk);
  get("padding_token_id", v.pad);
  for (const auto& [key, flag] : {std::pair{"add_bos_token", &v.add_bos},
                                  {"add_eos_token", &v.add_eos},
                                  {"add_space_prefix", &v.add_space_prefix}}) {
    bool b = false;
    if (field(key)) {
      get(key, b);
      *flag = b;
    }
  }
  if (!field("model")) fail("{}: tokenizer.ggml.model is missing", path);
  return v;
}

std::unique_ptr<Tokenizer> load_vocab_json_tokenizer(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail("tokenizer: {} not found", path);
  const std::string abs = fs::absolute(path).lexically_normal().string();
  return make_vocab_tokenizer(read_vocab_json(abs), abs, abs);
}

}  // namespace hlm::data
