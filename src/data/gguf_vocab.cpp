#include "data/gguf_vocab.h"

#include <set>

#include "core/error.h"

namespace hlm::data {

TokenizerVocab read_gguf_vocab(const GgufFile& f) {
  static const std::set<std::string> kKnown = {
      "model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id", "eos_token_id", "unknown_token_id",
      "padding_token_id", "add_bos_token", "add_eos_token", "add_space_prefix",
      // Read by chat front ends, not by the encoder.
      "add_sep_token", "seperator_token_id", "separator_token_id", "chat_template", "eot_token_id", "eom_token_id"};
  const std::string pre = "tokenizer.ggml.";
  for (const auto& kv : f.metadata()) {
    if (kv.key.compare(0, pre.size(), pre) != 0) continue;
    if (!kKnown.count(kv.key.substr(pre.size())))
      fail("{}: key '{}' is not read by hybridlm's GGUF tokenizer; refusing rather than encoding differently",
           f.path(), kv.key);
  }
  TokenizerVocab v;
  v.model = f.get_string(pre + "model");
  if (f.has(pre + "pre")) v.pre = f.get_string(pre + "pre");
  v.tokens = f.get_string_array(pre + "tokens");
  if (f.has(pre + "scores")) v.scores = f.get_float_array(pre + "scores");
  if (f.has(pre + "token_type"))
    for (std::int64_t t : f.get_int_array(pre + "token_type")) v.token_type.push_back(static_cast<std::int32_t>(t));
  if (f.has(pre + "merges")) v.merges = f.get_string_array(pre + "merges");
  auto id = [&](const char* k, std::int64_t& out) {
    if (f.has(pre + k)) out = f.get_int(pre + k);
  };
  id("bos_token_id", v.bos);
  id("eos_token_id", v.eos);
  id("unknown_token_id", v.unk);
  id("padding_token_id", v.pad);
  auto flag = [&](const char* k, std::optional<bool>& out) {
    if (f.has(pre + k)) out = f.get_bool(pre + k);
  };
  flag("add_bos_token", v.add_bos);
  flag("add_eos_token", v.add_eos);
  flag("add_space_prefix", v.add_space_prefix);
  return v;
}

}  // namespace hlm::data
