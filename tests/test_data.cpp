// data/: tokenizers, corpus scanning, token shards, datasets and the batch loader.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <sentencepiece_processor.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "data/byte_level_bpe.h"
#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/spm_tokenizer.h"
#include "data/spm_trainer.h"
#include "data/text_pipeline.h"
#include "data/tokenizer.h"

using namespace hlm;
using namespace hlm::data;
namespace fs = std::filesystem;

namespace {

// A fresh folder per test, removed afterwards.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / ("hlm_test_data_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

void write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f << text;
}

void write_gz(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  gzclose(f);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Expects fn() to throw hlm::Error whose message contains every needle.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected hlm::Error mentioning " << needles[0];
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
  }
}

// Pseudo-English with reST-like structure: Zipf-ish words, indentation, headings, numbers.
std::string generated_text(std::uint64_t seed, size_t bytes) {
  static const char* words[] = {"the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "as", "with",
                                "function", "module", "return", "value", "kernel", "memory", "device", "driver",
                                "python", "object", "list", "string", "file", "data", "system", "process",
                                "example", "default", "argument", "number", "buffer", "interrupt", "thread"};
  const int nw = sizeof(words) / sizeof(words[0]);
  Rng r(seed);
  std::string s;
  while (s.size() < bytes) {
    int kind = static_cast<int>(r.below(10));
    if (kind == 0) {
      std::string title = words[r.below(nw)];
      s += title + "\n" + std::string(title.size(), '=') + "\n\n";
      continue;
    }
    if (kind == 1) s += "    ";  // indented code-ish line
    int n = 4 + static_cast<int>(r.below(12));
    for (int i = 0; i < n; ++i) {
      // Zipf-like: small indices much more often.
      double u = r.uniform();
      int w = static_cast<int>(nw * u * u * u);
      s += words[w];
      if (r.below(15) == 0) {
        s += ' ';
        s += std::to_string(r.below(1000));
      }
      s += (i + 1 < n) ? " " : ".\n";
    }
    if (r.below(4) == 0) s += "\n";
  }
  return s;
}

std::vector<std::int32_t> arange(std::int32_t n) {
  std::vector<std::int32_t> v(n);
  for (std::int32_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------- tokenizers

TEST(ByteTokenizer, RoundTripAsciiAndUtf8) {
  ByteTokenizer tok;
  const std::string text = "Hello, world!\n\tcaf\xc3\xa9 \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82";  // café 世界 🙂
  std::vector<std::int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  EXPECT_EQ(ids[15], 0x63);  // 'c'
  EXPECT_EQ(ids[18], 0xc3);  // UTF-8 lead byte of é stays one byte token
  EXPECT_EQ(tok.decode(ids), text);
  // <eos> separates documents and decodes to nothing.
  ids.push_back(tok.eos_id());
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.eos_id(), 256);
  expect_error([&] { tok.decode({65, 257}); }, {"ByteTokenizer.decode", "257"});
  expect_error([&] { tok.decode({-1}); }, {"ByteTokenizer.decode"});
  EXPECT_EQ(load_tokenizer("byte")->name(), "byte");
}

TEST(Tokenizer, MissingModelErrorNamesTheFile) {
  expect_error([] { load_tokenizer("/nonexistent/dir/tok.model"); }, {"/nonexistent/dir/tok.model", "not found"});
  TempDir dir("badmodel");
  write_file(dir / "junk.model", "this is not a protobuf");
  expect_error([&] { load_tokenizer(dir / "junk.model"); }, {"junk.model"});
}

TEST(SentencePiece, TrainOnGeneratedCorpusThenRoundTrip) {
  TempDir dir("spm");
  std::vector<std::string> sentences;
  std::string corpus = generated_text(1, 300000);
  // Same cutting rule as corpus sampling: multi-line chunks.
  for (size_t b = 0; b < corpus.size(); b += 1500) sentences.push_back(corpus.substr(b, 1500));
  SpmTrainOptions opt;
  opt.vocab_size = 400;
  const std::string model = dir / "m.model";
  train_sentencepiece(sentences, model, opt);
  auto tok = load_tokenizer(model);
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->bos_id(), 1);

  // Byte-exact round trip: indentation, blank lines, tabs, unseen code points via byte fallback.
  const std::string text =
      "Return the value of the module.\n\n    list  of   buffers\n\tkernel 42\n"
      "Ω\xe2\x86\x92\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 trailing   \n";
  std::vector<std::int32_t> ids = tok->encode(text);
  for (auto id : ids) ASSERT_TRUE(id >= 0 && id < 400);
  EXPECT_EQ(tok->decode(ids), text);
  // In-domain text compresses well below one token per byte.
  std::string in_domain = generated_text(99, 20000);
  std::vector<std::int32_t> ids2 = tok->encode(in_domain);
  EXPECT_EQ(tok->decode(ids2), in_domain);
  EXPECT_LT(ids2.size() * 2, in_domain.size()) << ids2.size() << " tokens for " << in_domain.size() << " bytes";

  // Same input, same options -> the same model file.
  train_sentencepiece(sentences, dir / "m2.model", opt);
  EXPECT_EQ(slurp(model), slurp(dir / "m2.model"));

  // A vocab the text cannot fill is an hlm::Error, not a crash.
  SpmTrainOptions huge = opt;
  huge.vocab_size = 100000;
  expect_error([&] { train_sentencepiece({"tiny text"}, dir / "x.model", huge); }, {"x.model", "100000"});
}

// Text over kEncodePieceBytes is encoded in pieces with exactly the tokens SentencePiece gives the whole text, so a
// document of one long line no longer takes gigabytes; a model whose pieces span words encodes whole.
TEST(SentencePiece, LongTextsEncodeInPiecesWithTheWholeTextsTokens) {
  TempDir dir("spm_pieces");
  std::vector<std::string> sentences;
  const std::string corpus = generated_text(1, 300000);
  for (size_t b = 0; b < corpus.size(); b += 1500) sentences.push_back(corpus.substr(b, 1500));
  SpmTrainOptions opt;
  opt.vocab_size = 400;
  train_sentencepiece(sentences, dir / "m.model", opt);
  const SentencePieceTokenizer tok(dir / "m.model");
  EXPECT_TRUE(tok.encodes_in_pieces());
  std::string one_line = generated_text(8, 700'000);
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  const std::string text = generated_text(7, 900'000) + one_line + "  double  spaces\n" + generated_text(9, 300'000);
  ASSERT_GT(text.size(), 4 * SentencePieceTokenizer::kEncodePieceBytes);
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(dir / "m.model").ok());
  std::vector<int> whole;
  ASSERT_TRUE(sp.Encode(text, &whole).ok());
  const std::vector<std::int32_t> pieces = tok.encode(text);
  EXPECT_EQ(pieces, std::vector<std::int32_t>(whole.begin(), whole.end()));
  EXPECT_EQ(tok.decode(pieces), text);

  opt.split_by_whitespace = false;  // pieces like " magic number for" may span words: encoded whole
  train_sentencepiece(sentences, dir / "spans.model", opt);
  EXPECT_FALSE(SentencePieceTokenizer(dir / "spans.model").encodes_in_pieces());
}

// The tokenizer's sample of a document of one 16 MB line is cut into the trainer's sentences in linear time (a
// newline search back to the start of the text made it quadratic: minutes for tens of MB).
TEST(SentencePiece, OneLongLineIsSampledInLinearTime) {
  TempDir dir("spm_long_line");
  std::string line = generated_text(3, 16'000'000);
  std::replace(line.begin(), line.end(), '\n', ' ');
  write_file(dir / "one.txt", line);
  const Corpus corpus = open_corpus(dir / "one.txt");
  Timer timer;
  const std::vector<std::string> sentences = sample_sentences(corpus, nullptr, 16'000'000, 0);
  EXPECT_LT(timer.seconds(), 5.0);
  std::string joined;
  for (const auto& s : sentences) {
    EXPECT_LE(s.size(), 2048u);
    joined += s;
  }
  EXPECT_EQ(joined, line.substr(0, joined.size()));
  EXPECT_GT(joined.size(), 15'000'000u);
}

// ---------------------------------------------------------------------------------------------- corpus

// A model whose second piece starts with a NUL byte passes SentencePiece's checks and then throws from its trie
// builder (found by fuzz_tokenizer): refused as an error naming the file, not an escaped exception.
TEST(Tokenizer, ModelWithANulPieceIsAnErrorNamingTheFile) {
  TempDir dir("nulpiece");
  const std::string bytes("\x0a\x0e\x0a\x05\x3c\x75\x6e\x6b\x3e\x15\x00\x00\x00\x00\x18\x02\x0a\x0c\x0a\x03\x00\x73\x3c\x20\x3e\x15\x00\x00\x18\x78\x18\x06", 32);
  write_file(dir / "nul.model", bytes);
  expect_error([&] { load_tokenizer(dir / "nul.model"); }, {"nul.model", "SentencePiece"});
}

TEST(Corpus, ScansFoldersRecursivelyAndReadsGzip) {
  TempDir dir("scan");
  write_file(dir / "a.txt", "alpha\n");
  write_file(dir / "sub/b.md", "# beta\n");
  write_file(dir / "sub/deeper/c.rst.txt", "gamma\n");
  write_gz(dir / "sub/d.rst.gz", "delta, compressed\n");
  write_file(dir / "e.bin", "not text");
  write_file(dir / ".hidden/f.txt", "hidden");
  write_file(dir / "empty.txt", "");
  Corpus c = list_corpus(dir.path.string());
  std::vector<std::string> keys;
  for (const auto& d : c.docs) keys.push_back(d.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a.txt", "sub/b.md", "sub/d.rst.gz", "sub/deeper/c.rst.txt"}));
  EXPECT_EQ(read_document(c.docs[2]), "delta, compressed\n");
  EXPECT_EQ(read_document(c.docs[0]), "alpha\n");
  // A single file is one document, whatever its name.
  Corpus one = list_corpus(dir / "e.bin");
  ASSERT_EQ(one.docs.size(), 1u);
  EXPECT_EQ(read_document(one.docs[0]), "not text");
  // A truncated .gz is an error naming the file.
  write_gz(dir / "whole.txt.gz", generated_text(3, 50000));
  std::string gz = slurp(dir / "whole.txt.gz");
  write_file(dir / "cut.txt.gz", gz.substr(0, gz.size() / 2));
  Document cut{dir / "cut.txt.gz", "cut.txt.gz", gz.size() / 2, 0};
  expect_error([&] { read_document(cut); }, {"cut.txt.gz"});
}

TEST(Corpus, EmptyFolderIsAnError) {
  TempDir dir("empty");
  expect_error([&] { list_corpus(dir.path.string()); }, {"no documents found in", dir.path.string()});
  write_file(dir / "x.bin", "binary");
  write_file(dir / "y.txt", "");
  expect_error([&] { list_corpus(dir.path.string()); }, {"no documents found in"});
  expect_error([&] { prepare_dataset(dir.path.string(), "byte", dir / "cache", {.quiet = true}); },
               {"no documents found in"});
  expect_error([&] { list_corpus(dir / "does_not_exist"); }, {"does_not_exist", "does not exist"});
}

TEST(Corpus, SplitByDocumentIsDeterministicAndHasBothSides) {
  std::vector<Document> docs(500);
  for (size_t i = 0; i < docs.size(); ++i) docs[i].key = "dir/file_" + std::to_string(i) + ".txt";
  std::vector<bool> a = split_by_document(docs, 0.1), b = split_by_document(docs, 0.1);
  EXPECT_EQ(a, b);
  size_t nval = std::count(a.begin(), a.end(), true);
  EXPECT_GE(nval, 25u);  // binomial(500, 0.1): mean 50, sd 6.7
  EXPECT_LE(nval, 75u);
  // Membership depends on the key alone, not on the other documents.
  std::vector<Document> sub(docs.begin(), docs.begin() + 100);
  std::vector<bool> c = split_by_document(sub, 0.1);
  for (size_t i = 0; i < sub.size(); ++i) EXPECT_EQ(c[i], a[i]) << sub[i].key;
  // Extremes: at least one val document, at least one train document.
  auto tiny = split_by_document(docs, 1e-9);
  EXPECT_EQ(std::count(tiny.begin(), tiny.end(), true), 1);
  auto most = split_by_document(docs, 0.999999);
  EXPECT_EQ(std::count(most.begin(), most.end(), false), 1);
}

// ---------------------------------------------------------------------------------------------- shards

TEST(Shard, RoundTripUint16AndUint32) {
  TempDir dir("shard");
  for (std::int64_t vocab : {300, 65536, 70000}) {
    Rng r(vocab);
    std::vector<std::int32_t> toks(1001);
    for (auto& t : toks) t = static_cast<std::int32_t>(r.below(vocab));
    toks[5] = static_cast<std::int32_t>(vocab - 1);
    std::string p = dir / ("s" + std::to_string(vocab) + ".tok");
    write_shard(p, toks.data(), toks.size(), vocab, 7, 3);
    TokenShard s(p);
    EXPECT_EQ(s.token_bytes(), vocab <= 65536 ? 2u : 4u);
    EXPECT_EQ(fs::file_size(p), 64 + toks.size() * s.token_bytes());
    EXPECT_EQ(s.n_tokens(), 1001);
    EXPECT_EQ(s.n_docs(), 3);
    EXPECT_EQ(s.vocab_size(), vocab);
    EXPECT_EQ(s.eos_id(), 7);
    std::vector<std::int32_t> back(toks.size(), -5);
    s.read(0, static_cast<std::int64_t>(toks.size()), back.data());
    EXPECT_EQ(back, toks);
    for (size_t i = 0; i < toks.size(); i += 97) EXPECT_EQ(s[static_cast<std::int64_t>(i)], toks[i]);
    EXPECT_THROW(s.read(1000, 2, back.data()), Error);
  }
  // The writer refuses ids outside the vocab.
  std::vector<std::int32_t> bad = {1, 2, 300};
  expect_error([&] { write_shard(dir / "bad.tok", bad.data(), bad.size(), 300, 0, 1); }, {"bad.tok", "300"});
  EXPECT_FALSE(fs::exists(dir / "bad.tok"));  // no half-written file left behind
}

TEST(Shard, TruncatedOrLyingHeaderNamesFileAndField) {
  TempDir dir("shardbad");
  std::vector<std::int32_t> toks = arange(100);
  const std::string good = dir / "good.tok";
  write_shard(good, toks.data(), toks.size(), 300, 0, 1);
  const std::string bytes = slurp(good);

  auto variant = [&](const std::string& name, std::string content) {
    std::string p = dir / name;
    write_file(p, content);
    return p;
  };
  // Truncated payload.
  std::string p = variant("trunc.tok", bytes.substr(0, bytes.size() - 7));
  expect_error([&] { TokenShard s(p); }, {p, "n_tokens"});
  // Shorter than the header.
  p = variant("tiny.tok", bytes.substr(0, 20));
  expect_error([&] { TokenShard s(p); }, {p, "header"});
  // Header claims more tokens than the file holds (and a huge count that would overflow).
  for (std::uint64_t lie : {std::uint64_t{101}, std::uint64_t{99}, ~std::uint64_t{0}}) {
    std::string b = bytes;
    std::memcpy(&b[16], &lie, 8);
    p = variant("lie.tok", b);
    expect_error([&] { TokenShard s(p); }, {p, "n_tokens"});
  }
  // Wrong magic, version, dtype, eos, n_docs; a token beyond the vocab.
  {
    std::string b = bytes;
    b[0] = 'X';
    p = variant("magic.tok", b);
    expect_error([&] { TokenShard s(p); }, {p, "magic"});
  }
  {
    std::string b = bytes;
    std::uint32_t v = 9;
    std::memcpy(&b[8], &v, 4);
    p = variant("version.tok", b);
    expect_error([&] { TokenShard s(p); }, {p, "version"});
  }
  {
    std::string b = bytes;
    std::uint32_t v = 3;
    std::memcpy(&b[12], &v, 4);
    p = variant("dtype.tok", b);
    expect_error([&] { TokenShard s(p); }, {p, "token_bytes"});
  }
  {
    std::string b = bytes;
    std::uint32_t v = 300;
    std::memcpy(&b[36], &v, 4);
    p = variant("eos.tok", b);
    expect_error([&] { TokenShard s(p); }, {p, "eos_id"});
  }
  {
    std::string b = bytes;
    std::uint64_t v = 1000;
    std::memcpy(&b[24], &v, 8);
    p = variant("docs.tok", b);
    expect_error([&] { TokenShard s(p); }, {p, "n_docs"});
  }
  {
    std::string b = bytes;
    std::uint32_t v = 50;  // vocab 50, but tokens go up to 99
    std::memcpy(&b[32], &v, 4);
    p = variant("vocab.tok", b);
    expect_error([&] { TokenShard s(p); }, {p, "vocab_size", "token 99"});
  }
  expect_error([&] { TokenShard s(dir / "missing.tok"); }, {"missing.tok"});
}

// Mutation fuzzing of the parser: random header bytes and random lengths must give either a shard
// whose every token can be read or an hlm::Error; never a crash or an out-of-bounds read.
TEST(Shard, RandomCorruptionIsAnErrorOrAValidShard) {
  TempDir dir("fuzz");
  std::vector<std::int32_t> toks = arange(64);
  write_shard(dir / "base.tok", toks.data(), toks.size(), 300, 0, 2);
  const std::string base = slurp(dir / "base.tok");
  Rng r(2024);
  int errors = 0, ok = 0;
  for (int it = 0; it < 150; ++it) {
    std::string b = base;
    int flips = 1 + static_cast<int>(r.below(4));
    for (int f = 0; f < flips; ++f) b[r.below(64)] = static_cast<char>(r.below(256));
    if (r.below(3) == 0) b.resize(r.below(b.size() + 1));
    std::string p = dir / "fuzz.tok";
    write_file(p, b);
    try {
      TokenShard s(p);
      std::vector<std::int32_t> all(static_cast<size_t>(s.n_tokens()));
      s.read(0, s.n_tokens(), all.data());
      for (auto t : all) ASSERT_LT(t, s.vocab_size());
      ++ok;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fuzz.tok"), std::string::npos) << e.what();
      ++errors;
    }
  }
  EXPECT_GT(errors, 40);
  EXPECT_GT(ok, 0);  // flips of the reserved bytes are harmless
}

// ---------------------------------------------------------------------------------------------- datasets

TEST(Dataset, BuildSplitsByDocumentAndReusesCache) {
  TempDir dir("dataset");
  const std::string src = dir / "src";
  std::map<std::string, std::string> docs;
  for (int i = 0; i < 40; ++i) {
    std::string text = "document " + std::to_string(i) + "\n" + generated_text(100 + i, 200 + 37 * i);
    std::string rel = (i % 3 == 0 ? "sub/" : "") + std::string("doc") + std::to_string(i) + (i % 5 == 0 ? ".md" : ".txt");
    write_file(src + "/" + rel, text);
    docs[rel] = text;
  }
  PrepareOptions opt;
  opt.val_fraction = 0.2;
  opt.quiet = true;
  Dataset d = prepare_dataset(src, "byte", dir / "cache", opt);
  EXPECT_EQ(d.tokenizer_spec, "byte");
  EXPECT_EQ(d.vocab_size, 257);
  EXPECT_EQ(d.eos_id, 256);

  // Expected streams: documents in key order, each followed by <eos>, routed by the split.
  Corpus c = list_corpus(src);
  std::vector<bool> is_val = split_by_document(c.docs, 0.2);
  std::vector<std::int32_t> want_train, want_val;
  size_t n_val = 0;
  for (size_t i = 0; i < c.docs.size(); ++i) {
    auto& w = is_val[i] ? want_val : want_train;
    n_val += is_val[i];
    for (unsigned char ch : docs.at(c.docs[i].key)) w.push_back(ch);
    w.push_back(256);
  }
  ASSERT_GT(n_val, 0u);
  ASSERT_LT(n_val, c.docs.size());
  TokenShard train(d.train_path), val(d.val_path);
  std::vector<std::int32_t> got_train(train.n_tokens()), got_val(val.n_tokens());
  train.read(0, train.n_tokens(), got_train.data());
  val.read(0, val.n_tokens(), got_val.data());
  EXPECT_EQ(got_train, want_train);
  EXPECT_EQ(got_val, want_val);
  EXPECT_EQ(train.n_docs() + val.n_docs(), 40);
  EXPECT_EQ(val.n_docs(), static_cast<std::int64_t>(n_val));
  EXPECT_EQ(d.meta["documents"], 40);
  EXPECT_EQ(d.meta["val"]["documents"], n_val);

  // Second call reuses the folder; a changed file rebuilds it; the folder itself opens directly.
  auto stamp = fs::last_write_time(d.train_path);
  Dataset again = prepare_dataset(src, "byte", dir / "cache", opt);
  EXPECT_EQ(again.dir, d.dir);
  EXPECT_EQ(fs::last_write_time(again.train_path), stamp);
  Dataset direct = prepare_dataset(d.dir, "", "", opt);
  EXPECT_EQ(direct.train_path, d.train_path);
  expect_error([&] { prepare_dataset(d.dir, "bpe:512", "", opt); }, {"byte", "bpe:512"});
  write_file(src + "/doc1.txt", "changed and longer than before\n");
  Dataset rebuilt = prepare_dataset(src, "byte", dir / "cache", opt);
  EXPECT_EQ(rebuilt.dir, d.dir);
  EXPECT_NE(rebuilt.meta["tokens"], d.meta["tokens"]);

  // A missing meta field is an error naming the file and the field.
  auto meta = rebuilt.meta;
  meta.erase("vocab_size");
  write_file(rebuilt.dir + "/meta.json", meta.dump());
  expect_error([&] { open_dataset(rebuilt.dir); }, {"meta.json", "vocab_size"});
}

TEST(Dataset, CacheFolderDefaultsToRepoAndHonoursEnv) {
  const char* prev = std::getenv("HLM_DATA_CACHE");
  std::string saved = prev ? prev : "";
  ::setenv("HLM_DATA_CACHE", "/tmp/somewhere/cache", 1);
  EXPECT_EQ(default_cache_dir(), "/tmp/somewhere/cache");
  ::unsetenv("HLM_DATA_CACHE");
  EXPECT_EQ(fs::path(default_cache_dir()), fs::path(HLM_SOURCE_DIR) / "data" / "cache");
  if (prev) ::setenv("HLM_DATA_CACHE", saved.c_str(), 1);
}

TEST(Dataset, ConcurrentBuildsOfOneDatasetAgree) {
  TempDir dir("race");
  for (int i = 0; i < 30; ++i) write_file(dir / ("src/d" + std::to_string(i) + ".txt"), generated_text(i, 3000));
  PrepareOptions opt;
  opt.quiet = true;
  std::vector<Dataset> got(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      try {
        got[t] = prepare_dataset(dir / "src", "byte", dir / "cache", opt);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(errors[t], "");
    EXPECT_EQ(got[t].dir, got[0].dir);
  }
  TokenShard train(got[0].train_path);
  EXPECT_EQ(train.n_docs() + TokenShard(got[0].val_path).n_docs(), 30);
  // No temporary folders are left behind.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir / "cache")) entries += e.is_directory();
  EXPECT_EQ(entries, 1);
}

TEST(Dataset, TrainsBpeTokenizerWithTheData) {
  TempDir dir("dsbpe");
  for (int i = 0; i < 12; ++i) write_file(dir / ("src/d" + std::to_string(i) + ".txt"), generated_text(i, 8000));
  PrepareOptions opt;
  opt.quiet = true;
  Dataset d = prepare_dataset(dir / "src", "bpe:300", dir / "cache", opt);
  EXPECT_EQ(d.vocab_size, 300);
  EXPECT_EQ(fs::path(d.tokenizer_spec).filename(), "tokenizer.model");
  EXPECT_EQ(fs::path(d.tokenizer_spec).parent_path(), fs::path(d.dir));
  auto tok = load_tokenizer(d.tokenizer_spec);
  TokenShard val(d.val_path);
  std::vector<std::int32_t> ids(val.n_tokens());
  val.read(0, val.n_tokens(), ids.data());
  ASSERT_EQ(ids.back(), tok->eos_id());
  // The val shard decodes back to whole documents of the source.
  std::string text = tok->decode(ids);
  EXPECT_GT(text.size(), 1000u);
  Corpus c = list_corpus(dir / "src");
  auto is_val = split_by_document(c.docs, 0.02);
  std::string want;
  for (size_t i = 0; i < c.docs.size(); ++i)
    if (is_val[i]) want += read_document(c.docs[i]);
  EXPECT_EQ(text, want);
  // A bpe vocab the data cannot support is a clear error with a hint.
  expect_error([&] { prepare_dataset(dir / "src", "bpe:100000", dir / "cache", opt); }, {"bpe:N", "byte"});
  expect_error([&] { prepare_dataset(dir / "src", "bpe:abc", dir / "cache", opt); }, {"bpe:abc"});
  expect_error([&] { prepare_dataset(dir / "src", dir / "nope.model", dir / "cache", opt); }, {"nope.model"});
}

// Builds killed without a chance to clean up (kill -9) leave `<name>.tmp-PID-N` and `<name>.old-PID-N`; the next
// build of that dataset removes those of processes that are gone and keeps a live process's.
TEST(Dataset, NextBuildRemovesTemporariesOfDeadBuilds) {
  TempDir dir("stale");
  for (int i = 0; i < 6; ++i) write_file(dir / ("src/d" + std::to_string(i) + ".txt"), generated_text(i, 500));
  PrepareOptions opt;
  opt.quiet = true;
  const Dataset d = prepare_dataset(dir / "src", "byte", dir / "cache", opt);
  const pid_t dead = fork();  // a pid that is certainly gone: a child that exited and was reaped
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string live = std::to_string(::getpid()), gone = std::to_string(dead);
  for (const std::string& leftover : {".tmp-" + gone + "-0", ".old-" + gone + "-3", ".tmp-" + live + "-99"}) {
    write_file(d.dir + leftover + "/train.tok", "partial");
  }
  write_file(dir / "src/d0.txt", "changed, so the dataset is rebuilt\n");
  prepare_dataset(dir / "src", "byte", dir / "cache", opt);
  EXPECT_FALSE(fs::exists(d.dir + ".tmp-" + gone + "-0"));
  EXPECT_FALSE(fs::exists(d.dir + ".old-" + gone + "-3"));
  EXPECT_TRUE(fs::exists(d.dir + ".tmp-" + live + "-99"));  // might still be building
}

TEST(Dataset, SingleFileSplitsItsTokens) {
  TempDir dir("single");
  std::string text = generated_text(5, 5000);
  write_file(dir / "book.txt", text);
  PrepareOptions opt;
  opt.quiet = true;
  opt.val_fraction = 0.1;
  Dataset d = prepare_dataset(dir / "book.txt", "byte", dir / "cache", opt);
  TokenShard train(d.train_path), val(d.val_path);
  EXPECT_EQ(train.n_tokens() + val.n_tokens(), static_cast<std::int64_t>(text.size() + 1));
  EXPECT_EQ(val.n_tokens(), static_cast<std::int64_t>(std::llround((text.size() + 1) * 0.1)));
  EXPECT_EQ(val[val.n_tokens() - 1], 256);
  EXPECT_EQ(train[0], static_cast<unsigned char>(text[0]));
}

// ---------------------------------------------------------------------------------------------- loader

namespace {

// A shard of tokens 0, 1, 2, ... (uint32, vocab above n so no token is <eos>): inputs[b, 0] is the
// window's start position.
std::shared_ptr<TokenShard> arange_shard(const TempDir& dir, std::int32_t n) {
  std::vector<std::int32_t> toks = arange(n);
  std::string p = dir / ("arange" + std::to_string(n) + ".tok");
  write_shard(p, toks.data(), toks.size(), 1 << 20, (1 << 20) - 1, 0);
  return std::make_shared<TokenShard>(p);
}

std::vector<std::int32_t> starts(const Batch& b) {
  std::vector<std::int32_t> s;
  for (int r = 0; r < b.rows; ++r) s.push_back(b.inputs[static_cast<size_t>(r) * b.T]);
  return s;
}

}  // namespace

TEST(Loader, SameSeedSameBatchesTargetsShiftedByOne) {
  TempDir dir("loader");
  auto shard = arange_shard(dir, 5000);
  LoaderOptions o{.batch = 4, .seq_len = 16, .seed = 7};
  BatchLoader a(shard, o), b(shard, o);
  o.seed = 8;
  BatchLoader c(shard, o);
  Batch ba, bb, bc;
  bool any_diff = false;
  for (int step = 0; step < 20; ++step) {
    ASSERT_TRUE(a.next(ba));
    ASSERT_TRUE(b.next(bb));
    ASSERT_TRUE(c.next(bc));
    EXPECT_EQ(ba.inputs, bb.inputs);
    EXPECT_EQ(ba.targets, bb.targets);
    EXPECT_EQ(ba.doc_start, bb.doc_start);
    any_diff |= ba.inputs != bc.inputs;
    ASSERT_EQ(ba.rows, 4);
    for (int r = 0; r < 4; ++r)
      for (int t = 0; t < 16; ++t) {
        size_t i = static_cast<size_t>(r) * 16 + t;
        EXPECT_EQ(ba.targets[i], ba.inputs[i] + 1);  // next token of the same window
        if (t > 0) {
          EXPECT_EQ(ba.inputs[i], ba.inputs[i - 1] + 1);
        }
        EXPECT_EQ(ba.doc_start[i], 0);  // no <eos> in this shard
      }
  }
  EXPECT_TRUE(any_diff);
}

TEST(Loader, OneEpochVisitsEveryWindowOnce) {
  TempDir dir("epoch");
  const int T = 10;
  auto shard = arange_shard(dir, 1003);
  BatchLoader L(shard, {.batch = 3, .seq_len = T, .seed = 1});
  const std::int64_t N = L.windows_per_epoch();
  EXPECT_EQ(N, (1003 - T) / T);
  std::vector<std::int32_t> seen;
  Batch b;
  while (static_cast<std::int64_t>(seen.size()) < N) {
    ASSERT_TRUE(L.next(b));
    for (auto s : starts(b)) seen.push_back(s);
  }
  seen.resize(N);  // the last step runs into the next epoch
  const std::int32_t offset = *std::min_element(seen.begin(), seen.end());
  EXPECT_LT(offset, T);
  std::set<std::int32_t> windows;
  for (auto s : seen) {
    EXPECT_EQ((s - offset) % T, 0);
    EXPECT_LE(s + T + 1, 1003);
    windows.insert((s - offset) / T);
  }
  EXPECT_EQ(static_cast<std::int64_t>(windows.size()), N);
  EXPECT_EQ(L.state().epoch, 1u);
  EXPECT_FALSE(std::is_sorted(seen.begin(), seen.end()));  // shuffled
}

TEST(Loader, SavedStateContinuesTheIdenticalStream) {
  TempDir dir("resume");
  auto shard = arange_shard(dir, 700);  // 6 windows per epoch at T = 100: many epoch crossings
  LoaderOptions o{.batch = 4, .seq_len = 100, .seed = 123, .rank = 1, .world_size = 2};
  BatchLoader a(shard, o);
  Batch b;
  for (int i = 0; i < 5; ++i) a.next(b);
  std::string saved = a.state().to_json().dump();
  std::vector<std::vector<std::int32_t>> want;
  for (int i = 0; i < 9; ++i) {
    a.next(b);
    want.push_back(b.inputs);
  }
  o.seed = 999;  // the state's seed wins
  BatchLoader r(shard, o);
  LoaderState st = LoaderState::from_json(nlohmann::json::parse(saved));
  r.restore(st);
  EXPECT_EQ(r.state(), st);
  for (int i = 0; i < 9; ++i) {
    r.next(b);
    EXPECT_EQ(b.inputs, want[i]) << "step " << i;
  }
  // A state from another geometry or a broken one is refused by name.
  BatchLoader other(shard, {.batch = 4, .seq_len = 50, .seed = 123});
  expect_error([&] { other.restore(st); }, {"seq_len"});
  auto j = nlohmann::json::parse(saved);
  j.erase("cursor");
  expect_error([&] { LoaderState::from_json(j); }, {"cursor"});
  j = nlohmann::json::parse(saved);
  j["mode"] = "shuffled";
  expect_error([&] { LoaderState::from_json(j); }, {"mode"});
}

TEST(Loader, DocStartRestartsAfterEos) {
  TempDir dir("docstart");
  const std::int32_t E = 9;  // <eos>
  //                                  0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16
  std::vector<std::int32_t> toks = {1, 2, E, 3, 4, 5, E, E, 6, 7, 8, 1, 2, 3, E, 4, 5};
  std::string p = dir / "docs.tok";
  write_shard(p, toks.data(), toks.size(), 10, E, 4);
  auto shard = std::make_shared<TokenShard>(p);
  BatchLoader L(shard, {.batch = 2, .seq_len = 8, .mode = SampleMode::kSequential});
  Batch b;
  ASSERT_TRUE(L.next(b));
  ASSERT_EQ(b.rows, 2);
  // Row 0 = tokens[0..8): <eos> at 2, 6, 7. Row 1 = tokens[8..16): <eos> at 14 -> row position 6.
  std::vector<std::int32_t> want_ds = {0, 0, 0, 3, 3, 3, 3, 7, /* row 1 */ 0, 0, 0, 0, 0, 0, 0, 7};
  EXPECT_EQ(b.doc_start, want_ds);
  std::vector<std::int32_t> want_in = {1, 2, E, 3, 4, 5, E, E, 6, 7, 8, 1, 2, 3, E, 4};
  std::vector<std::int32_t> want_tg = {2, E, 3, 4, 5, E, E, 6, 7, 8, 1, 2, 3, E, 4, 5};
  EXPECT_EQ(b.inputs, want_in);
  EXPECT_EQ(b.targets, want_tg);
  EXPECT_FALSE(L.next(b));
  L.reset();
  EXPECT_TRUE(L.next(b));

  // Reference check on random windows of a random shard with many documents.
  Rng r(3);
  std::vector<std::int32_t> big(5000);
  for (auto& t : big) t = r.below(6) == 0 ? E : static_cast<std::int32_t>(r.below(9));
  write_shard(dir / "big.tok", big.data(), big.size(), 10, E, 0);
  BatchLoader R(std::make_shared<TokenShard>(dir / "big.tok"), {.batch = 3, .seq_len = 33, .seed = 5});
  for (int step = 0; step < 10; ++step) {
    R.next(b);
    for (int row = 0; row < 3; ++row)
      for (int t = 0; t < 33; ++t) {
        int first = t;  // walk back to just after the previous <eos> inside the row
        while (first > 0 && b.inputs[row * 33 + first - 1] != E) --first;
        EXPECT_EQ(b.doc_start[row * 33 + t], first);
      }
  }
}

TEST(Loader, RanksGetDisjointSlicesOfOneStream) {
  TempDir dir("ranks");
  auto shard = arange_shard(dir, 4000);
  const int W = 3, B = 2, T = 16;
  BatchLoader whole(shard, {.batch = B * W, .seq_len = T, .seed = 11});
  std::vector<std::unique_ptr<BatchLoader>> ranks;
  for (int r = 0; r < W; ++r)
    ranks.push_back(std::make_unique<BatchLoader>(
        shard, LoaderOptions{.batch = B, .seq_len = T, .seed = 11, .rank = r, .world_size = W}));
  std::set<std::int32_t> all;
  Batch bw, br;
  for (int step = 0; step < 30; ++step) {
    whole.next(bw);
    std::vector<std::int32_t> joined;
    for (int r = 0; r < W; ++r) {
      ranks[r]->next(br);
      for (auto s : starts(br)) joined.push_back(s);
      EXPECT_EQ(ranks[r]->state(), whole.state());  // every rank carries the same global position
    }
    EXPECT_EQ(joined, starts(bw));  // rank r holds slice r of the global batch
    for (auto s : joined) EXPECT_TRUE(all.insert(s).second) << "window " << s << " served twice";
    if (static_cast<std::int64_t>(all.size()) + B * W > whole.windows_per_epoch()) break;
  }

  // Sequential mode: ranks split the windows in order; the last step pads with ignored targets.
  auto small = arange_shard(dir, 10 * T + 1);  // exactly 10 windows
  std::vector<std::int32_t> seq;
  int steps = 0;
  for (;;) {
    std::vector<Batch> per(W);
    bool more = true;
    for (int r = 0; r < W; ++r) {
      if (steps == 0) ranks[r] = std::make_unique<BatchLoader>(
          small, LoaderOptions{.batch = B, .seq_len = T, .mode = SampleMode::kSequential, .rank = r, .world_size = W});
      more = ranks[r]->next(per[r]);
    }
    if (!more) break;
    ++steps;
    for (int r = 0; r < W; ++r) {
      for (auto s : starts(per[r])) seq.push_back(s);
      for (int row = per[r].rows; row < B; ++row)
        for (int t = 0; t < T; ++t) EXPECT_EQ(per[r].targets[row * T + t], -1);
    }
  }
  EXPECT_EQ(steps, 2);  // 10 windows / 6 per step
  std::vector<std::int32_t> want;
  for (int i = 0; i < 10; ++i) want.push_back(i * T);
  EXPECT_EQ(seq, want);
}

TEST(Loader, TooSmallShardIsAnError) {
  TempDir dir("small");
  auto shard = arange_shard(dir, 10);
  expect_error([&] { BatchLoader L(shard, {.batch = 1, .seq_len = 10}); }, {"arange10.tok", "seq_len"});
  BatchLoader ok(shard, {.batch = 4, .seq_len = 9});  // exactly one window; batches repeat it
  Batch b;
  ok.next(b);
  EXPECT_EQ(starts(b), (std::vector<std::int32_t>{0, 0, 0, 0}));
  expect_error([&] { BatchLoader L(shard, {.batch = 1, .seq_len = 4, .rank = 2, .world_size = 2}); }, {"rank"});
}

// ---------------------------------------------------------------------------------------------- CLI

#ifdef HLM_BINARY
namespace {
int run_cli(const std::string& args, std::string& out) {
  std::string cmd = std::string(HLM_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  out.clear();
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
}  // namespace

TEST(TokenizerCli, TrainEncodeDecode) {
  TempDir dir("cli");
  for (int i = 0; i < 6; ++i) write_file(dir / ("src/d" + std::to_string(i) + ".txt"), generated_text(i, 10000));
  std::string out;
  EXPECT_EQ(run_cli("tokenizer encode --tokenizer byte --text 'Hi é'", out), 0) << out;
  EXPECT_EQ(out, "72 105 32 195 169\n");
  EXPECT_EQ(run_cli("tokenizer decode --tokenizer byte --ids '72 105 256'", out), 0) << out;
  EXPECT_EQ(out, "Hi");
  EXPECT_EQ(run_cli("tokenizer train --data " + dir / "src" + " --vocab-size 300 --out " + dir / "t.model", out), 0)
      << out;
  EXPECT_TRUE(fs::exists(dir / "t.model"));
  EXPECT_EQ(run_cli("tokenizer encode --tokenizer " + dir / "t.model" + " --text 'the kernel'", out), 0) << out;
  auto tok = load_tokenizer(dir / "t.model");
  std::string want;
  for (auto id : tok->encode("the kernel")) {
    if (!want.empty()) want += ' ';
    want += std::to_string(id);
  }
  EXPECT_EQ(out, want + "\n");
  EXPECT_EQ(run_cli("tokenizer encode --tokenizer " + dir / "missing.model" + " --text x", out), 1);
  EXPECT_NE(out.find("error:"), std::string::npos) << out;
  EXPECT_NE(out.find("missing.model"), std::string::npos) << out;
  EXPECT_EQ(run_cli("tokenizer train --data " + dir / "nothing" + " --vocab-size 300 --out " + dir / "u.model", out), 1);
  EXPECT_NE(out.find("nothing"), std::string::npos) << out;
}
// Ctrl-C during a dataset build (here while its BPE tokenizer trains) removes the build folder and still ends the
// process by the signal, as a shell expects. ~1 s.
TEST(DatasetCli, InterruptedBuildRemovesItsTemporaryFolder) {
  TempDir dir("interrupt");
  for (int i = 0; i < 8; ++i) write_file(dir / ("src/d" + std::to_string(i) + ".txt"), generated_text(i, 500'000));
  const std::string cache = dir / "cache";
  const std::string cmd = "HLM_DATA_CACHE=" + cache + " exec " + HLM_BINARY +
                          " train --preset swa128-nope --set d_model=32 --set n_layers=2 --set n_heads=2 --set n_kv_heads=2 "
                          "--set head_dim=16 --set d_ff=64 --set max_seq_len=64 --set window=8 --threads 1 "
                          "--steps 1 --seq-len 32 --batch 2 --tokenizer bpe:2000 --data " +
                          dir / "src" + " --out " + dir / "run" + " 2>" + dir / "stderr.txt";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto building = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(cache, ec))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) return true;
    return false;
  };
  bool seen = false;
  for (int i = 0; i < 30000 && !(seen = building()); ++i) usleep(2000);
  ::kill(pid, SIGINT);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(seen) << "the build folder never appeared: " << slurp(dir / "stderr.txt");
  ASSERT_TRUE(WIFSIGNALED(st)) << "exit " << (WIFEXITED(st) ? WEXITSTATUS(st) : -1) << ": " << slurp(dir / "stderr.txt");
  EXPECT_EQ(WTERMSIG(st), SIGINT);
  EXPECT_FALSE(building());
  EXPECT_NE(slurp(dir / "stderr.txt").find("data: interrupted; removing the partial build " + cache + "/"),
            std::string::npos)
      << slurp(dir / "stderr.txt");
}

// Ctrl-C in each phase of a build (reading the tokenizer's sample, training the tokenizer, which runs in a child
// process, tokenising) ends the command within seconds and leaves no partial dataset, whether the signal has its
// default action (the command dies of SIGINT) or the process goes on after it (ignored, as in a script's
// background job: the build stops at its next check and the command exits 130). The signal is sent when the
// phase's progress line appears. ~10 s.
TEST(DatasetCli, CtrlCEndsEveryPhaseOfABuildPromptly) {
  TempDir dir("interrupt_phases");
  for (int i = 0; i < 8; ++i) write_file(dir / ("src/d" + std::to_string(i) + ".txt"), generated_text(i, 600'000));
  write_file(dir / "small/a.txt", generated_text(50, 60'000));
  const std::string tok = dir / "tok.model";
  ASSERT_EQ(std::system((std::string(HLM_BINARY) + " tokenizer train --data " + dir / "small" + " --out " + tok +
                         " --vocab-size 400 2>/dev/null").c_str()),
            0);
  struct Phase {
    const char* name;
    std::string tokenizer, line;
  };
  const std::vector<Phase> phases = {{"reading", "bpe:2000", "data: building"},
                                     {"tokenizer training", "bpe:2000", "data: training a SentencePiece"},
                                     {"tokenising", tok, "data: tokenising"}};
  int case_no = 0;
  for (bool ignored : {false, true})
    for (const Phase& ph : phases) {
      SCOPED_TRACE(std::string(ph.name) + (ignored ? ", SIGINT ignored" : ", default action"));
      const std::string cache = dir / ("cache" + std::to_string(case_no)), err = dir / ("stderr" + std::to_string(case_no) + ".txt");
      ++case_no;
      const std::string cmd = std::string(ignored ? "trap '' INT; " : "") + "HLM_DATA_CACHE=" + cache + " exec " +
                              HLM_BINARY + " train --preset swa128-nope --set d_model=32 --set n_layers=2 "
                              "--set n_heads=2 --set n_kv_heads=2 --set head_dim=16 --set d_ff=64 --set max_seq_len=64 "
                              "--set window=8 --threads 1 --steps 1 --seq-len 32 --batch 2 --tokenizer " + ph.tokenizer +
                              " --data " + dir / "src" + " --out " + dir / "run" + " 2>" + err;
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
        _exit(127);
      }
      bool seen = false;
      for (int i = 0; i < 30000 && !(seen = slurp(err).find(ph.line) != std::string::npos); ++i) usleep(2000);
      ::kill(pid, SIGINT);
      const auto sent = std::chrono::steady_clock::now();
      int st = 0;
      ::waitpid(pid, &st, 0);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
      ASSERT_TRUE(seen) << "the phase's line never appeared: " << slurp(err);
      EXPECT_LT(seconds, 5.0) << slurp(err);
      if (ignored) {
        ASSERT_TRUE(WIFEXITED(st)) << slurp(err);
        EXPECT_EQ(WEXITSTATUS(st), 130) << slurp(err);
        EXPECT_NE(slurp(err).find("interrupted: data: the build stopped while"), std::string::npos) << slurp(err);
      } else {
        ASSERT_TRUE(WIFSIGNALED(st)) << "exit " << (WIFEXITED(st) ? WEXITSTATUS(st) : -1) << ": " << slurp(err);
        EXPECT_EQ(WTERMSIG(st), SIGINT);
      }
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(cache, ec)) ADD_FAILURE() << "left behind: " << e.path();
      EXPECT_FALSE(fs::exists(dir / "run/run.json"));
    }
}
#endif

// ---------------------------------------------------------------------------------------------- default corpus

// Builds (or reuses) the real default dataset: minutes of work, so only with HLM_SLOW_TESTS=1.
TEST(DefaultCorpus, BuildsWithBpe4096) {
  const char* slow = std::getenv("HLM_SLOW_TESTS");
  if (!slow || std::string(slow) != "1") GTEST_SKIP() << "set HLM_SLOW_TESTS=1 to build the default corpus";
  Dataset d = prepare_dataset("default", "", "", {});
  EXPECT_EQ(d.vocab_size, 4096);
  EXPECT_GT(d.meta["documents"].get<std::int64_t>(), 3000);
  EXPECT_GT(d.meta["text_bytes"].get<std::int64_t>(), 30'000'000);
  TokenShard train(d.train_path), val(d.val_path);
  EXPECT_GT(val.n_tokens(), 100'000);
  EXPECT_GT(train.n_tokens(), 50 * val.n_tokens() / 2);
}

// ---- Hugging Face byte-level BPE (tokenizer.json) ----
// tests/data/hf_bpe_<family>/: small BPEs trained by the `tokenizers` library with the text pipeline of GPT-2,
// Llama 3 and Qwen2, and the ids and decodings `tokenizers` gave (tools/hf_check/make_bpe_fixtures.py).

namespace {

fs::path bpe_fixture(const std::string& family) { return fs::path(HLM_SOURCE_DIR) / "tests" / "data" / ("hf_bpe_" + family); }

}  // namespace

TEST(ByteLevelBpe, GivesTheIdsAndDecodingsOfHuggingFaceTokenizers) {
  for (const std::string family : {"gpt2", "llama3", "qwen2"}) {
    SCOPED_TRACE(family);
    auto tok = load_tokenizer((bpe_fixture(family) / "tokenizer.json").string());
    EXPECT_EQ(tok->name(), "hf-bpe423");
    EXPECT_EQ(tok->vocab_size(), 423);
    EXPECT_EQ(tok->eos_id(), 0);                            // <|endoftext|>
    EXPECT_EQ(tok->bos_id(), family == "llama3" ? 1 : -1);  // <|im_start|> where tokenizer_config.json names one
    const auto cases = nlohmann::json::parse(slurp((bpe_fixture(family) / "expected.json").string()));
    ASSERT_EQ(cases.size(), 12u);
    for (const auto& c : cases) {
      const std::string text = c["text"];
      SCOPED_TRACE(text);
      const auto want = c["ids"].get<std::vector<std::int32_t>>();
      EXPECT_EQ(tok->encode(text), want);
      EXPECT_EQ(tok->decode(want), c["decoded"].get<std::string>());
    }
  }
}

TEST(ByteLevelBpe, NormalizesAndMatchesAddedTokensLikeTokenizers) {
  auto qwen = load_tokenizer((bpe_fixture("qwen2") / "tokenizer.json").string());
  // NFC: a decomposed e + combining acute encodes as the composed character.
  EXPECT_EQ(qwen->encode("Cafe\u0301"), qwen->encode("Caf\u00e9"));
  auto gpt2 = load_tokenizer((bpe_fixture("gpt2") / "tokenizer.json").string());
  EXPECT_NE(gpt2->encode("Cafe\u0301"), gpt2->encode("Caf\u00e9"));  // no normalizer
  // Special and added tokens are cut out whole, wherever they are; special ones decode to nothing.
  EXPECT_EQ(qwen->encode("<|im_end|>"), std::vector<std::int32_t>{2});
  EXPECT_EQ(qwen->encode("<think><|endoftext|>"), (std::vector<std::int32_t>{420, 0}));
  EXPECT_EQ(qwen->decode({420, 0, 2, 421}), "<think></think>");
  // Malformed UTF-8 is read as U+FFFD, as Python's errors="replace" would have it.
  EXPECT_EQ(qwen->encode("a\xff b"), qwen->encode("a\ufffd b"));
}

TEST(ByteLevelBpe, ByteTableAndSplitBehaviours) {
  EXPECT_EQ(byte_level_char(' '), "\u0120");  // "Ġ"
  EXPECT_EQ(byte_level_char('A'), "A");
  EXPECT_EQ(byte_level_char(0xAD), "\u0143");  // the 68th unprintable byte: 256 + 33 + 34
  std::string b;
  ASSERT_TRUE(byte_level_byte("\u0120", b));
  EXPECT_EQ(b, " ");
  EXPECT_FALSE(byte_level_byte("\u4e2d", b));
  // The behaviours of a Split on "-", as `tokenizers` documents them for "the-final--countdown".
  auto split = [](const std::string& behavior) {
    const auto j = nlohmann::json::parse(R"({"type": "Split", "pattern": {"String": "-"}, "invert": false, "behavior": ")" +
                                         behavior + "\"}");
    return PreTokenizer::from_json(j, "t").split("the-final--countdown");
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Isolated"), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("Removed"), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (V{"the", "-final", "-", "-countdown"}));
}

TEST(ByteLevelBpe, RefusesWhatItCannotRunNamingTheKey) {
  const auto good = nlohmann::json::parse(slurp((bpe_fixture("qwen2") / "tokenizer.json").string()));
  const std::string config = slurp((bpe_fixture("qwen2") / "tokenizer_config.json").string());
  TempDir dir("hfbpe");
  auto try_json = [&](const nlohmann::json& t, const std::vector<std::string>& needles, bool with_config = true) {
    fs::remove_all(dir.path);
    write_file(dir / "tokenizer.json", t.dump());
    if (with_config) write_file(dir / "tokenizer_config.json", config);
    expect_error([&] { load_tokenizer(dir / "tokenizer.json"); }, needles);
  };
  auto edit = [&](auto&& change) {
    nlohmann::json t = good;
    change(t);
    return t;
  };
  try_json(edit([](auto& t) { t["model"]["type"] = "Unigram"; }), {"tokenizer.json: model.type", "Unigram"});
  try_json(edit([](auto& t) { t["model"]["byte_fallback"] = true; }), {"model.byte_fallback"});
  try_json(edit([](auto& t) { t["model"]["merges"][5] = {"zz", "qq"}; }), {"model.merges[5]"});
  try_json(edit([](auto& t) { t["normalizer"] = {{"type", "Lowercase"}}; }), {"normalizer.type", "Lowercase"});
  try_json(edit([](auto& t) { t["pre_tokenizer"]["pretokenizers"][0]["type"] = "Whitespace"; }),
           {"pre_tokenizer.pretokenizers[0].type", "Whitespace"});
  try_json(edit([](auto& t) { t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }),
           {"pre_tokenizer.pretokenizers[0].pattern.Regex", "bad regex"});
  try_json(edit([](auto& t) { t["pre_tokenizer"] = nullptr; }), {"no ByteLevel step"});
  try_json(edit([](auto& t) { t["decoder"] = {{"type", "Metaspace"}}; }), {"decoder.type"});
  try_json(edit([](auto& t) { t["added_tokens"][0]["lstrip"] = true; }), {"added_tokens[0].lstrip"});
  try_json(good, {"tokenizer_config.json", "not found", "eos_token"}, /*with_config=*/false);
  write_file(dir / "tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  expect_error([&] { load_tokenizer(dir / "tokenizer.json"); }, {"tokenizer_config.json", "eos_token", "<|nope|>"});
}
