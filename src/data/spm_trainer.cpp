#include "data/spm_trainer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "data/interrupt_cleanup.h"

namespace hlm::data {

namespace {

// Hands in-memory sentences to the trainer without a temporary text file.
class VectorIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

constexpr size_t kChunkBytes = 2048;     // target sentence size handed to the trainer
constexpr size_t kMaxSentence = 16384;   // the trainer drops longer sentences

// Back off to a UTF-8 character boundary at or before `pos`.
size_t utf8_floor(const std::string& s, size_t pos) {
  while (pos > 0 && pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

void chunk_text(const std::string& text, std::vector<std::string>& out) {
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = std::min(text.size(), begin + kChunkBytes);
    if (end < text.size()) {
      // The last newline of this chunk, searched within it only (a search back to the start of the text made
      // a single long line quadratic).
      const size_t nl = std::string_view(text).substr(begin, end - begin).rfind('\n');
      if (nl != std::string_view::npos) {
        end = begin + nl + 1;  // keep the newline with its line
      } else {
        // One very long line: cut it, but never inside a UTF-8 character.
        size_t cut = utf8_floor(text, end);
        end = cut > begin ? cut : end;
      }
    }
    out.emplace_back(text, begin, end - begin);
    begin = end;
  }
}

// The trainer itself, in the calling process (the child of train_sentencepiece).
void train_here(const std::vector<std::string>& sentences, const std::string& out_path, const SpmTrainOptions& opt) {
  int threads = opt.threads > 0 ? opt.threads : hlm::num_threads();
  std::unordered_map<std::string, std::string> kw = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      // Byte-exact text: keep indentation, newlines and every code point as it is.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"split_by_whitespace", opt.split_by_whitespace ? "true" : "false"},
      {"max_sentencepiece_length", std::to_string(opt.max_piece_chars)},
      {"max_sentence_length", std::to_string(kMaxSentence)},
      // Our own deterministic sample is the input: no further sampling or shuffling inside spm.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", std::to_string(threads)},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", opt.verbose ? "0" : "2"},
  };
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(opt.seed % 0x7fffffffu) + 1);
  VectorIterator it(sentences);
  std::string model;
  auto st = sentencepiece::SentencePieceTrainer::Train(kw, &it, &model);
  if (!st.ok())
    fail("tokenizer train: SentencePiece failed for {} (vocab size {}): {}", out_path, opt.vocab_size, st.ToString());

  namespace fs = std::filesystem;
  fs::path out = fs::absolute(out_path);
  std::error_code ec;
  if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);
  std::string tmp = out.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("tokenizer train: cannot write {}", tmp);
    f.write(model.data(), static_cast<std::streamsize>(model.size()));
    if (!f) fail("tokenizer train: cannot write {}", tmp);
  }
  fs::rename(tmp, out, ec);
  if (ec) fail("tokenizer train: cannot rename {} to {}: {}", tmp, out.string(), ec.message());
}

}  // namespace

void train_sentencepiece(const std::vector<std::string>& sentences, const std::string& out_path,
                         const SpmTrainOptions& opt) {
  HLM_CHECK(opt.vocab_size >= 260, "tokenizer train: vocab size {} too small (byte fallback alone needs 259 pieces)",
            opt.vocab_size);
  HLM_CHECK(!sentences.empty(), "tokenizer train: no training text");
  HLM_CHECK(!out_path.empty(), "tokenizer train: empty output path");
  // SentencePiece's trainer runs for minutes without a way to stop it: it runs in a child process, which the
  // build's interrupt handler kills (data/interrupt_cleanup.h) and which dies with this process.
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) fail("tokenizer train: cannot create a pipe ({})", std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    fail("tokenizer train: cannot start the trainer process ({})", std::strerror(err));
  }
  if (pid == 0) {  // the child: train, report an error through the pipe, end without the parent's exit handlers
    ::close(pipe_fds[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    std::string error;
    try {
      train_here(sentences, out_path, opt);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (error.empty()) ::_exit(0);
    for (size_t at = 0; at < error.size();) {
      const ssize_t w = ::write(pipe_fds[1], error.data() + at, error.size() - at);
      if (w <= 0) break;
      at += static_cast<size_t>(w);
    }
    ::_exit(1);
  }
  ::close(pipe_fds[1]);
  set_build_child(pid);
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    if (build_interrupted()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      set_build_child(0);
      ::close(pipe_fds[0]);
      throw_if_build_interrupted("training the SentencePiece tokenizer");
    }
    ::usleep(10'000);
  }
  set_build_child(0);
  if (build_interrupted()) {  // the handler killed the child before the loop saw the flag
    ::close(pipe_fds[0]);
    throw_if_build_interrupted("training the SentencePiece tokenizer");
  }
  std::string error;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) error.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  if (!error.empty()) throw Error(error);
  if (WIFSIGNALED(status))
    fail("tokenizer train: the SentencePiece trainer (pid {}) for {} died of signal {} ({})", pid, out_path,
         WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  fail("tokenizer train: the SentencePiece trainer (pid {}) for {} ended with exit code {}", pid, out_path,
       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

std::vector<std::string> sample_sentences(const Corpus& corpus, const std::vector<bool>* include,
                                          std::int64_t sample_bytes, std::uint64_t seed) {
  HLM_CHECK(sample_bytes > 0, "tokenizer train: sample size {} bytes must be positive", sample_bytes);
  std::vector<size_t> order;
  for (size_t i = 0; i < corpus.docs.size(); ++i)
    if (!include || (*include)[i]) order.push_back(i);
  std::vector<std::uint64_t> h(corpus.docs.size());
  for (size_t i : order) h[i] = hash64(corpus.docs[i].key, seed ^ 0x5eedULL);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return h[a] < h[b]; });

  // Read in parallel, a block of documents at a time, and stop once the budget is reached.
  std::vector<std::string> sentences;
  std::int64_t taken = 0;
  const size_t block = 64;
  for (size_t b = 0; b < order.size() && taken < sample_bytes; b += block) {
    throw_if_build_interrupted("reading the tokenizer's sample");
    size_t e = std::min(order.size(), b + block);
    std::vector<std::string> texts(e - b);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = b; i < e; ++i) texts[i - b] = read_document(corpus.docs[order[i]]);
    for (auto& t : texts) {
      if (taken >= sample_bytes) break;
      if (static_cast<std::int64_t>(t.size()) > sample_bytes - taken) t.resize(utf8_floor(t, sample_bytes - taken));
      taken += static_cast<std::int64_t>(t.size());
      chunk_text(t, sentences);
    }
  }
  return sentences;
}

void train_sentencepiece_on_corpus(const Corpus& corpus, const std::vector<bool>* include,
                                   const std::string& out_path, const SpmTrainOptions& opt) {
  Timer timer;
  std::vector<std::string> sentences = sample_sentences(corpus, include, opt.sample_bytes, opt.seed);
  std::int64_t bytes = 0;
  for (const auto& s : sentences) bytes += static_cast<std::int64_t>(s.size());
  if (bytes == 0) fail("tokenizer train: the documents of {} hold no text", corpus.source);
  fmt::print(stderr, "data: training a SentencePiece BPE tokenizer ({} pieces) on {:.1f} MB of {} ...\n",
             opt.vocab_size, bytes / 1e6, corpus.name);
  train_sentencepiece(sentences, out_path, opt);
  fmt::print(stderr, "data: wrote {} ({:.1f} s)\n", out_path, timer.seconds());
}

}  // namespace hlm::data
