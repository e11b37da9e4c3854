#include "data/dataset.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "core/error.h"
#include "core/file_io.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/interrupt_cleanup.h"
#include "data/shard.h"
#include "data/spm_trainer.h"
#include "data/tokenizer.h"

#ifndef HLM_SOURCE_DIR
#define HLM_SOURCE_DIR "."
#endif

namespace hlm::data {

namespace fs = std::filesystem;

namespace {

constexpr int kMetaVersion = 1;
// Bump when the way shards or tokenizers are made changes (options, splitting, sampling): cached
// datasets built by an older recipe are rebuilt instead of silently reused.
constexpr const char* kRecipe = "r1";

// What the user asked for, parsed.
struct TokenizerRequest {
  enum Kind { kByte, kTrainBpe, kModelFile } kind = kByte;
  int bpe_vocab = 0;
  std::string model_path;  // absolute, for kModelFile
  std::string canonical;   // "byte", "bpe:N" or the absolute model path (compared on reuse)
  std::string tag;         // folder-name part
};

std::string hex8(std::uint64_t h) { return fmt::format("{:08x}", static_cast<std::uint32_t>(h >> 32)); }

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) out.push_back((std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_');
  return out.empty() ? "data" : out;
}

TokenizerRequest parse_tokenizer_spec(const std::string& spec_in) {
  TokenizerRequest r;
  std::string spec = spec_in.empty() ? kDefaultTokenizerSpec : spec_in;
  if (spec == "byte") {
    r.kind = TokenizerRequest::kByte;
    r.canonical = r.tag = "byte";
  } else if (spec == "bpe" || spec.rfind("bpe:", 0) == 0) {
    r.kind = TokenizerRequest::kTrainBpe;
    std::string n = spec == "bpe" ? "4096" : spec.substr(4);
    char* end = nullptr;
    long v = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || v < 260 || v > (1 << 20))
      fail("tokenizer spec \"{}\": bpe:N needs a vocab size N in [260, 1048576]", spec);
    r.bpe_vocab = static_cast<int>(v);
    r.canonical = fmt::format("bpe:{}", v);
    r.tag = fmt::format("bpe{}", v);
  } else {
    std::error_code ec;
    if (!fs::is_regular_file(spec, ec))
      fail("tokenizer: {} not found (give \"byte\", \"bpe:N\" to train one on the data, an existing SentencePiece "
           ".model file or a Hugging Face tokenizer.json)",
           spec);
    r.kind = TokenizerRequest::kModelFile;
    r.model_path = fs::absolute(spec).lexically_normal().string();
    r.canonical = r.model_path;
    // Same file name, different model -> different cache folder.
    r.tag = sanitize(fs::path(spec).stem().string()) + "-" + hex8(hash64(read_text_file(r.model_path)));
  }
  return r;
}

std::string recipe(const TokenizerRequest& req, const PrepareOptions& opt) {
  if (req.kind != TokenizerRequest::kTrainBpe) return kRecipe;
  return fmt::format("{} spm_sample_bytes={}", kRecipe, opt.spm_sample_bytes);
}

nlohmann::json read_json_file(const fs::path& p) {
  const std::string text = hlm::read_text_file(p.string(), "dataset file");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("dataset: {} is not valid JSON: {}", p.string(), e.what());
  }
}

template <typename T>
T meta_field(const nlohmann::json& j, const std::string& file, const char* key) {
  if (!j.is_object() || !j.contains(key)) fail("dataset: {} has no field \"{}\"; rebuild the dataset", file, key);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("dataset: {} field \"{}\" has the wrong type; rebuild the dataset", file, key);
  }
}

struct SplitStats {
  std::uint64_t docs = 0, text_bytes = 0, tokens = 0;
  nlohmann::json json(const std::string& file) const {
    return {{"file", file}, {"documents", docs}, {"text_bytes", text_bytes}, {"tokens", tokens}};
  }
};

// Tokenises every document (in parallel, a bounded batch at a time) into train.tok / val.tok.
void write_shards(const Corpus& corpus, const std::vector<bool>& is_val, const Tokenizer& tok,
                  const fs::path& dir, const PrepareOptions& opt, SplitStats& train, SplitStats& val) {
  ShardWriter wtrain((dir / "train.tok").string(), tok.vocab_size(), tok.eos_id());
  ShardWriter wval((dir / "val.tok").string(), tok.vocab_size(), tok.eos_id());
  const size_t n = corpus.docs.size();
  const std::int32_t eos = tok.eos_id();
  Timer timer;
  if (!opt.quiet) fmt::print(stderr, "data: tokenising {} documents with {} ...\n", n, tok.name());
  size_t begin = 0;
  while (begin < n) {
    // Batch by estimated text size (.gz text is ~4x its file size) so memory stays bounded.
    size_t end = begin;
    std::uint64_t est = 0;
    while (end < n && (end == begin || est < static_cast<std::uint64_t>(opt.batch_bytes))) {
      const Document& d = corpus.docs[end++];
      est += d.file_bytes * (d.path.size() > 3 && d.path.compare(d.path.size() - 3, 3, ".gz") == 0 ? 4 : 1);
    }
    std::vector<std::vector<std::int32_t>> ids(end - begin);
    std::vector<std::uint64_t> bytes(end - begin, 0);
    std::exception_ptr error;
    std::mutex error_mu;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = begin; i < end; ++i) {
      if (build_interrupted()) continue;  // checked below: the batch ends within a document
      try {
        std::string text = read_document(corpus.docs[i]);
        bytes[i - begin] = text.size();
        if (!text.empty()) {
          ids[i - begin] = tok.encode(text);
          ids[i - begin].push_back(eos);
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
    }
    throw_if_build_interrupted("tokenising");
    if (error) std::rethrow_exception(error);
    for (size_t i = begin; i < end; ++i) {
      const auto& v = ids[i - begin];
      if (v.empty()) continue;  // empty after decompression: no document
      if (n == 1) {
        // A single document cannot be split by document: its last val_fraction of tokens goes to val.
        size_t k = std::max<size_t>(1, static_cast<size_t>(std::llround(v.size() * opt.val_fraction)));
        k = std::min(k, v.size() - 1);
        wtrain.append(v.data(), v.size() - k, 1);
        wval.append(v.data() + (v.size() - k), k, 1);
        train = {1, bytes[0], v.size() - k};
        val = {1, 0, k};
        continue;
      }
      SplitStats& s = is_val[i] ? val : train;
      (is_val[i] ? wval : wtrain).append(v.data(), v.size(), 1);
      s.docs += 1;
      s.text_bytes += bytes[i - begin];
      s.tokens += v.size();
    }
    if (!opt.quiet)
      fmt::print(stderr, "data: tokenised {}/{} documents, {:.1f} MB -> {:.2f} M tokens ({:.1f} s)\n", end, n,
                 (train.text_bytes + val.text_bytes) / 1e6, (train.tokens + val.tokens) / 1e6, timer.seconds());
    begin = end;
  }
  if (train.tokens + val.tokens == 0) fail("no documents found in {} (every file is empty)", corpus.source);
  if (n > 1 && (train.docs == 0 || val.docs == 0))
    fail("dataset: {} has too few non-empty documents to split into train and val", corpus.source);
  wtrain.finish();
  wval.finish();
}

// Empty when the folder holds a complete dataset of this corpus made this way; else why not.
std::string stale_reason(const fs::path& dir, const Corpus& corpus, const TokenizerRequest& req,
                         const PrepareOptions& opt) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "meta.json", ec)) return "no meta.json";
  try {
    nlohmann::json m = read_json_file(dir / "meta.json");
    if (m.value("version", 0) != kMetaVersion) return "an older format";
    if (m.value("fingerprint", std::string()) != corpus.fingerprint()) return "the source files changed";
    if (m.value("tokenizer_request", std::string()) != req.canonical) return "another tokenizer";
    if (m.value("val_fraction", -1.0) != opt.val_fraction) return "another val fraction";
    if (m.value("recipe", std::string()) != recipe(req, opt)) return "an older recipe";
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

Dataset build(const Corpus& corpus, const std::string& data_spec, const TokenizerRequest& req, const fs::path& dir,
              const PrepareOptions& opt) {
  Timer timer;
  std::error_code ec;
  fs::create_directories(dir.parent_path(), ec);
  if (ec) fail("dataset: cannot create cache folder {}: {}", dir.parent_path().string(), ec.message());
  // Build in a private folder and rename it into place: readers never see a half-built dataset, and
  // two processes building at once do not clash.
  // Leftovers of builds that were killed (their process is gone: kill -9, or a signal the build did not
  // handle) would otherwise pile up: the build folder `.tmp-PID-N` and a replaced dataset `.old-PID-N`.
  const std::string name = dir.filename().string();
  for (const auto& e : fs::directory_iterator(dir.parent_path(), ec)) {
    std::string f = e.path().filename().string();
    if (f.size() <= name.size() + 5 || f.compare(0, name.size(), name) != 0) continue;
    const std::string kind = f.substr(name.size(), 5);
    if (kind != ".tmp-" && kind != ".old-") continue;
    long pid = std::strtol(f.c_str() + name.size() + 5, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
  fs::path tmp = dir;
  static std::atomic<unsigned> build_counter{0};
  tmp += fmt::format(".tmp-{}-{}", ::getpid(), build_counter++);
  fs::remove_all(tmp, ec);
  // Registered before the folder exists: a Ctrl-C at any point of the build removes it.
  InterruptCleanup on_interrupt(tmp.string());
  fs::create_directories(tmp, ec);
  if (ec) fail("dataset: cannot create {}: {}", tmp.string(), ec.message());
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code e;
      if (!p.empty()) fs::remove_all(p, e);
    }
  } cleanup{tmp};

  if (!opt.quiet)
    fmt::print(stderr, "data: building {} ({} documents) with tokenizer {} into {}\n", corpus.name,
               corpus.docs.size(), req.canonical, dir.string());
  std::vector<bool> is_val = split_by_document(corpus.docs, opt.val_fraction);

  std::string tok_meta;  // what meta.json records as the tokenizer
  double tok_seconds = 0;
  std::unique_ptr<Tokenizer> tok;
  if (req.kind == TokenizerRequest::kByte) {
    tok = std::make_unique<ByteTokenizer>();
    tok_meta = "byte";
  } else if (req.kind == TokenizerRequest::kModelFile) {
    tok = load_tokenizer(req.model_path);
    tok_meta = req.model_path;
  } else {
    Timer t;
    SpmTrainOptions so;
    so.vocab_size = req.bpe_vocab;
    so.sample_bytes = opt.spm_sample_bytes;
    std::vector<bool> train_docs(is_val.size());
    for (size_t i = 0; i < is_val.size(); ++i) train_docs[i] = !is_val[i];
    try {
      train_sentencepiece_on_corpus(corpus, corpus.docs.size() > 1 ? &train_docs : nullptr,
                                    (tmp / "tokenizer.model").string(), so);
    } catch (const Error& e) {
      fail("{} (try a smaller bpe:N or --tokenizer byte)", e.what());
    }
    tok = load_tokenizer((tmp / "tokenizer.model").string());
    tok_meta = "tokenizer.model";
    tok_seconds = t.seconds();
  }

  SplitStats train, val;
  write_shards(corpus, is_val, *tok, tmp, opt, train, val);

  nlohmann::json meta = {
      {"format", "hybridlm-dataset"},
      {"version", kMetaVersion},
      {"name", corpus.name},
      {"data_spec", data_spec},
      {"source", corpus.source},
      {"fingerprint", corpus.fingerprint()},
      {"tokenizer", tok_meta},
      {"tokenizer_request", req.canonical},
      {"recipe", recipe(req, opt)},
      {"tokenizer_name", tok->name()},
      {"vocab_size", tok->vocab_size()},
      {"eos_id", tok->eos_id()},
      {"bos_id", tok->bos_id()},
      {"val_fraction", opt.val_fraction},
      {"split", corpus.docs.size() > 1 ? "by document: hash64(key) / 2^64 < val_fraction, at least one val document"
                                       : "single document: its last val_fraction of tokens"},
      {"token_bytes", token_bytes_for_vocab(tok->vocab_size())},
      {"documents", train.docs + val.docs},
      {"text_bytes", train.text_bytes + val.text_bytes},
      {"tokens", train.tokens + val.tokens},
      {"train", train.json("train.tok")},
      {"val", val.json("val.tok")},
      {"tokenizer_train_seconds", tok_seconds},
      {"build_seconds", timer.seconds()},
  };
  {
    std::ofstream f(tmp / "meta.json");
    f << meta.dump(2) << "\n";
    if (!f) fail("dataset: cannot write {}", (tmp / "meta.json").string());
  }

  // Another process (e.g. another rank) may have finished the same build meanwhile: use its folder.
  if (stale_reason(dir, corpus, req, opt).empty()) return open_dataset(dir.string());
  // Replace a stale folder, or lose the race gracefully to another process that finished first.
  fs::path old;
  if (fs::exists(dir, ec)) {
    old = dir;
    old += fmt::format(".old-{}-{}", ::getpid(), build_counter++);
    fs::rename(dir, old, ec);
    if (ec) old.clear();
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    if (fs::exists(dir / "meta.json")) return open_dataset(dir.string());
    fail("dataset: cannot move {} to {}: {}", tmp.string(), dir.string(), ec.message());
  }
  cleanup.p.clear();
  if (!old.empty()) fs::remove_all(old, ec);
  if (!opt.quiet)
    fmt::print(stderr,
               "data: {}: {} documents ({} train / {} val), {:.1f} MB of text, {} tokens ({} train / {} val), "
               "vocab {}, built in {:.1f} s\n",
               dir.string(), train.docs + val.docs, train.docs, val.docs,
               (train.text_bytes + val.text_bytes) / 1e6, train.tokens + val.tokens, train.tokens, val.tokens,
               tok->vocab_size(), timer.seconds());
  return open_dataset(dir.string());
}

}  // namespace

std::string default_cache_dir() {
  if (const char* env = std::getenv("HLM_DATA_CACHE"); env && *env) return env;
  return (fs::path(HLM_SOURCE_DIR) / "data" / "cache").string();
}

Dataset open_dataset(const std::string& dir_in) {
  fs::path dir = fs::absolute(dir_in).lexically_normal();
  fs::path meta_path = dir / "meta.json";
  std::error_code ec;
  if (!fs::is_regular_file(meta_path, ec)) fail("dataset: {} not found", meta_path.string());
  const std::string mp = meta_path.string();
  Dataset d;
  d.meta = read_json_file(meta_path);
  if (meta_field<std::string>(d.meta, mp, "format") != "hybridlm-dataset")
    fail("dataset: {} field \"format\" is not \"hybridlm-dataset\"", mp);
  int version = meta_field<int>(d.meta, mp, "version");
  if (version != kMetaVersion)
    fail("dataset: {} has version {} (field version); this build reads version {}, rebuild it", mp, version,
         kMetaVersion);
  d.dir = dir.string();
  std::string tok = meta_field<std::string>(d.meta, mp, "tokenizer");
  if (tok == "byte") {
    d.tokenizer_spec = "byte";
  } else {
    fs::path tp = fs::path(tok).is_absolute() ? fs::path(tok) : dir / tok;
    if (!fs::is_regular_file(tp, ec))
      fail("dataset: tokenizer {} named by {} (field tokenizer) not found", tp.string(), mp);
    d.tokenizer_spec = tp.string();
  }
  d.vocab_size = meta_field<std::int64_t>(d.meta, mp, "vocab_size");
  d.eos_id = meta_field<std::int32_t>(d.meta, mp, "eos_id");
  auto shard_path = [&](const char* split) {
    if (!d.meta.contains(split)) fail("dataset: {} has no field \"{}\"; rebuild the dataset", mp, split);
    std::string file = meta_field<std::string>(d.meta[split], mp, "file");
    fs::path p = dir / file;
    // Header check only (cheap); the loader's shard opens verify the tokens.
    TokenShard s(p.string(), /*verify_tokens=*/false);
    if (s.vocab_size() != d.vocab_size || s.eos_id() != d.eos_id)
      fail("dataset: shard {} has vocab_size {} / eos_id {} but {} says {} / {} (field vocab_size)", p.string(),
           s.vocab_size(), s.eos_id(), mp, d.vocab_size, d.eos_id);
    return p.string();
  };
  d.train_path = shard_path("train");
  d.val_path = shard_path("val");
  return d;
}

Dataset prepare_dataset(const std::string& data_spec, const std::string& tokenizer_spec,
                        const std::string& cache_dir, const PrepareOptions& opt) {
  HLM_CHECK(!data_spec.empty(), "dataset: empty data spec (give \"default\", a text file or a folder)");
  std::error_code ec;
  if (data_spec != "default" && fs::is_regular_file(fs::path(data_spec) / "meta.json", ec)) {
    Dataset d = open_dataset(data_spec);
    if (!tokenizer_spec.empty()) {
      std::string req = d.meta.value("tokenizer_request", std::string());
      bool same = tokenizer_spec == req || tokenizer_spec == d.tokenizer_spec ||
                  (tokenizer_spec != "byte" && tokenizer_spec.rfind("bpe", 0) != 0 && fs::exists(tokenizer_spec, ec) &&
                   d.tokenizer_spec != "byte" && fs::equivalent(tokenizer_spec, d.tokenizer_spec, ec));
      if (!same)
        fail("dataset: {} was built with tokenizer {}, not {}; drop the tokenizer option or rebuild from text",
             data_spec, req.empty() ? d.tokenizer_spec : req, tokenizer_spec);
    }
    return d;
  }
  TokenizerRequest req = parse_tokenizer_spec(tokenizer_spec);
  Corpus corpus = open_corpus(data_spec);
  std::string name = corpus.name == "default" && data_spec == "default"
                         ? std::string("default")
                         : sanitize(corpus.name) + "-" + hex8(hash64(corpus.source));
  fs::path root = cache_dir.empty() ? fs::path(default_cache_dir()) : fs::path(cache_dir);
  fs::path dir = fs::absolute(root / (name + "-" + req.tag)).lexically_normal();

  if (fs::is_regular_file(dir / "meta.json", ec)) {
    std::string why = stale_reason(dir, corpus, req, opt);
    if (why.empty()) return open_dataset(dir.string());
    if (!opt.quiet) fmt::print(stderr, "data: rebuilding {} ({})\n", dir.string(), why);
  }
  return build(corpus, data_spec, req, dir, opt);
}

}  // namespace hlm::data
