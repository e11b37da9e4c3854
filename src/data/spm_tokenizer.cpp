#include "data/spm_tokenizer.h"

#include <sentencepiece_processor.h>

#include <exception>
#include <filesystem>

#include "core/error.h"

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
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<std::int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
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
