#include "data/spm_tokenizer.h"

#include <sentencepiece_processor.h>

#include <exception>
#include <filesystem>

#include "core/error.h"
#include "data/interrupt_cleanup.h"

namespace hlm::data {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model_path, ec))
    fail("tokenizer: SentencePiece model {} not found (give \"byte\", an existing .model file, or train one "
         "with `hybridlm tokenizer train`)",
         model_path);
  path_ = std::filesystem::absolute(model_path).lexically_normal().string();
  // Some malformed models get past SentencePiece's own checks and throw from inside it (a piece that starts
  // with a NUL byte: Darts' "zero-length key", found by fuzz_tokenizer).
  sentencepiece::util::Status st;
  try {
    st = sp_->Load(path_);
  } catch (const std::exception& e) {
    fail("tokenizer: cannot load SentencePiece model {}: {}", model_path, e.what());
  }
  if (!st.ok()) fail("tokenizer: cannot load SentencePiece model {}: {}", model_path, st.ToString());
  vocab_ = sp_->GetPieceSize();
  eos_ = sp_->eos_id();
  bos_ = sp_->bos_id();
  if (eos_ < 0) fail("tokenizer: SentencePiece model {} has no <eos> piece (field eos_id); retrain it with eos_id >= 0", model_path);
  std::string stem = std::filesystem::path(path_).stem().string();
  name_ = "spm-" + stem;
  pieces_exact_ = pieces_start_at_words() && text_kept_as_is();
}

// No piece holds the escaped space after a character that is not one: every piece starts a word or is
// whitespace only, so none spans a place where a space follows a non-space.
bool SentencePieceTokenizer::pieces_start_at_words() const {
  const std::string space = "\xe2\x96\x81";  // U+2581, SentencePiece's escaped space
  for (int id = 0; id < vocab_; ++id) {
    const std::string& piece = sp_->IdToPiece(id);
    for (size_t at = piece.find(space, 1); at != std::string::npos; at = piece.find(space, at + 1))
      if (at < space.size() || piece.compare(at - space.size(), space.size(), space) != 0) return false;
  }
  return true;
}

// Leading, trailing and repeated spaces come back as they were, and a text starting without a space gets no
// dummy-prefix space: a piece of text encodes as it does inside the whole.
bool SentencePieceTokenizer::text_kept_as_is() const {
  const std::string probe = "x  y \n z ";
  const std::vector<std::int32_t> ids = encode_whole(probe);
  return !ids.empty() && sp_->IdToPiece(ids[0]).rfind("\xe2\x96\x81", 0) != 0 && decode(ids) == probe &&
         decode(encode_whole(" " + probe)) == " " + probe;
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<std::int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  if (!pieces_exact_ || text.size() <= kEncodePieceBytes) return encode_whole(text);
  std::vector<std::int32_t> ids;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.size();
    if (end - begin > kEncodePieceBytes) {
      // The last space after a non-space in the piece's second half, else a character boundary.
      const size_t limit = begin + kEncodePieceBytes;
      size_t cut = limit;
      while (cut > begin + kEncodePieceBytes / 2 && !(text[cut] == ' ' && text[cut - 1] != ' ')) --cut;
      if (cut <= begin + kEncodePieceBytes / 2) {
        cut = limit;
        while (cut > begin && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
      }
      end = cut;
    }
    throw_if_build_interrupted("tokenising a long document");
    const std::vector<std::int32_t> part = encode_whole(text.substr(begin, end - begin));
    ids.insert(ids.end(), part.begin(), part.end());
    begin = end;
  }
  return ids;
}

std::vector<std::int32_t> SentencePieceTokenizer::encode_whole(std::string_view text) const {
  std::vector<int> ids;
  auto st = sp_->Encode(absl::string_view(text.data(), text.size()), &ids);
  if (!st.ok()) fail("tokenizer: SentencePiece encode failed ({}): {}", path_, st.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::vector<int> v(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    HLM_CHECK(ids[i] >= 0 && ids[i] < vocab_, "SentencePieceTokenizer.decode: id {} at position {} outside [0, {}) of {}",
              ids[i], i, vocab_, path_);
    v[i] = ids[i];
  }
  std::string out;
  auto st = sp_->Decode(v, &out);
  if (!st.ok()) fail("tokenizer: SentencePiece decode failed ({}): {}", path_, st.ToString());
  return out;
}

}  // namespace hlm::data
