#include "data/byte_level_bpe.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"

namespace hlm::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const std::string& path) {
  const std::string text = hlm::read_text_file(path, "tokenizer file");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: malformed JSON: {}", path, e.what());
  }
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

bool is_unset(const json& j, const char* key) {
  return !j.contains(key) || j.at(key).is_null() || (j.at(key).is_string() && j.at(key).get<std::string>().empty());
}

// A special-token field of tokenizer_config.json: a string, {"content": ...}, or null.
std::string token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j.at("content").is_string()) return j.at("content").get<std::string>();
  return "";
}

}  // namespace

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(const std::string& tokenizer_json_path) {
  std::error_code ec;
  if (!fs::is_regular_file(tokenizer_json_path, ec)) fail("tokenizer: {} not found", tokenizer_json_path);
  path_ = fs::absolute(tokenizer_json_path).lexically_normal().string();
  load(read_json(path_), path_);
  load_special_ids((fs::path(path_).parent_path() / "tokenizer_config.json").string());
}

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(const json& tokenizer, const std::string& where, std::string spec,
                                             std::string name, const Specials& specials)
    : path_(std::move(spec)), name_(std::move(name)) {
  load(tokenizer, where);
  auto check = [&](std::int32_t id, const char* what) {
    if (id < -1 || id >= vocab_size())
      fail("{}: {} id {} is outside the vocabulary of {}", where, what, id, vocab_size());
  };
  check(specials.eos, "end-of-sequence");
  check(specials.bos, "beginning-of-sequence");
  if (specials.eos < 0) fail("{}: no end-of-sequence token; hybridlm needs it to separate documents", where);
  eos_ = specials.eos, bos_ = specials.bos;
  add_bos_ = specials.add_bos, add_eos_ = specials.add_eos;
  for (const auto& [ids, as] : {std::pair{&specials.raw_decode, kRaw}, {&specials.silent, kSilent}})
    for (std::int32_t id : *ids) {
      check(id, "added token");
      decode_as_[static_cast<size_t>(id)] = as;
    }
}

void ByteLevelBpeTokenizer::load(const json& t, const std::string& where) {
  if (!t.is_object()) fail("{}: expected a JSON object", where);
  const json& model = t.contains("model") ? t.at("model") : json();
  load_model(model, where + ": model");
  normalizer_ = TextNormalizer::from_json(t.value("normalizer", json()), where + ": normalizer");
  pre_tokenizer_ = PreTokenizer::from_json(t.value("pre_tokenizer", json()), where + ": pre_tokenizer");
  if (!pre_tokenizer_.maps_bytes())
    fail("{}: pre_tokenizer has no ByteLevel step; hybridlm runs byte-level BPE only (GPT-2, Llama 3, Qwen style)", where);
  const json decoder = t.value("decoder", json());
  if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel")
    fail("{}: decoder.type must be \"ByteLevel\" (got {})", where, decoder.is_object() ? decoder.value("type", json()).dump() : decoder.dump());
  load_added_tokens(t.value("added_tokens", json::array()), where + ": added_tokens");
}

void ByteLevelBpeTokenizer::load_model(const json& model, const std::string& where) {
  if (!model.is_object() || model.value("type", "") != "BPE")
    fail("{}.type: {} is not supported (hybridlm runs byte-level \"BPE\")", where,
         model.is_object() ? model.value("type", json()).dump() : model.dump());
  if (!is_unset(model, "dropout") && model.at("dropout").is_number() && model.at("dropout").get<double>() > 0)
    fail("{}.dropout: BPE dropout is not supported (it makes encoding random)", where);
  if (model.value("byte_fallback", false))
    fail("{}.byte_fallback: true is a SentencePiece-style BPE (Gemma, Llama 2, Mistral), not byte-level BPE; hybridlm "
         "runs it from the folder's tokenizer.model or from a GGUF file's vocabulary (.gguf.json) instead",
         where);
  if (!is_unset(model, "continuing_subword_prefix")) fail("{}.continuing_subword_prefix: not supported", where);
  if (!is_unset(model, "end_of_word_suffix")) fail("{}.end_of_word_suffix: not supported", where);
  ignore_merges_ = model.value("ignore_merges", false);

  const json& vocab = model.contains("vocab") ? model.at("vocab") : json();
  if (!vocab.is_object() || vocab.empty()) fail("{}.vocab: expected a non-empty object of token -> id", where);
  std::int32_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<long long>() < 0 || id.get<long long>() >= (1LL << 31) - 1)
      fail("{}.vocab[{}]: id must be a non-negative integer", where, json(token).dump());
    vocab_[token] = id.get<std::int32_t>();
    max_id = std::max(max_id, id.get<std::int32_t>());
  }
  id_to_token_.assign(static_cast<size_t>(max_id) + 1, "");
  for (const auto& [token, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = token;

  const json& merges = model.contains("merges") ? model.at("merges") : json::array();
  if (!merges.is_array()) fail("{}.merges: expected a list", where);
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a, b;
    const json& m = merges[r];
    if (m.is_string()) {  // "a b"
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail("{}.merges[{}]: {} is not two tokens separated by one space", where, r, m.dump());
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      fail("{}.merges[{}]: expected \"a b\" or [\"a\", \"b\"]", where, r);
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), ij = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || ij == vocab_.end())
      fail("{}.merges[{}]: {} or its parts are not in the vocabulary", where, r, json(a + b).dump());
    merges_[pair_key(ia->second, ib->second)] = {static_cast<std::int32_t>(r), ij->second};
  }
  if (!is_unset(model, "unk_token")) {
    auto it = vocab_.find(model.at("unk_token").get<std::string>());
    if (it == vocab_.end()) fail("{}.unk_token: {} is not in the vocabulary", where, model.at("unk_token").dump());
    unk_ = it->second;
  }
}

void ByteLevelBpeTokenizer::load_added_tokens(const json& list, const std::string& where) {
  if (!list.is_array()) fail("{}: expected a list", where);
  for (size_t i = 0; i < list.size(); ++i) {
    const json& a = list[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!a.is_object() || !a.contains("id") || !a.at("id").is_number_integer() || !a.contains("content") ||
        !a.at("content").is_string() || a.at("content").get<std::string>().empty() || a.at("id").get<long long>() < 0 ||
        a.at("id").get<long long>() >= (1LL << 31) - 1)
      fail("{}: expected {{\"id\": non-negative integer, \"content\": non-empty string, ...}}", at);
    for (const char* flag : {"single_word", "lstrip", "rstrip"})
      if (a.value(flag, false)) fail("{}.{}: true is not supported", at, flag);
    AddedToken tok{a.at("content").get<std::string>(), a.at("id").get<std::int32_t>(), a.value("special", false),
                   a.value("normalized", !a.value("special", false))};
    if (static_cast<size_t>(tok.id) >= id_to_token_.size()) id_to_token_.resize(static_cast<size_t>(tok.id) + 1);
    id_to_token_[static_cast<size_t>(tok.id)] = tok.content;
    added_.push_back(std::move(tok));
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
  for (size_t i = 0; i < added_.size(); ++i)
    added_by_first_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(static_cast<std::uint32_t>(i));
  decode_as_.assign(id_to_token_.size(), kBytes);
  for (const AddedToken& a : added_)
    if (a.special) decode_as_[static_cast<size_t>(a.id)] = kSilent;
}

void ByteLevelBpeTokenizer::load_special_ids(const std::string& config_path) {
  std::error_code ec;
  if (!fs::is_regular_file(config_path, ec))
    fail("{}: not found; hybridlm reads the end-of-sequence token (eos_token) from it", config_path);
  const json c = read_json(config_path);
  auto id_of = [&](const char* key) -> std::int32_t {
    const std::string text = c.is_object() && c.contains(key) ? token_text(c.at(key)) : "";
    if (text.empty()) return -1;
    for (const AddedToken& a : added_)
      if (a.content == text) return a.id;
    auto it = vocab_.find(text);
    if (it == vocab_.end()) fail("{}: {} {} is neither an added token nor in the vocabulary", config_path, key, json(text).dump());
    return it->second;
  };
  eos_ = id_of("eos_token");
  if (eos_ < 0) fail("{}: eos_token is missing or null; hybridlm needs it to separate documents", config_path);
  bos_ = id_of("bos_token");
}

template <typename Plain>
void ByteLevelBpeTokenizer::cut_added(std::string_view text, bool normalized, std::vector<std::int32_t>& ids,
                                      Plain&& plain) const {
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    for (std::uint32_t k : added_by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const AddedToken& a = added_[k];  // longest first: the first that matches here is the longest
      if (a.normalized == normalized && text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) plain(text.substr(start, i - start));
    ids.push_back(hit->id);
    i += hit->content.size();
    start = i;
  }
  if (start < text.size()) plain(text.substr(start));
}

std::vector<std::int32_t> ByteLevelBpeTokenizer::encode(std::string_view text) const {
  const std::string valid = valid_utf8(text);
  std::vector<std::int32_t> ids;
  // As `tokenizers` does: tokens matched on the raw text first, then the rest normalized, then the tokens
  // matched on normalized text, then pre-tokenization and BPE of what is left.
  cut_added(valid, /*normalized=*/false, ids, [&](std::string_view raw) {
    const std::string norm = normalizer_.apply(raw);
    cut_added(norm, /*normalized=*/true, ids, [&](std::string_view seg) { encode_plain(seg, ids); });
  });
  return ids;
}

void ByteLevelBpeTokenizer::encode_plain(std::string_view segment, std::vector<std::int32_t>& ids) const {
  for (const std::string& word : pre_tokenizer_.split(segment)) merge_word(word, ids);
}

void ByteLevelBpeTokenizer::merge_word(const std::string& word, std::vector<std::int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    std::int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min<size_t>(utf8_char_len(static_cast<unsigned char>(word[i])), word.size() - i);
    auto it = vocab_.find(word.substr(i, n));
    i += n;
    const std::int32_t id = it != vocab_.end() ? it->second : unk_;
    if (id < 0) continue;  // `tokenizers` drops a character it has no id for when there is no unk_token
    sym.push_back({id, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1, true});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  // Lowest rank first, then leftmost; entries made stale by an earlier merge are skipped when popped.
  struct Candidate {
    std::int32_t rank;
    int pos;
    std::int32_t id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int left) {
    const int right = sym[static_cast<size_t>(left)].next;
    if (right < 0) return;
    auto it = merges_.find(pair_key(sym[static_cast<size_t>(left)].id, sym[static_cast<size_t>(right)].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.id});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[static_cast<size_t>(left.next)];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.id != top.id) continue;
    left.id = top.id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (const Symbol& s : sym)
    if (s.alive) ids.push_back(s.id);
}

std::string ByteLevelBpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::int32_t id = ids[i];
    HLM_CHECK(id >= 0 && id < vocab_size(), "ByteLevelBpeTokenizer.decode: id {} at position {} outside [0, {}) of {}", id,
              i, vocab_size(), path_);
    const char as = decode_as_[static_cast<size_t>(id)];
    if (as == kSilent) continue;
    const std::string& tok = id_to_token_[static_cast<size_t>(id)];
    if (as == kRaw) {
      out += tok;
      continue;
    }
    // Each character back to its byte; a token with a character outside the byte table (an added token
    // such as CJK text) is its own UTF-8, as `tokenizers`' ByteLevel decoder does.
    std::string bytes;
    bool all = true;
    for (size_t k = 0; k < tok.size() && all;) {
      const size_t n = std::min<size_t>(utf8_char_len(static_cast<unsigned char>(tok[k])), tok.size() - k);
      all = byte_level_byte(std::string_view(tok).substr(k, n), bytes);
      k += n;
    }
    out += all ? bytes : tok;
  }
  return out;
}

}  // namespace hlm::data
