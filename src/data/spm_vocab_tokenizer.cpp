#include "data/spm_vocab_tokenizer.h"

#include <algorithm>
#include <map>
#include <queue>

#include "core/error.h"
#include "data/text_pipeline.h"

namespace hlm::data {

namespace {

const std::string kEscapedSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte of a "<0xNN>" token, or -1.
int byte_of_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// A stretch of the text to merge ([begin, begin + size)), or a special token cut out of it (token >= 0).
struct Fragment {
  size_t begin, size;
  std::int32_t token;
};

}  // namespace

SpmVocabTokenizer::SpmVocabTokenizer(const TokenizerVocab& vocab, const std::string& where, std::string spec,
                                     std::int32_t eos, std::int32_t bos, std::int32_t unk, bool add_bos, bool add_eos,
                                     bool add_space_prefix)
    : spec_(std::move(spec)),
      tokens_(vocab.tokens),
      eos_(eos),
      bos_(bos),
      unk_(unk),
      add_bos_(add_bos),
      add_eos_(add_eos),
      add_space_prefix_(add_space_prefix) {
  const size_t n = tokens_.size();
  scores_ = vocab.scores.empty() ? std::vector<float>(n, 0.0f) : vocab.scores;
  auto type_of = [&](size_t id) {
    return vocab.token_type.empty() ? TokenType::kNormal : static_cast<TokenType>(vocab.token_type[id]);
  };
  ids_.reserve(n);
  for (size_t id = 0; id < n; ++id) ids_.emplace(std::string_view(tokens_[id]), static_cast<std::int32_t>(id));

  byte_ids_.fill(-1);
  decoded_.resize(n);
  std::map<size_t, std::vector<std::int32_t>, std::greater<>> user_by_length, special_by_length;
  for (size_t id = 0; id < n; ++id) {
    const std::string& t = tokens_[id];
    switch (type_of(id)) {
      case TokenType::kNormal:
        decoded_[id] = replace_all(t, kEscapedSpace, " ");
        break;
      case TokenType::kByte: {
        const int b = byte_of_token(t);
        if (b < 0)
          fail("{}: tokenizer.ggml.tokens[{}]: '{}' has token_type 6 (byte) but is not of the form <0xNN>", where, id,
               t);
        decoded_[id] = std::string(1, static_cast<char>(b));
        break;
      }
      case TokenType::kUserDefined:
        decoded_[id] = t;
        user_by_length[t.size()].push_back(static_cast<std::int32_t>(id));
        special_by_length[t.size()].push_back(static_cast<std::int32_t>(id));
        break;
      case TokenType::kControl:
      case TokenType::kUnknown:
        special_by_length[t.size()].push_back(static_cast<std::int32_t>(id));
        break;
      case TokenType::kUndefined:
      case TokenType::kUnused:
        break;
    }
  }
  // Byte fallback: the <0xNN> token, else a token that is the byte itself (as llama.cpp's byte_to_token).
  for (int b = 0; b < 256; ++b) {
    static const char* hex = "0123456789ABCDEF";
    const std::string piece = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    std::int32_t id = find(piece);
    if (id < 0) id = find(std::string(1, static_cast<char>(b)));
    byte_ids_[static_cast<size_t>(b)] = id;
  }
  auto group = [&](const std::map<size_t, std::vector<std::int32_t>, std::greater<>>& by_length) {
    std::vector<SpecialsOfLength> out;
    for (const auto& [length, list] : by_length) {
      SpecialsOfLength s;
      s.length = length;
      for (std::int32_t id : list) {
        const std::string& t = tokens_[static_cast<size_t>(id)];
        s.ids.emplace(std::string_view(t), id);
        s.first_byte[static_cast<unsigned char>(t[0])] = true;
      }
      out.push_back(std::move(s));
    }
    return out;
  };
  user_defined_ = group(user_by_length);
  all_special_ = group(special_by_length);
}

std::int32_t SpmVocabTokenizer::find(std::string_view text) const {
  auto it = ids_.find(text);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<std::int32_t> SpmVocabTokenizer::encode(std::string_view text, bool parse_special) const {
  // Special tokens out first, one length at a time from the longest, at every occurrence left to right in the
  // text that no longer one has taken (llama.cpp's tokenizer_st_partition).
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({0, text.size(), -1});
  for (const SpecialsOfLength& specials : parse_special ? all_special_ : user_defined_) {
    const size_t len = specials.length;
    std::vector<Fragment> next;
    next.reserve(fragments.size());
    for (const Fragment& f : fragments) {
      if (f.token >= 0 || f.size < len) {
        next.push_back(f);
        continue;
      }
      size_t start = f.begin, i = f.begin;
      const size_t end = f.begin + f.size;
      while (i + len <= end) {
        if (specials.first_byte[static_cast<unsigned char>(text[i])]) {
          auto it = specials.ids.find(text.substr(i, len));
          if (it != specials.ids.end()) {
            if (i > start) next.push_back({start, i - start, -1});
            next.push_back({i, len, it->second});
            i += len;
            start = i;
            continue;
          }
        }
        ++i;
      }
      if (end > start) next.push_back({start, end - start, -1});
    }
    fragments = std::move(next);
  }

  std::vector<std::int32_t> ids;
  bool after_special = true;  // the start of the text counts as following a special token
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      after_special = true;
      continue;
    }
    std::string piece = add_space_prefix_ && after_special ? " " : "";
    piece += text.substr(f.begin, f.size);
    merge_text(replace_all(piece, " ", kEscapedSpace), ids);
    after_special = false;
  }
  return ids;
}

void SpmVocabTokenizer::merge_text(std::string_view text, std::vector<std::int32_t>& ids) const {
  // Symbols are byte ranges of `text`, linked left to right; a merge grows the left one and empties the right.
  struct Symbol {
    int prev, next;
    size_t begin, size;
  };
  std::vector<Symbol> sym;
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::min<size_t>(utf8_char_len(static_cast<unsigned char>(text[i])), text.size() - i);
    sym.push_back({static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1, i, n});
    i += n;
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Pair {
    float score;
    int left, right;
    size_t size;
  };
  // Highest score first; among equal scores the leftmost (the lower symbol index).
  auto worse = [](const Pair& a, const Pair& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> queue(worse);
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t size = sym[static_cast<size_t>(left)].size + sym[static_cast<size_t>(right)].size;
    const std::int32_t id = find(text.substr(sym[static_cast<size_t>(left)].begin, size));
    if (id >= 0) queue.push({scores_[static_cast<size_t>(id)], left, right, size});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i, i + 1);
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    Symbol& left = sym[static_cast<size_t>(p.left)];
    Symbol& right = sym[static_cast<size_t>(p.right)];
    // Stale when either side has changed since the pair was queued (sizes only grow, so the sum tells).
    if (left.size == 0 || right.size == 0 || left.size + right.size != p.size) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = p.left;
    consider(left.prev, p.left);
    consider(p.left, left.next);
  }

  for (int i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const std::string_view piece = text.substr(sym[static_cast<size_t>(i)].begin, sym[static_cast<size_t>(i)].size);
    const std::int32_t id = find(piece);
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    for (char c : piece) {
      const std::int32_t b = byte_ids_[static_cast<unsigned char>(c)];
      if (b >= 0) {
        ids.push_back(b);
      } else if (unk_ >= 0) {
        ids.push_back(unk_);
      } else {
        fail("tokenizer {}: no token for byte 0x{:02X} (no <0x{:02X}> piece) and no unknown token", spec_,
             static_cast<unsigned char>(c), static_cast<unsigned char>(c));
      }
    }
  }
}

std::string SpmVocabTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    HLM_CHECK(ids[i] >= 0 && ids[i] < vocab_size(),
              "SpmVocabTokenizer.decode: id {} at position {} outside [0, {}) of {}", ids[i], i, vocab_size(), spec_);
    const std::string& piece = decoded_[static_cast<size_t>(ids[i])];
    // The space that encoding put in front of the text comes off again (llama.cpp strips it from the first
    // token only).
    if (i == 0 && add_space_prefix_ && !piece.empty() && piece[0] == ' ')
      out.append(piece, 1);
    else
      out += piece;
  }
  return out;
}

}  // namespace hlm::data
