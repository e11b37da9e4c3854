// data/vocab_tokenizer: tokenizers made from GGUF tokenizer metadata. The SentencePiece ("llama") side is
// checked against hand-worked encodings and against a plain re-statement of llama.cpp's merge rule; the gpt2
// side against the byte-level BPE of the Hugging Face fixtures run with GGUF's settings.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli_harness.h"
#include "core/error.h"
#include "data/byte_level_bpe.h"
#include "data/spm_vocab_tokenizer.h"
#include "data/tokenizer.h"
#include "data/vocab_tokenizer.h"

using namespace hlm;
using namespace hlm::data;
namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

namespace {

const std::string kSp = "\xe2\x96\x81";  // U+2581


std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A Gemma-shaped vocabulary: control tokens first, user-defined newline and space runs, 256 byte pieces of
// score 0, then scored pieces (higher merges first). Ids of the pieces are 264 + their index in `pieces`.
constexpr std::int32_t kPad = 0, kEos = 1, kBos = 2, kUnk = 3, kNl = 4, kNl2 = 5, kTwoSpaces = 6, kTurn = 7, kAB = 8,
                       kBCD = 9, kByte0 = 10;
const std::vector<std::pair<std::string, float>> kPieces = {{kSp, -1},         {"h", -2},
                                                            {"e", -3},         {"l", -4},
                                                            {"o", -5},         {"w", -6},
                                                            {"r", -7},         {"d", -8},
                                                            {"1", -9},         {"2", -9.5f},
                                                            {"3", -9.6f},      {"\u4e2d", -9.7f},
                                                            {"\u6587", -9.8f}, {"a", -9.9f},
                                                            {"b", -9.95f},     {"he", -10},
                                                            {"ll", -11},       {"hell", -12},
                                                            {"hello", -13},    {kSp + "w", -14},
                                                            {"or", -15},       {kSp + "wor", -16},
                                                            {"ld", -17},       {kSp + "world", -18},
                                                            {"12", -20},       {"\u4e2d\u6587", -21},
                                                            {kSp + kSp, -22}};

std::int32_t piece(const std::string& text) {
  for (size_t i = 0; i < kPieces.size(); ++i)
    if (kPieces[i].first == text) return kByte0 + 256 + static_cast<std::int32_t>(i);
  ADD_FAILURE() << "no piece " << text;
  return -1;
}
std::int32_t byte(int b) { return kByte0 + b; }

TokenizerVocab gemma_like() {
  TokenizerVocab v;
  v.model = "llama";
  auto add = [&](const std::string& t, float score, TokenType type) {
    v.tokens.push_back(t);
    v.scores.push_back(score);
    v.token_type.push_back(static_cast<std::int32_t>(type));
  };
  for (const char* t : {"<pad>", "<eos>", "<bos>", "<unk>"}) add(t, -1000, TokenType::kControl);
  add("\n", -1000, TokenType::kUserDefined);
  add("\n\n", -1000, TokenType::kUserDefined);
  add("  ", -1000, TokenType::kUserDefined);  // GGUF writes user-defined space runs with real spaces
  add("<start_of_turn>", -1000, TokenType::kControl);
  add("AB", -1000, TokenType::kUserDefined);
  add("BCD", -1000, TokenType::kUserDefined);
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) add(std::string{'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'}, 0, TokenType::kByte);
  for (const auto& [t, s] : kPieces) add(t, s, TokenType::kNormal);
  v.bos = kBos, v.eos = kEos, v.unk = kUnk, v.pad = kPad;
  v.add_bos = true, v.add_eos = false, v.add_space_prefix = false;
  return v;
}

const SpmVocabTokenizer& spm(const Tokenizer& t) { return dynamic_cast<const SpmVocabTokenizer&>(t); }

std::unique_ptr<Tokenizer> make(const TokenizerVocab& v) {
  return make_vocab_tokenizer(v, "test.gguf", "test.gguf.json");
}

std::string message_of(const TokenizerVocab& v) {
  try {
    make(v);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// llama.cpp's SentencePiece rule stated plainly: while some adjacent pair joins into a token, join the pair
// whose token scores highest (the leftmost of equals); then each symbol is its token or its bytes' tokens.
Ids reference_merge(const TokenizerVocab& v, const std::string& escaped) {
  std::map<std::string, std::int32_t> id;
  for (size_t i = 0; i < v.tokens.size(); ++i) id[v.tokens[i]] = static_cast<std::int32_t>(i);
  std::vector<std::string> sym;
  for (size_t i = 0; i < escaped.size();) {
    const unsigned char c = static_cast<unsigned char>(escaped[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    sym.push_back(escaped.substr(i, n));
    i += n;
  }
  for (;;) {
    int best = -1;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = id.find(sym[i] + sym[i + 1]);
      if (it != id.end() && (best < 0 || v.scores[static_cast<size_t>(it->second)] >
                                             v.scores[static_cast<size_t>(id.at(sym[best] + sym[best + 1]))]))
        best = static_cast<int>(i);
    }
    if (best < 0) break;
    sym[static_cast<size_t>(best)] += sym[static_cast<size_t>(best) + 1];
    sym.erase(sym.begin() + best + 1);
  }
  Ids out;
  static const char* hex = "0123456789ABCDEF";
  for (const std::string& s : sym) {
    if (id.count(s)) {
      out.push_back(id.at(s));
      continue;
    }
    for (unsigned char c : s) out.push_back(id.at(std::string{'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'}));
  }
  return out;
}

}  // namespace

TEST(VocabTokenizer, SentencePieceEncodingsWorkedByHand) {
  auto tok = make(gemma_like());
  EXPECT_EQ(tok->name(), "gguf-spm" + std::to_string(kByte0 + 256 + kPieces.size()));
  // he, ll, hell, hello, then ▁w, or, ▁wor, ld, ▁world: the highest-scoring joinable pair each time.
  EXPECT_EQ(tok->encode("hello world"), (Ids{piece("hello"), piece(kSp + "world")}));
  // User-defined tokens come out before merging; "world" without its space merges differently.
  EXPECT_EQ(tok->encode("hello\n\nworld"), (Ids{piece("hello"), kNl2, piece("w"), piece("or"), piece("ld")}));
  EXPECT_EQ(tok->encode("\n\n\n"), (Ids{kNl2, kNl}));
  // Two spaces are the user-defined token; the third is an escaped space merged with what follows.
  EXPECT_EQ(tok->encode("a   b"), (Ids{piece("a"), kTwoSpaces, piece(kSp), piece("b")}));
  // Longest special token first wherever it is, not leftmost first: "BCD" beats the earlier "AB".
  EXPECT_EQ(tok->encode("ABCD"), (Ids{byte('A'), kBCD}));
  // Digits merge like any piece; a character with no piece falls back to its UTF-8 bytes.
  EXPECT_EQ(tok->encode("123"), (Ids{piece("12"), piece("3")}));
  EXPECT_EQ(tok->encode("\u00e9"), (Ids{byte(0xC3), byte(0xA9)}));
  EXPECT_EQ(tok->encode("\U0001F600"), (Ids{byte(0xF0), byte(0x9F), byte(0x98), byte(0x80)}));
  EXPECT_EQ(tok->encode("\u4e2d\u6587"), (Ids{piece("\u4e2d\u6587")}));
  EXPECT_EQ(tok->encode(""), Ids{});
  // Control tokens written in a text are its characters, unless asked for (llama-tokenize's default); they
  // decode to nothing.
  EXPECT_EQ(tok->encode("<eos>"), (Ids{byte('<'), piece("e"), piece("o"), byte('s'), byte('>')}));
  EXPECT_EQ(spm(*tok).encode("<start_of_turn>hello<eos>", true), (Ids{kTurn, piece("hello"), kEos}));
  EXPECT_EQ(tok->decode({kBos, kTurn, piece("hello"), kEos}), "hello");
}

TEST(VocabTokenizer, SentencePieceMergesFollowScoresThenPosition) {
  TokenizerVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc", "abc"};
  v.scores = {0, 0, 0, -1, -1, -1, -5, -5, -6};
  v.token_type = {2, 3, 3, 1, 1, 1, 1, 1, 1};
  v.add_space_prefix = false;
  EXPECT_EQ(make(v)->encode("abc"), (Ids{8}));  // ab (leftmost of the equal ab, bc), then abc
  EXPECT_EQ(make(v)->encode("bcab"), (Ids{7, 6}));
  v.scores[7] = -4;  // now bc outscores ab, and a + bc is no token
  v.tokens[8] = "xyz";
  EXPECT_EQ(make(v)->encode("abc"), (Ids{3, 7}));
}

TEST(VocabTokenizer, SentencePieceAgreesWithThePlainRuleOnRandomTexts) {
  const TokenizerVocab v = gemma_like();
  auto tok = make(v);
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"h", "e", "l", "o", " ", "w", "r", "d", "1", "2", "x", "\u4e2d", "\u00e9"};
  for (int n = 0; n < 300; ++n) {
    std::string text;
    const int len = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < len; ++i) {
      const std::string& c = alphabet[rng() % alphabet.size()];
      if (c == " " && !text.empty() && text.back() == ' ') continue;  // no user-defined space runs here
      text += c;
    }
    SCOPED_TRACE(text);
    std::string escaped;
    for (char c : text) escaped += c == ' ' ? kSp : std::string(1, c);
    EXPECT_EQ(tok->encode(text), reference_merge(v, escaped));
    EXPECT_EQ(tok->decode(tok->encode(text)), text);
  }
}

TEST(VocabTokenizer, SpacePrefixBosAndDefaults) {
  TokenizerVocab v = gemma_like();
  v.add_space_prefix = true;  // Llama 2 style: a space before the text and after each special token
  auto tok = make(v);
  EXPECT_EQ(tok->encode("hello"), (Ids{piece(kSp), piece("hello")}));
  EXPECT_EQ(spm(*tok).encode("<start_of_turn>hello", true), (Ids{kTurn, piece(kSp), piece("hello")}));
  EXPECT_EQ(tok->decode(tok->encode("hello world")), "hello world");  // the added space comes off
  EXPECT_TRUE(tok->adds_bos());
  EXPECT_FALSE(tok->adds_eos());
  EXPECT_EQ(tok->bos_id(), kBos);
  EXPECT_EQ(tok->eos_id(), kEos);
  EXPECT_EQ(tok->vocab_size(), static_cast<int>(v.tokens.size()));

  // Keys absent: llama.cpp's defaults for SentencePiece vocabularies (<unk> 0, <s> 1, </s> 2, add BOS, space prefix).
  TokenizerVocab bare;
  bare.model = "llama";
  bare.tokens = {"<unk>", "<s>", "</s>", kSp, "a", kSp + "a"};
  bare.scores = {0, 0, 0, -1, -2, -3};
  bare.token_type = {2, 3, 3, 1, 1, 1};
  auto t2 = make(bare);
  EXPECT_EQ(t2->bos_id(), 1);
  EXPECT_EQ(t2->eos_id(), 2);
  EXPECT_TRUE(t2->adds_bos());
  EXPECT_EQ(t2->encode("a"), (Ids{5}));
  // No byte pieces: a character without a token is <unk>.
  EXPECT_EQ(t2->encode("b"), (Ids{3, 0}));
  bare.add_bos = false;
  EXPECT_FALSE(make(bare)->adds_bos());
}

TEST(VocabTokenizer, DecodeInvertsEncode) {
  for (bool prefix : {false, true}) {
    TokenizerVocab v = gemma_like();
    v.add_space_prefix = prefix;
    auto tok = make(v);
    std::vector<std::string> texts = {"hello world", "caf\u00e9 na\u0308ive \u4e2d\u6587 \U0001F600\U0001F680 12345",
                                      "x"};
    // With a space prefix, llama.cpp also puts a space after each user-defined token, which decoding keeps.
    if (!prefix)
      for (const char* t : {"  leading and trailing  ", "tabs\tand\nnew\n\n\nlines\r\n", "   ", "AB BCD ABCD"})
        texts.push_back(t);
    for (const std::string& text : texts) {
      SCOPED_TRACE(text);
      EXPECT_EQ(tok->decode(tok->encode(text)), text);
    }
  }
  EXPECT_THROW(make(gemma_like())->decode({-1}), Error);
  EXPECT_THROW(make(gemma_like())->decode({static_cast<std::int32_t>(gemma_like().tokens.size())}), Error);
}

TEST(VocabTokenizer, RefusesInconsistentMetadataNamingTheKey) {
  auto expect = [](TokenizerVocab v, const std::string& part) {
    const std::string msg = message_of(v);
    EXPECT_NE(msg.find("test.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  TokenizerVocab v = gemma_like();
  v.model = "bert";
  expect(v, "tokenizer.ggml.model 'bert' is not supported");
  v = gemma_like();
  v.scores.pop_back();
  expect(v, "tokenizer.ggml.scores has");
  v = gemma_like();
  v.token_type.push_back(1);
  expect(v, "tokenizer.ggml.token_type has");
  v = gemma_like();
  v.token_type[20] = 9;
  expect(v, "tokenizer.ggml.token_type[20] = 9");
  v = gemma_like();
  v.scores[30] = std::numeric_limits<float>::quiet_NaN();
  expect(v, "tokenizer.ggml.scores[30]");
  v = gemma_like();
  v.eos = static_cast<std::int64_t>(v.tokens.size());
  expect(v, "tokenizer.ggml.eos_token_id");
  v = gemma_like();
  v.pad = 1LL << 33;
  expect(v, "tokenizer.ggml.padding_token_id");
  v = gemma_like();
  v.tokens[280] = v.tokens[279];
  expect(v, "tokenizer.ggml.tokens[280]");
  v = gemma_like();
  v.tokens.clear(), v.scores.clear(), v.token_type.clear();
  expect(v, "tokenizer.ggml.tokens is missing");
  v = gemma_like();
  v.tokens[kByte0] = "<0xZZ>";
  expect(v, "tokenizer.ggml.tokens[10]");
  // One token: llama.cpp's default ids (<s> 1, </s> 2) are outside it.
  TokenizerVocab tiny;
  tiny.model = "llama";
  tiny.tokens = {"<unk>"};
  tiny.add_bos = true;
  expect(tiny, "tokenizer.ggml.eos_token_id is missing");
  tiny.eos = 0;
  expect(tiny, "add_bos_token is true but tokenizer.ggml.bos_token_id is missing");
}

// --- gpt2: the Hugging Face fixtures' vocabularies as GGUF stores them ---

namespace {

fs::path bpe_fixture(const std::string& family) {
  return fs::path(HLM_SOURCE_DIR) / "tests" / "data" / ("hf_bpe_" + family);
}

// The tokenizer.json of a fixture as tokenizer.ggml.* keys (what llama.cpp's converter writes).
TokenizerVocab gguf_of_fixture(const nlohmann::json& t, const std::string& pre) {
  TokenizerVocab v;
  v.model = "gpt2";
  v.pre = pre;
  std::map<std::int32_t, std::pair<std::string, TokenType>> by_id;
  for (const auto& [text, id] : t["model"]["vocab"].items()) by_id[id.get<std::int32_t>()] = {text, TokenType::kNormal};
  for (const auto& a : t["added_tokens"])
    by_id[a["id"].get<std::int32_t>()] = {a["content"],
                                          a["special"].get<bool>() ? TokenType::kControl : TokenType::kUserDefined};
  for (const auto& [id, entry] : by_id) {
    EXPECT_EQ(id, static_cast<std::int32_t>(v.tokens.size()));
    v.tokens.push_back(entry.first);
    v.token_type.push_back(static_cast<std::int32_t>(entry.second));
  }
  for (const auto& m : t["model"]["merges"])
    v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  v.eos = 0;
  v.bos = 1;
  v.add_bos = false;
  return v;
}

}  // namespace

TEST(VocabTokenizer, Gpt2MatchesTheFixturesRunWithoutNormalizerOrPrefixSpace) {
  const hlm::testing::ScratchDir dir("hlm_test_vocab_gpt2_");
  for (const auto& [family, pre] : std::vector<std::pair<std::string, std::string>>{
           {"gpt2", "gpt-2"}, {"llama3", "llama-bpe"}, {"qwen2", "qwen2"}}) {
    SCOPED_TRACE(family);
    nlohmann::json t = nlohmann::json::parse(slurp((bpe_fixture(family) / "tokenizer.json").string()));
    auto tok = make_vocab_tokenizer(gguf_of_fixture(t, pre), "test.gguf", "test.gguf.json");
    EXPECT_EQ(tok->name(), "gguf-bpe423");
    EXPECT_EQ(tok->eos_id(), 0);
    // The reference: the fixture as `tokenizers` runs it, less what llama.cpp does not do with a GGUF file: no
    // normalizer, no prefix space, special tokens in the text read as text.
    t["normalizer"] = nullptr;
    nlohmann::json plain = nlohmann::json::array();
    for (const auto& a : t["added_tokens"])
      if (!a["special"].get<bool>()) plain.push_back(a);
    t["added_tokens"] = plain;
    if (t["pre_tokenizer"]["type"] == "ByteLevel") t["pre_tokenizer"]["add_prefix_space"] = false;
    fs::create_directories(dir.path / family);
    std::ofstream((dir.path / (family + "/tokenizer.json")).string()) << t.dump();
    fs::copy_file(bpe_fixture(family) / "tokenizer_config.json", dir.path / family / "tokenizer_config.json");
    ByteLevelBpeTokenizer ref((dir.path / (family + "/tokenizer.json")).string());
    std::vector<std::string> texts;
    for (const auto& c : nlohmann::json::parse(slurp((bpe_fixture(family) / "expected.json").string())))
      texts.push_back(c["text"]);
    texts.push_back("<think>x</think>hybridlm <|im_end|>");
    for (const std::string& text : texts) {
      SCOPED_TRACE(text);
      EXPECT_EQ(tok->encode(text), ref.encode(text));
      EXPECT_EQ(tok->decode(tok->encode(text)), ref.decode(ref.encode(text)));
    }
  }
}

TEST(VocabTokenizer, Gpt2RefusesUnknownPreTokenizersAndBadMerges) {
  nlohmann::json t = nlohmann::json::parse(slurp((bpe_fixture("qwen2") / "tokenizer.json").string()));
  TokenizerVocab v = gguf_of_fixture(t, "tekken");
  EXPECT_NE(message_of(v).find("tokenizer.ggml.pre 'tekken' is not a pre-tokenizer hybridlm knows"), std::string::npos)
      << message_of(v);
  v.pre = "qwen2";
  v.merges.clear();
  EXPECT_NE(message_of(v).find("tokenizer.ggml.merges is missing"), std::string::npos) << message_of(v);
  v = gguf_of_fixture(t, "qwen2");
  v.merges[5] = "nospace";
  EXPECT_NE(message_of(v).find("tokenizer.ggml.merges[5]"), std::string::npos) << message_of(v);
  v = gguf_of_fixture(t, "llama-bpe");
  v.add_bos.reset();  // llama.cpp adds BOS for Llama 3 unless the file says otherwise
  EXPECT_TRUE(make(v)->adds_bos());
}

TEST(VocabTokenizer, JsonDumpRecreatesTheTokenizer) {
  const hlm::testing::ScratchDir dir("hlm_test_vocab_json_");
  const TokenizerVocab v = gemma_like();
  const std::string path = (dir.path / "vocab.gguf.json").string();
  write_vocab_json(v, path);
  auto tok = load_tokenizer(path);
  EXPECT_EQ(tok->spec(), fs::absolute(path).lexically_normal().string());
  auto again = load_tokenizer(tok->spec());
  for (const std::string text : {"hello world", "caf\u00e9 \U0001F600\n\n  x", "<start_of_turn>1234"}) {
    EXPECT_EQ(tok->encode(text), make(v)->encode(text));
    EXPECT_EQ(again->encode(text), make(v)->encode(text));
  }
  EXPECT_TRUE(tok->adds_bos());
  const TokenizerVocab back = read_vocab_json(path);
  EXPECT_EQ(back.tokens, v.tokens);
  EXPECT_EQ(back.scores, v.scores);
  EXPECT_EQ(back.token_type, v.token_type);
  EXPECT_EQ(back.pad, v.pad);
  EXPECT_EQ(back.add_space_prefix, v.add_space_prefix);

  // A dump with a value of the wrong type, or that is not a dump, is refused naming the file and key.
  nlohmann::json j = nlohmann::json::parse(slurp(path));
  j["tokenizer.ggml.scores"] = "high";
  std::ofstream((dir.path / "bad.gguf.json").string()) << j.dump();
  try {
    load_tokenizer((dir.path / "bad.gguf.json").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.gguf.json: tokenizer.ggml.scores has the wrong type"), std::string::npos)
        << e.what();
  }
  std::ofstream((dir.path / "other.gguf.json").string()) << "{\"tokens\": []}";
  EXPECT_THROW(load_tokenizer((dir.path / "other.gguf.json").string()), Error);
  EXPECT_THROW(load_tokenizer((dir.path / "missing.gguf.json").string()), Error);
}
