#include "data/hf_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "data/byte_level_bpe.h"
#include "data/byte_tokenizer.h"
#include "data/spm_tokenizer.h"

namespace hlm::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's escaped space
const std::string kByteEos = "<eos>";

std::string read_file(const std::string& path) { return hlm::read_text_file(path, "tokenizer file"); }

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot write", path.string());
  f << text;
  if (!f) fail("{}: short write", path.string());
}

std::string utf8(std::uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// The byte-level pre-tokenizer's printable stand-in for each byte (GPT-2's table): printable Latin-1 bytes
// stand for themselves, the rest map in order to U+0100 onwards.
std::vector<std::string> byte_symbols() {
  std::vector<std::string> sym(256);
  std::uint32_t next = 256;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    sym[b] = utf8(printable ? b : next++);
  }
  return sym;
}

json added_token(int id, const std::string& content) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false}, {"special", true}};
}

json bpe_model(json vocab, json merges, const json& unk, bool byte_fallback) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", unk},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", byte_fallback},
          {"byte_fallback", byte_fallback},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

json tokenizer_file(json added, json normalizer, json pre_tokenizer, json decoder, json model) {
  return {{"version", "1.0"},          {"truncation", nullptr},  {"padding", nullptr},
          {"added_tokens", added},     {"normalizer", normalizer}, {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr}, {"decoder", decoder},      {"model", model}};
}

json byte_tokenizer_json() {
  const std::vector<std::string> sym = byte_symbols();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[sym[b]] = b;
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                           {"use_regex", false}};
  return tokenizer_file(json::array({added_token(ByteTokenizer::kEos, kByteEos)}), nullptr, byte_level, byte_level,
                        bpe_model(vocab, json::array(), nullptr, false));
}

// --- the parts of a SentencePiece ModelProto (protobuf wire format) that decide how it encodes ---

struct SpmPiece {
  std::string text;
  float score = 0;
  int type = 1;  // NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6
};
struct SpmModel {
  std::vector<SpmPiece> pieces;
  int model_type = 1;  // UNIGRAM 1, BPE 2 (proto defaults below)
  bool byte_fallback = false, treat_whitespace_as_suffix = false;
  std::string normalizer_name;
  bool has_charsmap = false, add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
};

class ProtoReader {
 public:
  ProtoReader(const char* p, size_t n, const std::string& file) : p_(p), end_(p + n), file_(file) {}
  bool done() const { return p_ >= end_; }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) fail("{}: truncated SentencePiece model (varint)", file_);
      const auto b = static_cast<unsigned char>(*p_++);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("{}: malformed SentencePiece model (varint too long)", file_);
  }
  // A length-delimited field's bytes.
  std::pair<const char*, size_t> bytes() {
    const std::uint64_t n = varint();
    if (n > static_cast<std::uint64_t>(end_ - p_)) fail("{}: truncated SentencePiece model (field length)", file_);
    const char* s = p_;
    p_ += n;
    return {s, static_cast<size_t>(n)};
  }
  float fixed32() {
    if (end_ - p_ < 4) fail("{}: truncated SentencePiece model (fixed32)", file_);
    float f;
    std::memcpy(&f, p_, 4);
    p_ += 4;
    return f;
  }
  void skip(int wire) {
    if (wire == 0) varint();
    else if (wire == 1) skip_n(8);
    else if (wire == 2) bytes();
    else if (wire == 5) skip_n(4);
    else fail("{}: malformed SentencePiece model (wire type {})", file_, wire);
  }
  const std::string& file() const { return file_; }

 private:
  void skip_n(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) fail("{}: truncated SentencePiece model", file_);
    p_ += n;
  }
  const char* p_;
  const char* end_;
  std::string file_;
};

// Calls f(field_number, wire_type, reader) for each field of the message in [p, p+n).
template <typename F>
void for_each_field(const char* p, size_t n, const std::string& file, F&& f) {
  ProtoReader r(p, n, file);
  while (!r.done()) {
    const std::uint64_t key = r.varint();
    f(static_cast<int>(key >> 3), static_cast<int>(key & 7), r);
  }
}

SpmModel parse_spm(const std::string& path) {
  const std::string buf = read_file(path);
  SpmModel m;
  for_each_field(buf.data(), buf.size(), path, [&](int field, int wire, ProtoReader& r) {
    if (field == 1 && wire == 2) {  // pieces
      auto [p, n] = r.bytes();
      SpmPiece piece;
      for_each_field(p, n, path, [&](int f, int w, ProtoReader& pr) {
        if (f == 1 && w == 2) {
          auto [s, len] = pr.bytes();
          piece.text.assign(s, len);
        } else if (f == 2 && w == 5) {
          piece.score = pr.fixed32();
        } else if (f == 3 && w == 0) {
          piece.type = static_cast<int>(pr.varint());
        } else {
          pr.skip(w);
        }
      });
      m.pieces.push_back(std::move(piece));
    } else if (field == 2 && wire == 2) {  // trainer_spec
      auto [p, n] = r.bytes();
      for_each_field(p, n, path, [&](int f, int w, ProtoReader& tr) {
        if (f == 3 && w == 0) m.model_type = static_cast<int>(tr.varint());
        else if (f == 24 && w == 0) m.treat_whitespace_as_suffix = tr.varint() != 0;
        else if (f == 35 && w == 0) m.byte_fallback = tr.varint() != 0;
        else tr.skip(w);
      });
    } else if (field == 3 && wire == 2) {  // normalizer_spec
      auto [p, n] = r.bytes();
      for_each_field(p, n, path, [&](int f, int w, ProtoReader& nr) {
        if (f == 1 && w == 2) {
          auto [s, len] = nr.bytes();
          m.normalizer_name.assign(s, len);
        } else if (f == 2 && w == 2) {
          m.has_charsmap = nr.bytes().second > 0;
        } else if (f == 3 && w == 0) {
          m.add_dummy_prefix = nr.varint() != 0;
        } else if (f == 4 && w == 0) {
          m.remove_extra_whitespaces = nr.varint() != 0;
        } else if (f == 5 && w == 0) {
          m.escape_whitespaces = nr.varint() != 0;
        } else {
          nr.skip(w);
        }
      });
    } else {
      r.skip(wire);
    }
  });
  if (m.pieces.empty()) fail("{}: SentencePiece model has no pieces", path);
  return m;
}

size_t utf8_len(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4; }

// SentencePiece BPE merges the adjacent pair whose joined piece scores highest. As a merge list: every
// split of every normal piece into two vocabulary pieces, ranked by the joined piece's score (then by the
// parts' ids, which decides nothing the score did not).
json spm_merges(const SpmModel& m, const std::unordered_map<std::string, int>& id) {
  std::vector<std::tuple<float, int, int, int>> order;  // -score, joined id, left id, right id
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const SpmPiece& p = m.pieces[i];
    if (p.type != 1) continue;
    for (size_t cut = utf8_len(static_cast<unsigned char>(p.text[0])); cut < p.text.size();
         cut += utf8_len(static_cast<unsigned char>(p.text[cut]))) {
      auto l = id.find(p.text.substr(0, cut)), r = id.find(p.text.substr(cut));
      if (l == id.end() || r == id.end()) continue;
      if (m.pieces[l->second].type != 1 || m.pieces[r->second].type != 1) continue;
      order.emplace_back(-p.score, static_cast<int>(i), l->second, r->second);
    }
  }
  std::sort(order.begin(), order.end());
  json merges = json::array();
  for (auto& [s, joined, l, r] : order) merges.push_back({m.pieces[l].text, m.pieces[r].text});
  return merges;
}

json spm_tokenizer_json(const std::string& path, const SpmModel& m) {
  auto refuse = [&](const std::string& what) {
    fail("export --format hf: tokenizer {}: {} cannot be expressed exactly as a transformers tokenizer.json", path,
         what);
  };
  if (m.model_type != 2) refuse(fmt::format("trainer_spec.model_type {} (only BPE, 2, is exported)", m.model_type));
  if (!m.byte_fallback) refuse("trainer_spec.byte_fallback false");
  if (m.treat_whitespace_as_suffix) refuse("trainer_spec.treat_whitespace_as_suffix true");
  if (m.has_charsmap || (m.normalizer_name != "identity" && !m.normalizer_name.empty()))
    refuse(fmt::format("normalizer_spec.name '{}' (Unicode normalization rules)", m.normalizer_name));
  if (m.remove_extra_whitespaces) refuse("normalizer_spec.remove_extra_whitespaces true");
  if (!m.escape_whitespaces) refuse("normalizer_spec.escape_whitespaces false");

  json vocab = json::object(), added = json::array();
  std::unordered_map<std::string, int> id;
  std::string unk;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const SpmPiece& p = m.pieces[i];
    if (p.type == 4) refuse(fmt::format("user-defined piece '{}'", p.text));
    if (vocab.contains(p.text)) refuse(fmt::format("duplicate piece '{}'", p.text));
    vocab[p.text] = static_cast<int>(i);
    id[p.text] = static_cast<int>(i);
    if (p.type == 2) unk = p.text;
    if (p.type == 2 || p.type == 3) added.push_back(added_token(static_cast<int>(i), p.text));
  }
  json normalizer = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
  json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                               {{"type", "ByteFallback"}},
                               {{"type", "Fuse"}}});
  if (m.add_dummy_prefix) {
    normalizer = {{"type", "Sequence"},
                  {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kSpace}}, normalizer})}};
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  return tokenizer_file(added, normalizer, nullptr, {{"type", "Sequence"}, {"decoders", decoders}},
                        bpe_model(vocab, spm_merges(m, id), unk.empty() ? json(nullptr) : json(unk), true));
}

std::string piece_or_null(const SpmModel& m, int id) { return id >= 0 ? m.pieces[static_cast<size_t>(id)].text : ""; }

void write_config_files(const fs::path& out, const json& tokenizer_json, const std::string& bos,
                        const std::string& eos, const std::string& unk, long model_max_length) {
  write_file(out / "tokenizer.json", tokenizer_json.dump(1) + "\n");
  json special = json::object();
  if (!bos.empty()) special["bos_token"] = bos;
  if (!eos.empty()) special["eos_token"] = eos;
  if (!unk.empty()) special["unk_token"] = unk;
  json cfg = special;
  cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  cfg["model_max_length"] = model_max_length;
  // hybridlm encodes "<eos>" written in the text as its characters, never as the special token.
  cfg["split_special_tokens"] = true;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["add_bos_token"] = false;
  cfg["add_eos_token"] = false;
  write_file(out / "tokenizer_config.json", cfg.dump(2) + "\n");
  write_file(out / "special_tokens_map.json", special.dump(2) + "\n");
}

bool is_byte_tokenizer_json(const json& t) {
  return t.is_object() && t.contains("model") && t["model"].is_object() &&
         t["model"].value("type", std::string()) == "BPE" && t["model"].contains("vocab") &&
         t["model"].contains("merges") && t["model"]["merges"].empty() && t["model"]["vocab"] == byte_tokenizer_json()["model"]["vocab"] &&
         t.value("pre_tokenizer", json()) == byte_tokenizer_json()["pre_tokenizer"] &&
         t.value("normalizer", json()).is_null();
}

}  // namespace

void write_hf_tokenizer(const Tokenizer& tok, const std::string& out_dir, long model_max_length) {
  const fs::path out(out_dir);
  if (dynamic_cast<const ByteTokenizer*>(&tok)) {
    write_config_files(out, byte_tokenizer_json(), "", kByteEos, "", model_max_length);
    return;
  }
  if (const auto* bpe = dynamic_cast<const ByteLevelBpeTokenizer*>(&tok)) {
    if (!bpe->from_tokenizer_json())
      fail("export --format hf: tokenizer '{}' (made from GGUF metadata) has no Hugging Face form yet", tok.spec());
    // A Hugging Face tokenizer to begin with: its files go out as they came in.
    const fs::path from = fs::path(tok.spec()).parent_path();
    fs::copy_file(tok.spec(), out / "tokenizer.json", fs::copy_options::overwrite_existing);
    for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"})
      if (fs::exists(from / name)) fs::copy_file(from / name, out / name, fs::copy_options::overwrite_existing);
    return;
  }
  const auto* spm = dynamic_cast<const SentencePieceTokenizer*>(&tok);
  if (!spm) fail("export --format hf: tokenizer '{}' has no Hugging Face form", tok.spec());
  const SpmModel m = parse_spm(spm->path());
  const json t = spm_tokenizer_json(spm->path(), m);
  write_config_files(out, t, piece_or_null(m, tok.bos_id()), piece_or_null(m, tok.eos_id()),
                     t["model"]["unk_token"].is_null() ? "" : t["model"]["unk_token"].get<std::string>(),
                     model_max_length);
  fs::copy_file(spm->path(), out / "tokenizer.model", fs::copy_options::overwrite_existing);
}

HfTokenizerImport import_hf_tokenizer(const std::string& hf_dir, const std::string& out_dir) {
  const fs::path dir(hf_dir);
  if (fs::exists(dir / "tokenizer.model")) {
    const fs::path dst = fs::absolute(fs::path(out_dir) / "tokenizer.model");
    fs::copy_file(dir / "tokenizer.model", dst, fs::copy_options::overwrite_existing);
    SentencePieceTokenizer check(dst.string());  // throws, naming the file, if it is not a SentencePiece model
    return {check.spec(), "", check.vocab_size()};
  }
  if (fs::exists(dir / "tokenizer.json")) {
    json t;
    try {
      t = json::parse(read_file((dir / "tokenizer.json").string()));
    } catch (const json::exception& e) {  // also out_of_range: a number too large
      fail("{}: malformed JSON: {}", (dir / "tokenizer.json").string(), e.what());
    }
    if (is_byte_tokenizer_json(t)) return {"byte", "", ByteTokenizer().vocab_size()};
    // Otherwise a byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM3 style) if hybridlm can run it exactly (loading
    // refuses what it cannot), copied with its tokenizer_config.json (eos_token, bos_token).
    int ids = 0;
    try {
      ids = ByteLevelBpeTokenizer((dir / "tokenizer.json").string()).vocab_size();
    } catch (const Error& e) {
      return {"", fmt::format("{} (pass --tokenizer to commands)", e.what())};
    }
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      if (fs::exists(dir / name)) fs::copy_file(dir / name, fs::path(out_dir) / name, fs::copy_options::overwrite_existing);
    // The spec is the copy's path, as the loader writes it (absolute, normal form).
    return {fs::absolute(fs::path(out_dir) / "tokenizer.json").lexically_normal().string(), "", ids};
  }
  return {"", "the folder has neither tokenizer.json nor tokenizer.model (pass --tokenizer to commands)"};
}

}  // namespace hlm::data
