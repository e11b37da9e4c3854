#pragma once
// The text side of a Hugging Face `tokenizer.json` (what runs before the BPE model): its Unicode normalizer
// and its pre-tokenizer, which cuts the text into pieces that BPE merges within but never across.
// Regexes run on Oniguruma, the engine the `tokenizers` library uses, so `\s`, `\p{L}`, `(?i:...)` and
// lookaheads mean the same here as there. Supported (anything else is refused naming its JSON key):
//   normalizer:    null, NFC, NFD, NFKC, NFKD, Sequence of these
//   pre_tokenizer: Split (Regex or String pattern; Isolated, Removed, MergedWithPrevious, MergedWithNext;
//                  invert false), ByteLevel (add_prefix_space, use_regex = the GPT-2 pattern), Digits,
//                  Sequence of these
// docs/hf.md has the details that matter for exactness.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hlm::data {

// The 256 bytes as the printable characters (UTF-8) that byte-level BPE vocabularies are written in: bytes
// that are printable Latin-1 map to themselves, the others to U+0100.. in byte order (space -> "Ġ").
const std::string& byte_level_char(unsigned char byte);
// The reverse: appends the byte a byte-level character stands for; false when `ch` is not one of them.
bool byte_level_byte(std::string_view ch, std::string& out);

// Replaces every malformed UTF-8 sequence by U+FFFD (as Python's errors="replace" does), so that the
// regexes and the normalizer only ever see valid UTF-8.
std::string valid_utf8(std::string_view text);
// Length in bytes of the UTF-8 character starting at s[0] (1 for a stray byte).
int utf8_char_len(unsigned char lead);

class TextNormalizer {
 public:
  // `where` names the JSON location for errors, e.g. "tok.json: normalizer".
  static TextNormalizer from_json(const nlohmann::json& j, const std::string& where);
  std::string apply(std::string_view text) const;
  bool identity() const { return forms_.empty(); }

 private:
  std::vector<int> forms_;  // utf8proc option sets, applied in order
};

class PreTokenizer {
 public:
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where);
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Pieces of one segment of text (already normalized); byte-level steps map bytes to byte-level chars.
  std::vector<std::string> split(std::string_view text) const;
  bool maps_bytes() const;  // contains a ByteLevel step

  struct Step;

 private:
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace hlm::data
