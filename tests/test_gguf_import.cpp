// GGUF import (model/gguf_import.h): a Gemma-3-shaped model written as a GGUF file with llama.cpp's names and
// conventions imports to the same config, the same weights bit for bit and the same logits; what the import does
// not compute (another architecture, an unread key, a tensor without a place, a missing or misshapen one) is refused
// naming the file and the key or tensor; the command makes a run folder generate reads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli_harness.h"
#include "core/error.h"
#include "core/gguf.h"
#include "gguf_image.h"
#include "model/config.h"
#include "model/gguf_import.h"
#include "model/model.h"

using namespace hlm;
using namespace hlm::testing::gguf_image;
namespace fs = std::filesystem;

namespace {

constexpr i64 kVocab = 260;  // 4 specials and the 256 byte pieces of the tokenizer below

ModelConfig tiny_gemma() {
  return resolve_config("gemma3-small", "",
                        {"d_model=32", "n_heads=2", "n_kv_heads=1", "head_dim=16", "d_ff=48", "vocab_size=260",
                         "max_seq_len=64", "window=4", "norm_eps=1e-6", "layer_types.S.rope_theta=10000",
                         "layer_types.F.query_pre_attn_scalar=16", "layer_types.S.query_pre_attn_scalar=16"});
}

// llama.cpp's name for a parameter of hybridlm's Gemma block (an independent table of the converter's names).
std::string gguf_name(const std::string& name, const std::string& arch = "gemma3") {
  if (arch == "qwen3" && name.find("post_attention_layernorm") != std::string::npos)  // its pre-MLP norm
    return "blk." + name.substr(13, name.find('.', 13) - 13) + ".ffn_norm.weight";
  static const std::map<std::string, std::string> top = {{"model.embed_tokens.weight", "token_embd.weight"},
                                                         {"model.norm.weight", "output_norm.weight"}};
  if (top.count(name)) return top.at(name);
  static const std::map<std::string, std::string> parts = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  const std::string pre = "model.layers.";
  const size_t dot = name.find('.', pre.size());
  return "blk." + name.substr(pre.size(), dot - pre.size()) + "." + parts.at(name.substr(dot + 1));
}

void tokenizer_kvs(std::vector<std::string>& kvs) {
  std::string tokens;
  std::vector<std::string> pieces = {"<pad>", "<eos>", "<bos>", "<unk>"};
  for (int b = 0; b < 256; ++b) pieces.push_back(fmt::format("<0x{:02X}>", b));
  std::string types, scores;
  for (size_t i = 0; i < pieces.size(); ++i) {
    tokens += gstr(pieces[i]);
    types += le(i < 4 ? 3 : 6, 4);  // control, byte
    scores += f32(0);
  }
  kvs.push_back(kv("tokenizer.ggml.model", VT::STRING, gstr("llama")));
  kvs.push_back(kv("tokenizer.ggml.tokens", VT::ARRAY, arr(VT::STRING, pieces.size(), tokens)));
  kvs.push_back(kv("tokenizer.ggml.scores", VT::ARRAY, arr(VT::FLOAT32, pieces.size(), scores)));
  kvs.push_back(kv("tokenizer.ggml.token_type", VT::ARRAY, arr(VT::INT32, pieces.size(), types)));
  kvs.push_back(kv("tokenizer.ggml.bos_token_id", VT::UINT32, u32(2)));
  kvs.push_back(kv("tokenizer.ggml.eos_token_id", VT::UINT32, u32(1)));
  kvs.push_back(kv("tokenizer.ggml.add_bos_token", VT::BOOL, std::string(1, '\1')));
  kvs.push_back(kv("tokenizer.ggml.add_space_prefix", VT::BOOL, std::string(1, '\0')));
}

// The model as llama.cpp's converter writes it: gemma3 metadata, every parameter as an F32 tensor under its GGUF
// name with the dims reversed (ne0 = the row length), no output.weight (tied).
Image gguf_of(const Model& m) {
  const ModelConfig& c = m.config();
  Image img;
  auto u = [](const std::string& k, std::uint32_t v) { return kv(k, VT::UINT32, u32(v)); };
  img.kvs = {kv("general.architecture", VT::STRING, gstr("gemma3")),
             kv("general.name", VT::STRING, gstr("tiny")),
             u("gemma3.context_length", static_cast<std::uint32_t>(c.max_seq_len)),
             u("gemma3.embedding_length", static_cast<std::uint32_t>(c.d_model)),
             u("gemma3.block_count", static_cast<std::uint32_t>(c.n_layers)),
             u("gemma3.feed_forward_length", static_cast<std::uint32_t>(c.d_ff)),
             u("gemma3.attention.head_count", 2),
             u("gemma3.attention.head_count_kv", 1),
             u("gemma3.attention.key_length", 16),
             u("gemma3.attention.value_length", 16),
             kv("gemma3.attention.layer_norm_rms_epsilon", VT::FLOAT32, f32(1e-6f)),
             kv("gemma3.rope.freq_base", VT::FLOAT32, f32(1000000.0f)),
             u("gemma3.attention.sliding_window", 4)};
  tokenizer_kvs(img.kvs);
  for (const ParamInfo& p : m.registry().all()) {
    TensorSpec t;
    t.name = gguf_name(p.name);
    for (int d = p.shape.ndim - 1; d >= 0; --d) t.dims.push_back(static_cast<std::uint64_t>(p.shape[d]));
    t.type = 0;
    t.bytes.assign(reinterpret_cast<const char*>(m.params() + p.offset), static_cast<size_t>(p.shape.numel()) * 4);
    img.tensors.push_back(std::move(t));
  }
  img.place();
  return img;
}

// Random weights, with norm weights off 1 so that a shift by Gemma's 1 would be seen.
void randomize(Model& m) {
  m.init(7);
  for (const ParamInfo& p : m.registry().all())
    if (p.name.find("norm") != std::string::npos)
      for (i64 i = 0; i < p.shape.numel(); ++i) m.params()[p.offset + i] = 0.5f + 0.01f * static_cast<float>(i % 97);
}

std::string refusal(const std::string& bytes) {
  return hlm::testing::error_of([&] {
    const GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "x.gguf");
    const GgufImport imp = gguf_import_config(f);
    Model m(imp.hf.config);
    load_gguf_weights(f, imp, m);
  });
}

}  // namespace

TEST(GgufImport, GemmaFileImportsToTheSameWeightsAndLogits) {
  Model want(tiny_gemma());
  randomize(want);
  const std::string bytes = gguf_of(want).build();
  const GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  const GgufImport imp = gguf_import_config(f);
  EXPECT_EQ(imp.hf.architecture, "Gemma3ForCausalLM");
  const ModelConfig& c = imp.hf.config;
  EXPECT_EQ(c.layer_pattern(), "SSSSSF");
  EXPECT_EQ(c.type('S').window, 4);
  EXPECT_EQ(c.type('S').rope_theta, 10000.0);
  EXPECT_EQ(c.type('F').rope_theta, 1000000.0);
  EXPECT_TRUE(c.tie_embeddings && c.sandwich_norm && c.scale_embeddings);
  EXPECT_EQ(c.mlp_activation, MlpActivation::geglu_tanh);
  Model got(c);
  load_gguf_weights(f, imp, got);
  ASSERT_EQ(got.param_floats(), want.param_floats());
  for (i64 i = 0; i < want.param_floats(); ++i) ASSERT_EQ(got.params()[i], want.params()[i]) << "float " << i;
  const std::vector<int32_t> ids = {2, 77, 101, 33, 250, 9, 140, 141, 142, 5, 6, 7};
  const i64 T = static_cast<i64>(ids.size());
  std::vector<float> a(static_cast<size_t>(T * kVocab)), b(a.size());
  want.forward_logits(ids.data(), nullptr, 1, T, a.data());
  got.forward_logits(ids.data(), nullptr, 1, T, b.data());
  EXPECT_EQ(a, b);
}

TEST(GgufImport, WhatIsNotComputedIsRefusedByName) {
  Model m(tiny_gemma());
  randomize(m);
  Image img = gguf_of(m);
  Image other = img;
  other.kvs[0] = kv("general.architecture", VT::STRING, gstr("llama4"));
  EXPECT_NE(refusal(other.build()).find("x.gguf: key 'general.architecture' = 'llama4' is not an architecture"),
            std::string::npos);
  Image capped = img;
  capped.kvs.push_back(kv("gemma3.final_logit_softcapping", VT::FLOAT32, f32(30.0f)));
  EXPECT_NE(refusal(capped.build()).find("key 'gemma3.final_logit_softcapping' is not read"), std::string::npos);
  Image stray = img;
  stray.tensors.push_back({"blk.0.attn_sinks.weight", {2}, 0, 0, f32_bytes({1, 2})});
  stray.place();
  EXPECT_NE(refusal(stray.build()).find("tensor 'blk.0.attn_sinks.weight' has no place"), std::string::npos);
  Image missing = img;
  missing.tensors.erase(missing.tensors.begin() + 3);
  missing.place();
  EXPECT_NE(refusal(missing.build()).find("no tensor for parameter"), std::string::npos);
  Image misshapen = img;
  for (TensorSpec& t : misshapen.tensors)
    if (t.name == "blk.1.ffn_up.weight") std::swap(t.dims[0], t.dims[1]);
  EXPECT_NE(refusal(misshapen.build()).find("tensor 'blk.1.ffn_up.weight' has shape [32, 48]"), std::string::npos);
}

#ifdef HLM_BINARY
// `hybridlm import FILE.gguf` writes a run folder with the file's tokenizer that generate reads; a bad file leaves
// no folder behind.
TEST(GgufImport, CommandMakesARunFolderThatGenerates) {
  const hlm::testing::ScratchDir scratch("hlm_gguf_import_");
  const fs::path gguf = scratch.path / "tiny.gguf", out = scratch.path / "run";
  Model m(tiny_gemma());
  randomize(m);
  std::ofstream(gguf, std::ios::binary) << gguf_of(m).build();
  hlm::testing::CliResult r = hlm::testing::run_cli("import " + gguf.string() + " --out " + out.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"gguf_architecture\":\"gemma3\""), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out / "tokenizer.gguf.json"));
  r = hlm::testing::run_cli("generate --ckpt " + out.string() + " --prompt abc --max-tokens 4 --json --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"prompt_tokens\":4"), std::string::npos) << r.out;  // <bos> a b c
  Image bad = gguf_of(m);
  bad.kvs.push_back(kv("gemma3.rope.scaling.type", VT::STRING, gstr("linear")));
  std::ofstream(scratch.path / "bad.gguf", std::ios::binary) << bad.build();
  hlm::testing::expect_cli_error(
      hlm::testing::run_cli("import " + (scratch.path / "bad.gguf").string() + " --out " +
                            (scratch.path / "bad").string()),
      "gemma3.rope.scaling.type");
  EXPECT_FALSE(fs::exists(scratch.path / "bad"));
}
#endif

// qwen3: full attention with QK-norm; the metadata alone gives the config, and the tensors land in its parameters.
TEST(GgufImport, Qwen3FileImportsItsConfigAndWeights) {
  Image img;
  auto u = [](const std::string& k, std::uint32_t v) { return kv(k, VT::UINT32, u32(v)); };
  img.kvs = {kv("general.architecture", VT::STRING, gstr("qwen3")),
             u("qwen3.context_length", 128),
             u("qwen3.embedding_length", 32),
             u("qwen3.block_count", 2),
             u("qwen3.feed_forward_length", 48),
             u("qwen3.attention.head_count", 4),
             u("qwen3.attention.head_count_kv", 2),
             u("qwen3.attention.key_length", 16),
             u("qwen3.attention.value_length", 16),
             kv("qwen3.attention.layer_norm_rms_epsilon", VT::FLOAT32, f32(1e-6f)),
             kv("qwen3.rope.freq_base", VT::FLOAT32, f32(1000000.0f))};
  // The shapes come from the config the metadata gives; the values are each tensor's index pattern.
  const std::string probe_bytes = [&] {
    Image p = img;
    p.tensors.push_back({"token_embd.weight", {32, 300}, 0, 0, std::string(32 * 300 * 4, '\0')});
    p.place();
    return p.build();
  }();
  const GgufFile probe = GgufFile::parse(probe_bytes.data(), probe_bytes.size(), "q.gguf");
  const GgufImport shape_of = gguf_import_config(probe);
  EXPECT_EQ(shape_of.hf.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(shape_of.hf.config.layer_pattern(), "FF");
  EXPECT_TRUE(shape_of.hf.config.type('F').qk_norm);
  EXPECT_EQ(shape_of.hf.config.rope_theta, 1000000.0);
  Model want(shape_of.hf.config);
  want.init(3);
  for (const ParamInfo& p : want.registry().all()) {
    if (p.name == "lm_head.weight") continue;  // a tied file has no output.weight
    TensorSpec t;
    t.name = gguf_name(p.name, "qwen3");
    for (int d = p.shape.ndim - 1; d >= 0; --d) t.dims.push_back(static_cast<std::uint64_t>(p.shape[d]));
    t.bytes.assign(reinterpret_cast<const char*>(want.params() + p.offset), static_cast<size_t>(p.shape.numel()) * 4);
    img.tensors.push_back(std::move(t));
  }
  img.place();
  const std::string bytes = img.build();
  const GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "q.gguf");
  const GgufImport imp = gguf_import_config(f);
  Model got(imp.hf.config);
  load_gguf_weights(f, imp, got);
  for (const ParamInfo& p : want.registry().all()) {
    const ParamInfo& q = got.registry().info(got.registry().find(p.name));
    const float* src = want.params() + (p.name == "lm_head.weight"
                                            ? want.registry().info(want.registry().find("model.embed_tokens.weight")).offset
                                            : p.offset);
    for (i64 i = 0; i < p.shape.numel(); ++i) ASSERT_EQ(got.params()[q.offset + i], src[i]) << p.name << " " << i;
  }
}
