#include "data/text_pipeline.h"

#include <oniguruma.h>
#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace hlm::data {

using json = nlohmann::json;

namespace {

// GPT-2's pre-tokenizer pattern, which ByteLevel applies when `use_regex` is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(std::uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

struct ByteLevelTable {
  std::array<std::string, 256> to_char;
  ByteLevelTable() {
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    std::uint32_t next = 256;
    for (int b = 0; b < 256; ++b) append_utf8(printable(b) ? static_cast<std::uint32_t>(b) : next++, to_char[b]);
  }
};

const ByteLevelTable& table() {
  static const ByteLevelTable t;
  return t;
}

std::string to_byte_level(std::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) out += table().to_char[c];
  return out;
}

// An Oniguruma regex with find-all. Searching is thread-safe (each search has its own region).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    static std::once_flag init;
    std::call_once(init, [] {
      OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
      onig_initialize(encodings, 1);
    });
    OnigErrorInfo info;
    const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
    const int r = onig_new(&re_, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
    if (r != ONIG_NORMAL) {
      OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(msg, r, &info);
      fail("{}: bad regex {}: {}", where, json(pattern).dump(), reinterpret_cast<const char*>(msg));
    }
  }
  ~Regex() { onig_free(re_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty matches, left to right, as [begin, end) byte offsets.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    OnigRegion* region = onig_region_new();
    const auto* str = reinterpret_cast<const OnigUChar*>(s.data());
    const OnigUChar* end = str + s.size();
    size_t pos = 0;
    while (pos <= s.size()) {
      const int r = onig_search(re_, str, end, str + pos, end, region, ONIG_OPTION_NONE);
      if (r < 0) break;  // ONIG_MISMATCH (or an error, which these patterns do not raise on valid UTF-8)
      const size_t b = static_cast<size_t>(region->beg[0]), e = static_cast<size_t>(region->end[0]);
      if (e > b) {
        out.emplace_back(b, e);
        pos = e;
      } else {
        pos = b + (b < s.size() ? utf8_char_len(static_cast<unsigned char>(s[b])) : 1);
      }
    }
    onig_region_free(region, 1);
    return out;
  }

 private:
  regex_t* re_ = nullptr;
};

std::string escape_regex(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

const json& field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) fail("{}: missing field \"{}\"", where, key);
  return j.at(key);
}

bool bool_field(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_boolean()) fail("{}.{}: expected true or false", where, key);
  return j.at(key).get<bool>();
}

}  // namespace

int utf8_char_len(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

const std::string& byte_level_char(unsigned char byte) { return table().to_char[byte]; }

bool byte_level_byte(std::string_view ch, std::string& out) {
  static const auto reverse = [] {
    std::unordered_map<std::string, char> r;
    for (int b = 0; b < 256; ++b) r[table().to_char[b]] = static_cast<char>(b);
    return r;
  }();
  auto it = reverse.find(std::string(ch));
  if (it == reverse.end()) return false;
  out += it->second;
  return true;
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n > 0) {
      out.append(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
      p += n;
      left -= n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for one malformed byte
      ++p;
      --left;
    }
  }
  return out;
}

// ---- normalizer ----

TextNormalizer TextNormalizer::from_json(const json& j, const std::string& where) {
  TextNormalizer n;
  if (j.is_null()) return n;
  const std::string type = field(j, "type", where).is_string() ? j.at("type").get<std::string>() : "";
  if (type == "Sequence") {
    const json& list = field(j, "normalizers", where);
    if (!list.is_array()) fail("{}.normalizers: expected a list", where);
    for (size_t i = 0; i < list.size(); ++i) {
      TextNormalizer part = from_json(list[i], fmt::format("{}.normalizers[{}]", where, i));
      n.forms_.insert(n.forms_.end(), part.forms_.begin(), part.forms_.end());
    }
    return n;
  }
  const int stable = UTF8PROC_STABLE;
  if (type == "NFC") n.forms_.push_back(stable | UTF8PROC_COMPOSE);
  else if (type == "NFD") n.forms_.push_back(stable | UTF8PROC_DECOMPOSE);
  else if (type == "NFKC") n.forms_.push_back(stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  else if (type == "NFKD") n.forms_.push_back(stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  else
    fail("{}.type: normalizer {} is not supported (hybridlm runs NFC, NFD, NFKC, NFKD and Sequence of them)", where,
         json(type).dump());
  return n;
}

std::string TextNormalizer::apply(std::string_view text) const {
  std::string s(text);
  for (int options : forms_) {
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                            static_cast<utf8proc_ssize_t>(s.size()), &out,
                                            static_cast<utf8proc_option_t>(options));
    if (n < 0) fail("tokenizer: Unicode normalization failed: {}", utf8proc_errmsg(n));
    s.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
  }
  return s;
}

// ---- pre-tokenizer ----

struct PreTokenizer::Step {
  enum class Kind { Split, ByteLevel };
  enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext };
  Kind kind = Kind::Split;
  Behavior behavior = Behavior::Isolated;
  bool add_prefix_space = false;
  std::unique_ptr<Regex> regex;  // Split's pattern, or ByteLevel's GPT-2 pattern when use_regex

  // Cuts one piece at the regex matches according to `behavior`; empty pieces are dropped.
  void cut(const std::string& s, std::vector<std::string>& out) const {
    std::vector<std::string> parts;  // alternating gap, match, gap, ...
    std::vector<bool> is_match;
    size_t at = 0;
    for (const auto& [b, e] : regex->find_all(s)) {
      parts.push_back(s.substr(at, b - at)), is_match.push_back(false);
      parts.push_back(s.substr(b, e - b)), is_match.push_back(true);
      at = e;
    }
    parts.push_back(s.substr(at)), is_match.push_back(false);
    // As `tokenizers` does: a match merges into its neighbour only when that neighbour is not a match.
    std::vector<std::string> pieces;
    bool glue_next = false, prev_match = false;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].empty()) continue;
      if (!is_match[i]) {
        if (glue_next) pieces.back() += parts[i];
        else pieces.push_back(parts[i]);
        glue_next = prev_match = false;
        continue;
      }
      glue_next = false;
      switch (behavior) {
        case Behavior::Isolated: pieces.push_back(parts[i]); break;
        case Behavior::Removed: break;
        case Behavior::MergedWithPrevious:
          if (!prev_match && !pieces.empty()) pieces.back() += parts[i];
          else pieces.push_back(parts[i]);
          break;
        case Behavior::MergedWithNext:
          pieces.push_back(parts[i]);
          glue_next = true;
          break;
      }
      prev_match = true;
    }
    out.insert(out.end(), pieces.begin(), pieces.end());
  }

  void apply(const std::vector<std::string>& in, std::vector<std::string>& out) const {
    for (const std::string& piece : in) {
      if (kind == Kind::Split) {
        cut(piece, out);
        continue;
      }
      std::string s = (add_prefix_space && (piece.empty() || piece[0] != ' ')) ? " " + piece : piece;
      std::vector<std::string> cut_pieces;
      if (regex) cut(s, cut_pieces);
      else cut_pieces.push_back(std::move(s));
      for (const std::string& c : cut_pieces) out.push_back(to_byte_level(c));
    }
  }
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

PreTokenizer PreTokenizer::from_json(const json& j, const std::string& where) {
  PreTokenizer p;
  if (j.is_null()) return p;
  const std::string type = field(j, "type", where).is_string() ? j.at("type").get<std::string>() : "";
  if (type == "Sequence") {
    const json& list = field(j, "pretokenizers", where);
    if (!list.is_array()) fail("{}.pretokenizers: expected a list", where);
    for (size_t i = 0; i < list.size(); ++i) {
      PreTokenizer part = from_json(list[i], fmt::format("{}.pretokenizers[{}]", where, i));
      for (auto& s : part.steps_) p.steps_.push_back(std::move(s));
    }
    return p;
  }
  auto step = std::make_unique<Step>();
  if (type == "Split") {
    if (bool_field(j, "invert", false, where)) fail("{}.invert: true is not supported", where);
    const json& pattern = field(j, "pattern", where);
    if (pattern.contains("Regex") && pattern.at("Regex").is_string())
      step->regex = std::make_unique<Regex>(pattern.at("Regex").get<std::string>(), where + ".pattern.Regex");
    else if (pattern.contains("String") && pattern.at("String").is_string())
      step->regex = std::make_unique<Regex>(escape_regex(pattern.at("String").get<std::string>()), where + ".pattern.String");
    else
      fail("{}.pattern: expected {{\"Regex\": ...}} or {{\"String\": ...}}", where);
    const json& b = field(j, "behavior", where);
    const std::string behavior = b.is_string() ? b.get<std::string>() : "";
    if (behavior == "Isolated") step->behavior = Step::Behavior::Isolated;
    else if (behavior == "Removed") step->behavior = Step::Behavior::Removed;
    else if (behavior == "MergedWithPrevious") step->behavior = Step::Behavior::MergedWithPrevious;
    else if (behavior == "MergedWithNext") step->behavior = Step::Behavior::MergedWithNext;
    else fail("{}.behavior: {} is not supported (Isolated, Removed, MergedWithPrevious, MergedWithNext)", where, b.dump());
  } else if (type == "ByteLevel") {
    step->kind = Step::Kind::ByteLevel;
    step->add_prefix_space = bool_field(j, "add_prefix_space", true, where);
    if (bool_field(j, "use_regex", true, where)) step->regex = std::make_unique<Regex>(kGpt2Pattern, where);
  } else if (type == "Digits") {
    const bool individual = bool_field(j, "individual_digits", false, where);
    step->regex = std::make_unique<Regex>(individual ? "\\p{N}" : "\\p{N}+", where);
  } else {
    fail("{}.type: pre-tokenizer {} is not supported (hybridlm runs Split, ByteLevel, Digits and Sequence of them)",
         where, json(type).dump());
  }
  p.steps_.push_back(std::move(step));
  return p;
}

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string> pieces{std::string(text)}, next;
  for (const auto& step : steps_) {
    next.clear();
    step->apply(pieces, next);
    pieces.swap(next);
  }
  return pieces;
}

bool PreTokenizer::maps_bytes() const {
  for (const auto& s : steps_)
    if (s->kind == Step::Kind::ByteLevel) return true;
  return false;
}

}  // namespace hlm::data
