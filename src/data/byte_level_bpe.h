#pragma once
// A byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (GPT-2, Llama 3, Qwen2/3, SmolLM3
// style): added tokens are cut out first, the rest is normalized, pre-tokenized (data/text_pipeline.h),
// mapped to byte-level characters and merged by BPE rank within each piece. The end-of-sequence and
// beginning-of-sequence tokens come from the `tokenizer_config.json` next to the file (`eos_token`,
// `bos_token`). Encoding is thread-safe. What is refused, and why, is in docs/hf.md.
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/text_pipeline.h"
#include "data/tokenizer.h"

namespace hlm::data {

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  // Throws hlm::Error naming the file and the JSON key of anything it cannot run exactly.
  explicit ByteLevelBpeTokenizer(const std::string& tokenizer_json_path);

  // A tokenizer.json held in memory (made from GGUF metadata, data/vocab_tokenizer.h) with its special
  // tokens given by id. `where` names the source in errors; `spec` is what load_tokenizer() takes to
  // recreate it. Added tokens with `raw_decode` decode to their content as written (GGUF user-defined tokens).
  struct Specials {
    std::int32_t eos = -1, bos = -1;
    bool add_bos = false, add_eos = false;
    std::vector<std::int32_t> raw_decode, silent;  // ids that decode as written / to nothing
  };
  ByteLevelBpeTokenizer(const nlohmann::json& tokenizer, const std::string& where, std::string spec, std::string name,
                        const Specials& specials);

  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  int vocab_size() const override { return static_cast<int>(id_to_token_.size()); }
  int eos_id() const override { return eos_; }
  int bos_id() const override { return bos_; }
  bool adds_bos() const override { return add_bos_; }
  bool adds_eos() const override { return add_eos_; }
  std::string name() const override { return name_.empty() ? "hf-bpe" + std::to_string(vocab_size()) : name_; }
  std::string spec() const override { return path_; }
  // True when made from a tokenizer.json file (which export can copy), false when made in memory.
  bool from_tokenizer_json() const { return name_.empty(); }

 private:
  struct AddedToken {
    std::string content;
    std::int32_t id;
    bool special, normalized;
  };
  struct Merge {
    std::int32_t rank, id;
  };

  // Everything of a tokenizer.json but the special ids; `where` names the source in errors.
  void load(const nlohmann::json& t, const std::string& where);
  void load_model(const nlohmann::json& model, const std::string& where);
  void load_added_tokens(const nlohmann::json& list, const std::string& where);
  void load_special_ids(const std::string& config_path);
  // Appends the ids of a text segment that holds no added token.
  void encode_plain(std::string_view segment, std::vector<std::int32_t>& ids) const;
  // Splits `text` at the added tokens of one kind (leftmost, longest first); calls plain(segment) for the
  // text between them and appends the ids of the tokens.
  template <typename Plain>
  void cut_added(std::string_view text, bool normalized, std::vector<std::int32_t>& ids, Plain&& plain) const;
  void merge_word(const std::string& word, std::vector<std::int32_t>& ids) const;

  std::string path_;
  TextNormalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  std::unordered_map<std::string, std::int32_t> vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;  // (left id, right id) -> rank and merged id
  std::vector<std::string> id_to_token_;
  std::vector<AddedToken> added_;  // longest content first
  std::array<std::vector<std::uint32_t>, 256> added_by_first_byte_;  // indices into added_, longest first
  enum Decode : char { kBytes, kSilent, kRaw };
  std::vector<char> decode_as_;    // by id: through the byte table, to nothing (special), or as written
  std::string name_;               // empty for a tokenizer.json file
  std::int32_t unk_ = -1, eos_ = -1, bos_ = -1;
  bool ignore_merges_ = false, add_bos_ = false, add_eos_ = false;
};

}  // namespace hlm::data
