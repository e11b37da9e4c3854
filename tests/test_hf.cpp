// Hugging Face interop without Python: config export/import mapping and refusals, weights written and read
// back give bitwise-equal logits, the exported tokenizers (the byte table; SentencePiece merges replayed as
// transformers' BPE would) reproduce hybridlm's token ids. tools/hf_check compares with transformers itself.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "data/byte_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/spm_tokenizer.h"
#include "data/spm_trainer.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"
#include "model/model.h"

namespace fs = std::filesystem;
using namespace hlm;
using json = nlohmann::json;

namespace {

const fs::path kRoot = fs::temp_directory_path() / ("hlm_hf_test_" + std::to_string(::getpid()));
struct RemoveRootAtExit {
  ~RemoveRootAtExit() { fs::remove_all(kRoot); }
} remove_root_at_exit;

fs::path temp_dir(const std::string& name) {
  fs::path d = kRoot / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

ModelConfig small(std::vector<std::string> sets) {
  std::vector<std::string> base = {"d_model=32", "n_layers=4", "n_heads=2", "n_kv_heads=1", "head_dim=16",
                                   "d_ff=48", "vocab_size=300", "max_seq_len=64", "window=8"};
  base.insert(base.end(), sets.begin(), sets.end());
  return resolve_config("swa128-nope", "", base);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

std::vector<float> logits_of(Model& m, const std::vector<int32_t>& ids) {
  std::vector<float> out(ids.size() * static_cast<size_t>(m.config().vocab_size));
  m.forward_logits(ids.data(), nullptr, 1, static_cast<i64>(ids.size()), out.data());
  return out;
}

}  // namespace

TEST(HfConfig, SwaNopeExportsToSmolLM3WithPerLayerRopeAndWindow) {
  const HfExport e = hf_export_config(small({}), {-1, 256});
  EXPECT_EQ(e.architecture, "SmolLM3ForCausalLM");
  const json& c = e.config;
  EXPECT_EQ(c["no_rope_layers"], json({1, 1, 1, 0}));
  EXPECT_EQ(c["layer_types"], json({"sliding_attention", "sliding_attention", "sliding_attention", "full_attention"}));
  EXPECT_EQ(c["sliding_window"], 8);  // both count the current token: t sees t-W+1..t
  EXPECT_EQ(c["use_sliding_window"], true);
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["head_dim"], 16);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["eos_token_id"], 256);
  EXPECT_TRUE(c["bos_token_id"].is_null());
  EXPECT_EQ(c["rope_parameters"]["rope_theta"], 10000.0);
}

TEST(HfConfig, QkNormExportsToQwen3AndTheRestIsRefusedWithTheReason) {
  EXPECT_EQ(hf_export_config(small({"layer_types.F.rope=true", "layer_types.F.qk_norm=true",
                                    "layer_types.S.qk_norm=true"}),
                             {})
                .architecture,
            "Qwen3ForCausalLM");
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"layer_types.F.qk_norm=true", "layer_types.S.qk_norm=true"}, "NoPE"},
      {{"layer_types.F.qk_norm=true"}, "QK-norm is on for F layers only"},
      {{"layer_types.F.rope=true", "layer_types.F.qk_norm=true", "layer_types.S.qk_norm=true", "norm_eps=1e-5"},
       "norm_eps"},
      {{"layer_types.S.head_dim=8"}, "layer_types.S.head_dim"},
      {{"pattern=MMMF", "layer_types.M.head_dim=16", "layer_types.F.rope=true"}, "norm_eps 1e-06 next to M layers"},
      {{"pattern=MMSF", "layer_types.M.head_dim=16", "norm_eps=1e-5"}, "S layers next to M layers"},
      {{"pattern=MMMF", "layer_types.M.head_dim=16", "norm_eps=1e-5"}, "F layers with NoPE next to M layers"},
      {{"pattern=GGSF"}, "layer type G (Gated DeltaNet)"},
      {{"pattern=GGGG"}, "norm_eps 1e-06 with G layers"},
      {{"pattern=LLLF"}, "layer type L (Lightning)"},
  };
  for (const auto& [sets, needle] : refused) {
    // An init-capture, not the binding itself: clang before 16 refuses to capture a structured binding.
    const std::string msg = error_of([&s = sets] { hf_export_config(small(s), {}); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' should contain '" << needle << "'";
  }
  EXPECT_NE(error_of([&] { hf_export_config(small({}), {-1, 300}); }).find("eos id 300"), std::string::npos);
}

TEST(HfConfig, MambaHybridExportsToBambaWithItsTensorNames) {
  const ModelConfig c = small({"pattern=MMFM", "layer_types.M.head_dim=16", "layer_types.F.rope=true",
                               "mamba_d_state=8", "norm_eps=1e-5"});
  const HfExport e = hf_export_config(c, {});
  EXPECT_EQ(e.architecture, "BambaForCausalLM");
  EXPECT_EQ(e.config["attn_layer_indices"], json({2}));
  EXPECT_EQ(e.config["mamba_n_heads"], 4);  // expand 2 x d_model 32 / head_dim 16
  EXPECT_EQ(e.config["mamba_d_state"], 8);
  EXPECT_EQ(e.config["rope_parameters"]["partial_rotary_factor"], 1.0);
  EXPECT_EQ(hf_tensor_name(e.architecture, "model.layers.0.mixer.in_proj.weight"), "model.layers.0.mamba.in_proj.weight");
  EXPECT_EQ(hf_tensor_name(e.architecture, "model.layers.2.mlp.up_proj.weight"),
            "model.layers.2.feed_forward.up_proj.weight");
  EXPECT_EQ(hf_tensor_name(e.architecture, "model.layers.2.post_attention_layernorm.weight"),
            "model.layers.2.pre_ff_layernorm.weight");
  EXPECT_EQ(hf_tensor_name(e.architecture, "model.norm.weight"), "model.final_layernorm.weight");
  EXPECT_EQ(hf_tensor_name("SmolLM3ForCausalLM", "model.norm.weight"), "model.norm.weight");
}

TEST(HfConfig, ExportThenImportGivesTheSameConfig) {
  for (const auto& sets : std::vector<std::vector<std::string>>{
           {}, {"pattern=SFSF", "layer_types.S.rope=false", "layer_types.F.rope=true"}, {"pattern=F"},
           {"layer_types.F.rope=true", "layer_types.F.qk_norm=true", "layer_types.S.qk_norm=true"},
           {"pattern=MMFM", "layer_types.M.head_dim=16", "layer_types.F.rope=true", "mamba_d_state=8", "norm_eps=1e-5"}}) {
    const ModelConfig c = small(sets);
    const HfImport imp = hf_import_config(hf_export_config(c, {}).config, "config.json");
    json want = c.to_json(), got = imp.config.to_json();
    want["pattern"] = c.layer_pattern(), got["pattern"] = imp.config.layer_pattern();  // "F" repeats as "FFFF"
    if (c.pattern.find('S') == std::string::npos) want.erase("window"), got.erase("window");  // unused without S
    EXPECT_EQ(got.dump(), want.dump()) << c.pattern;
    EXPECT_FALSE(imp.tied_embeddings);
  }
}

TEST(HfConfig, SmolLM3StyleFullRopeAndNopeLayersImportAsWideWindows) {
  // SmolLM3-3B: every layer full attention, NoPE on every 4th, tied embeddings, keys left to defaults.
  const json hf = {{"model_type", "smollm3"}, {"architectures", {"SmolLM3ForCausalLM"}}, {"vocab_size", 300},
                   {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 8},
                   {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"max_position_embeddings", 64},
                   {"rope_theta", 5e6}, {"rope_scaling", nullptr}, {"sliding_window", nullptr},
                   {"pretraining_tp", 2}};
  const HfImport imp = hf_import_config(hf, "config.json");
  EXPECT_EQ(imp.config.layer_pattern(), "SSSFSSSF");
  EXPECT_EQ(imp.config.type('S').window, 64);
  EXPECT_TRUE(imp.config.type('S').rope);
  EXPECT_FALSE(imp.config.type('F').rope);
  EXPECT_EQ(imp.config.head_dim, 16);
  EXPECT_EQ(imp.config.rope_theta, 5e6);
  EXPECT_TRUE(imp.tied_embeddings);
  ASSERT_EQ(imp.notes.size(), 1u);
}

TEST(HfConfig, ImportRefusalsNameTheKey) {
  json ok = hf_export_config(small({}), {}).config;
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"model_type", "llama"}}, "'model_type'"},
      {{{"some_new_option", 1}}, "'some_new_option'"},
      {{{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}}}, "rope_parameters.rope_type"},
      {{{"hidden_act", "gelu"}}, "'hidden_act'"},
      {{{"attention_bias", true}}, "'attention_bias'"},
      {{{"no_rope_layers", {1, 1}}}, "'no_rope_layers'"},
      {{{"layer_types", {"sliding_attention", "chunked_attention", "full_attention", "full_attention"}}},
       "layer_types[1]"},
  };
  for (const auto& [patch, needle] : cases) {
    json j = ok;
    j.merge_patch(patch);
    const std::string msg = error_of([&] { hf_import_config(j, "dir/config.json"); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' should contain " << needle;
    EXPECT_NE(msg.find("dir/config.json"), std::string::npos) << msg;
  }
}

TEST(HfWeights, WrittenAndReadBackGiveBitwiseEqualLogits) {
  const std::vector<int32_t> ids = {5, 17, 250, 3, 3, 99, 1, 0, 42, 7, 8, 9, 10, 11, 200, 201, 13};  // > window 8
  for (const auto& sets : std::vector<std::vector<std::string>>{
           {"pattern=MMFM", "layer_types.M.head_dim=16", "layer_types.F.rope=true", "mamba_d_state=8", "norm_eps=1e-5"},
           {"pattern=SFSF", "layer_types.F.rope=true", "layer_types.S.rope=false"}}) {
    const fs::path dir = temp_dir("weights");
    ModelConfig c = small(sets);
    Model a(c);
    a.init(7);
    const HfExport e = hf_export_config(c, {});
    write_hf_weights(a, e.architecture, (dir / "model.safetensors").string());
    if (e.architecture == "BambaForCausalLM") {
      EXPECT_TRUE(SafeTensorsFile::read((dir / "model.safetensors").string()).has("model.layers.0.mamba.A_log"));
    }
    const HfImport imp = hf_import_config(e.config, "config.json");
    Model b(imp.config);
    load_hf_weights(dir.string(), imp.architecture, b, false);
    EXPECT_EQ(logits_of(a, ids), logits_of(b, ids)) << c.pattern;
  }
  const fs::path dir = temp_dir("weights");
  ModelConfig c = small({"pattern=SFSF", "layer_types.F.rope=true", "layer_types.S.rope=false"});
  Model a(c);
  write_hf_weights(a, "SmolLM3ForCausalLM", (dir / "model.safetensors").string());
  const HfImport imp = hf_import_config(hf_export_config(c, {}).config, "config.json");

  // Tied: lm_head absent from the file is the embedding.
  SafeTensorsFile f = SafeTensorsFile::read((dir / "model.safetensors").string());
  SafeTensorsWriter w;
  for (const auto& t : f.tensors())
    if (t.name != "lm_head.weight") w.add_f32(t.name, t.shape, t.f32());
  const fs::path tied = temp_dir("tied");
  w.write((tied / "model.safetensors").string());
  Model t(imp.config);
  load_hf_weights(tied.string(), imp.architecture, t, true);
  const auto& reg = t.registry();
  const ParamInfo &h = reg.info(reg.find("lm_head.weight")), &e = reg.info(reg.find("model.embed_tokens.weight"));
  EXPECT_TRUE(std::equal(t.params() + h.offset, t.params() + h.offset + h.shape.numel(), t.params() + e.offset));
  EXPECT_NE(error_of([&] { load_hf_weights(tied.string(), imp.architecture, t, false); }).find("'lm_head.weight' is missing"),
            std::string::npos);

  // A tensor that does not belong to the model is named.
  w.add_f32("model.layers.0.self_attn.q_norm.weight", {16}, t.params());
  w.write((tied / "model.safetensors").string());
  EXPECT_NE(error_of([&] { load_hf_weights(tied.string(), imp.architecture, t, true); }).find("q_norm.weight"), std::string::npos);
}

TEST(HfWeights, GatedDeltaNetOnlyIsQwen3NextWithFusedProjectionsAndShiftedNorms) {
  const ModelConfig c = small({"pattern=GGGG", "layer_types.G.n_heads=2", "layer_types.G.head_dim=16", "norm_eps=1e-5"});
  const HfExport e = hf_export_config(c, {});
  ASSERT_EQ(e.architecture, "Qwen3NextForCausalLM");
  EXPECT_EQ(e.config["layer_types"], json(std::vector<std::string>(4, "linear_attention")));
  EXPECT_EQ(e.config["linear_num_key_heads"], 2);
  EXPECT_EQ(e.config["linear_value_head_dim"], 16);
  EXPECT_EQ(e.config["num_experts"], 0);
  Model a(c);
  a.init(7);
  // Norm weights off 1 (in [0.5, 2], where w - 1 and back are exact), so the shift is seen.
  const auto& reg = a.registry();
  for (const auto& p : reg.all())
    if (p.name.find("layernorm") != std::string::npos || p.name == "model.norm.weight")
      for (i64 i = 0; i < p.shape.numel(); ++i) a.params()[p.offset + i] = 0.75f + 0.01f * static_cast<float>(i % 7);
  const fs::path dir = temp_dir("qwen3next");
  write_hf_weights(a, e.architecture, (dir / "model.safetensors").string());
  SafeTensorsFile f = SafeTensorsFile::read((dir / "model.safetensors").string());
  auto param = [&](const std::string& n) { return a.params() + reg.info(reg.find(n)).offset; };
  const std::string pre = "model.layers.1.linear_attn.";
  const std::vector<float> qkvz = f.get(pre + "in_proj_qkvz.weight").to_f32(), ba = f.get(pre + "in_proj_ba.weight").to_f32();
  const i64 D = 32, K = 16;
  ASSERT_EQ(qkvz.size(), static_cast<size_t>(4 * 2 * K * D));
  // Head 1's rows: q_1 | k_1 | v_1 | z_1 after head 0's four blocks; z is the gate g_proj.
  EXPECT_TRUE(std::equal(qkvz.begin() + 5 * K * D, qkvz.begin() + 6 * K * D, param(pre + "k_proj.weight") + K * D));
  EXPECT_TRUE(std::equal(qkvz.begin() + 7 * K * D, qkvz.begin() + 8 * K * D, param(pre + "g_proj.weight") + K * D));
  EXPECT_TRUE(std::equal(ba.begin() + 3 * D, ba.begin() + 4 * D, param(pre + "a_proj.weight") + D));  // b_0 a_0 b_1 a_1
  EXPECT_TRUE(f.has(pre + "conv1d.weight") && f.has(pre + "norm.weight") && f.has(pre + "out_proj.weight"));
  EXPECT_FLOAT_EQ(f.get("model.norm.weight").to_f32()[0], 0.75f - 1.0f);
  // Imported back: the same function, bitwise.
  const HfImport imp = hf_import_config(e.config, "config.json");
  EXPECT_EQ(imp.config.layer_pattern(), "GGGG");
  Model b(imp.config);
  load_hf_weights(dir.string(), imp.architecture, b, false);
  const std::vector<int32_t> ids = {5, 17, 250, 3, 3, 99, 1, 0, 42, 7, 8, 9, 10, 11, 200, 201, 13};
  EXPECT_EQ(logits_of(a, ids), logits_of(b, ids));
  // Refusals name the key.
  json cfg = e.config;
  cfg["layer_types"][2] = "full_attention";
  EXPECT_NE(error_of([&] { hf_import_config(cfg, "config.json"); }).find("'layer_types[2]'"), std::string::npos);
  cfg = e.config;
  cfg["num_experts"] = 8;
  cfg["mlp_only_layers"] = json::array({0, 1, 3});
  EXPECT_NE(error_of([&] { hf_import_config(cfg, "config.json"); }).find("layer 2 has a mixture-of-experts MLP"),
            std::string::npos);
  cfg = e.config;
  cfg["linear_num_value_heads"] = 4;
  EXPECT_NE(error_of([&] { hf_import_config(cfg, "config.json"); }).find("'linear_num_value_heads'"), std::string::npos);
}

namespace {
// Gemma 3's block on the small config (docs/model.md "Gemma 3"): QK-norm, S's own RoPE base, the query scale from
// query_pre_attn_scalar 12 (head_dim is 16), sandwich norms, GeGLU, scaled embeddings.
ModelConfig small_gemma(std::vector<std::string> sets = {}) {
  std::vector<std::string> g = {"pattern=SSSF", "layer_types.F.rope=true", "layer_types.F.qk_norm=true",
                                "layer_types.S.qk_norm=true", "layer_types.S.rope_theta=500.0",
                                "layer_types.F.query_pre_attn_scalar=12", "layer_types.S.query_pre_attn_scalar=12",
                                "rope_theta=1000000.0", "mlp_activation=geglu_tanh", "sandwich_norm=true",
                                "scale_embeddings=true"};
  g.insert(g.end(), sets.begin(), sets.end());
  return small(g);
}
}  // namespace

TEST(HfConfig, GemmaBlockExportsToGemma3WithARopeBasePerLayerType) {
  const HfExport e = hf_export_config(small_gemma({"tie_embeddings=true"}), {2, 1});
  EXPECT_EQ(e.architecture, "Gemma3ForCausalLM");
  const json& c = e.config;
  EXPECT_EQ(c["model_type"], "gemma3_text");
  EXPECT_EQ(c["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_FALSE(c.contains("hidden_act"));
  EXPECT_EQ(c["query_pre_attn_scalar"], 12);
  EXPECT_EQ(c["sliding_window"], 8);
  EXPECT_EQ(c["layer_types"], json({"sliding_attention", "sliding_attention", "sliding_attention", "full_attention"}));
  EXPECT_EQ(c["rope_parameters"]["full_attention"]["rope_theta"], 1000000.0);
  EXPECT_EQ(c["rope_parameters"]["sliding_attention"]["rope_theta"], 500.0);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_TRUE(c["final_logit_softcapping"].is_null());
  EXPECT_TRUE(c["attn_logit_softcapping"].is_null());
  // Without the scalar set, Gemma's is head_dim: hybridlm's default scale.
  json j = small_gemma().to_json();
  for (const char* t : {"F", "S"}) j["layer_types"][t].erase("query_pre_attn_scalar");
  EXPECT_EQ(hf_export_config(ModelConfig::from_json(j, "test"), {}).config["query_pre_attn_scalar"], 16);
}

TEST(HfConfig, GemmaBlockRefusalsNameTheReason) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"layer_types.S.qk_norm=false"}, "layer_types.S.qk_norm is off"},
      {{"layer_types.S.rope=false"}, "layer_types.S.rope is off"},
      {{"sandwich_norm=false"}, "has all three"},
      {{"mlp_activation=swiglu"}, "has all three"},
      {{"layer_types.S.head_dim=8"}, "layer_types.S.head_dim"},
      {{"layer_types.S.query_pre_attn_scalar=16"}, "query_pre_attn_scalar differs"},
      {{"layer_types.F.query_pre_attn_scalar=12.5", "layer_types.S.query_pre_attn_scalar=12.5"}, "not an integer"},
      {{"norm_eps=1e-5"}, "norm_eps"},
      {{"pattern=MMSF", "layer_types.M.head_dim=16"}, "Gemma 3 has attention layers only"},
  };
  for (const auto& [sets, needle] : refused) {
    const std::string msg = error_of([&s = sets] { hf_export_config(small_gemma(s), {}); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' should contain '" << needle << "'";
  }
  EXPECT_NE(error_of([] { hf_export_config(small({"scale_embeddings=true"}), {}); }).find("has all three"),
            std::string::npos);
}

TEST(HfConfig, GemmaBlockExportThenImportGivesTheSameConfig) {
  for (const auto& sets : std::vector<std::vector<std::string>>{{"tie_embeddings=true"}, {}, {"pattern=F"}}) {
    const ModelConfig c = small_gemma(sets);
    const HfImport imp = hf_import_config(hf_export_config(c, {}).config, "config.json");
    EXPECT_EQ(imp.architecture, "Gemma3ForCausalLM");
    json want = c.to_json(), got = imp.config.to_json();
    want["pattern"] = c.layer_pattern(), got["pattern"] = imp.config.layer_pattern();
    if (c.pattern.find('S') == std::string::npos) want.erase("window"), got.erase("window");
    EXPECT_EQ(got.dump(), want.dump()) << c.pattern;
    EXPECT_EQ(imp.tied_embeddings, c.tie_embeddings);
  }
}

// google/gemma-3-270m's config.json as transformers 4.5x writes it: rope_theta and rope_local_base_freq at the top,
// _sliding_window_pattern, layer_types.
TEST(HfConfig, Gemma3_270mConfigImportsAsFiveSlidingLayersPerFullOne) {
  json layer_types = json::array();
  for (int l = 0; l < 18; ++l) layer_types.push_back((l + 1) % 6 ? "sliding_attention" : "full_attention");
  const json hf = {{"_sliding_window_pattern", 6}, {"architectures", {"Gemma3ForCausalLM"}},
                   {"attention_bias", false}, {"attention_dropout", 0.0}, {"attn_logit_softcapping", nullptr},
                   {"bos_token_id", 2}, {"eos_token_id", 1}, {"final_logit_softcapping", nullptr}, {"head_dim", 256},
                   {"hidden_activation", "gelu_pytorch_tanh"}, {"hidden_size", 640}, {"initializer_range", 0.02},
                   {"intermediate_size", 2048}, {"layer_types", layer_types}, {"max_position_embeddings", 32768},
                   {"model_type", "gemma3_text"}, {"num_attention_heads", 4}, {"num_hidden_layers", 18},
                   {"num_key_value_heads", 1}, {"pad_token_id", 0}, {"query_pre_attn_scalar", 256},
                   {"rms_norm_eps", 1e-06}, {"rope_local_base_freq", 10000.0}, {"rope_scaling", nullptr},
                   {"rope_theta", 1000000.0}, {"sliding_window", 512}, {"torch_dtype", "bfloat16"},
                   {"transformers_version", "4.55.0.dev0"}, {"use_bidirectional_attention", false},
                   {"use_cache", true}, {"vocab_size", 262144}};
  const HfImport imp = hf_import_config(hf, "config.json");
  const ModelConfig& c = imp.config;
  EXPECT_EQ(c.pattern, "SSSSSF");
  EXPECT_EQ(c.n_layers, 18);
  EXPECT_EQ(c.d_model, 640);
  EXPECT_EQ(c.d_ff, 2048);
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.max_seq_len, 32768);
  for (char t : {'S', 'F'}) {
    EXPECT_EQ(c.type(t).n_heads, 4);
    EXPECT_EQ(c.type(t).n_kv_heads, 1);
    EXPECT_EQ(c.type(t).head_dim, 256);
    EXPECT_TRUE(c.type(t).qk_norm && c.type(t).rope);
    EXPECT_EQ(c.type(t).query_pre_attn_scalar, 256.0);
  }
  EXPECT_EQ(c.type('S').window, 512);
  EXPECT_EQ(c.type('S').rope_theta, 10000.0);
  EXPECT_EQ(c.type('F').rope_theta, 1000000.0);
  EXPECT_TRUE(c.sandwich_norm && c.scale_embeddings && c.tie_embeddings);
  EXPECT_EQ(c.mlp_activation, MlpActivation::geglu_tanh);
  EXPECT_TRUE(imp.tied_embeddings);
  // Without layer_types: the pattern from sliding_window_pattern (transformers' default 6).
  json no_types = hf;
  no_types.erase("layer_types");
  EXPECT_EQ(hf_import_config(no_types, "config.json").config.layer_pattern(), c.layer_pattern());
  // Refusals name the key.
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"final_logit_softcapping", 30.0}}, "'final_logit_softcapping'"},
      {{{"attn_logit_softcapping", 50.0}}, "'attn_logit_softcapping'"},
      {{{"use_bidirectional_attention", true}}, "'use_bidirectional_attention'"},
      {{{"hidden_activation", "gelu"}}, "'hidden_activation'"},
      {{{"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}}, "'rope_scaling'"},
      {{{"rope_parameters", {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}}}}}},
       "'rope_parameters.full_attention.rope_type'"},
      {{{"rope_parameters", {{"rope_type", "default"}}}}, "'rope_parameters.rope_type'"},
      {{{"rms_norm_eps", 1e-5}}, "'rms_norm_eps'"},
      {{{"model_type", "gemma3"}}, "'model_type'"},
      {{{"layer_types", {"sliding_attention"}}}, "'layer_types'"},
  };
  for (const auto& [patch, needle] : cases) {
    json j = hf;
    j.merge_patch(patch);
    const std::string msg = error_of([&] { hf_import_config(j, "dir/config.json"); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << msg << "' should contain " << needle;
  }
}

// Gemma 3's weights are hybridlm's under the same names, every norm weight minus 1 (its RMSNorm multiplies by 1 + w);
// a tied model writes no lm_head, and a file's lm_head must then be the embedding.
TEST(HfWeights, GemmaBlockWrittenAndReadBackGiveBitwiseEqualLogits) {
  const std::vector<int32_t> ids = {5, 17, 250, 3, 3, 99, 1, 0, 42, 7, 8, 9, 10, 11, 200, 201, 13};  // > window 8
  for (bool tied : {true, false}) {
    const ModelConfig c = small_gemma({tied ? "tie_embeddings=true" : "tie_embeddings=false"});
    Model a(c);
    a.init(7);
    const auto& reg = a.registry();
    // Norm weights off 1, in [0.5, 2] where w - 1 and back are exact.
    for (const auto& p : reg.all())
      if (p.init == Init::Ones)
        for (i64 i = 0; i < p.shape.numel(); ++i) a.params()[p.offset + i] = 0.75f + 0.01f * static_cast<float>(i % 9);
    const HfExport e = hf_export_config(c, {});
    const fs::path dir = temp_dir("gemma");
    write_hf_weights(a, e.architecture, (dir / "model.safetensors").string());
    SafeTensorsFile f = SafeTensorsFile::read((dir / "model.safetensors").string());
    EXPECT_EQ(f.has("lm_head.weight"), !tied);
    for (const char* n : {"model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
                          "model.layers.0.pre_feedforward_layernorm.weight",
                          "model.layers.0.post_feedforward_layernorm.weight", "model.layers.3.self_attn.q_norm.weight",
                          "model.layers.3.self_attn.k_norm.weight", "model.norm.weight"})
      EXPECT_FLOAT_EQ(f.get(n).to_f32()[1], 0.76f - 1.0f) << n;
    EXPECT_FLOAT_EQ(f.get("model.layers.0.mlp.up_proj.weight").to_f32()[3],
                    a.params()[reg.info(reg.find("model.layers.0.mlp.up_proj.weight")).offset + 3]);
    const HfImport imp = hf_import_config(e.config, "config.json");
    Model b(imp.config);
    load_hf_weights(dir.string(), imp.architecture, b, imp.tied_embeddings);
    EXPECT_EQ(logits_of(a, ids), logits_of(b, ids)) << (tied ? "tied" : "untied");
  }
  // A tied model from a file that also holds lm_head: the embedding's copy loads, any other is refused by name.
  const ModelConfig c = small_gemma({"tie_embeddings=true"});
  Model a(c);
  a.init(8);
  const fs::path dir = temp_dir("gemma_head");
  write_hf_weights(a, "Gemma3ForCausalLM", (dir / "model.safetensors").string());
  SafeTensorsFile f = SafeTensorsFile::read((dir / "model.safetensors").string());
  const SafeTensor& embed = f.get("model.embed_tokens.weight");
  std::vector<float> head = embed.to_f32();
  for (bool same : {true, false}) {
    SafeTensorsWriter w;
    for (const auto& t : f.tensors()) w.add_f32(t.name, t.shape, t.f32());
    if (!same) head[5] += 1.0f;
    w.add_f32("lm_head.weight", embed.shape, head.data());
    w.write((dir / "model.safetensors").string());
    Model b(c);
    const std::string msg = error_of([&] { load_hf_weights(dir.string(), "Gemma3ForCausalLM", b, true); });
    if (same)
      EXPECT_EQ(msg, "");
    else
      EXPECT_NE(msg.find("'lm_head.weight' differs from model.embed_tokens.weight"), std::string::npos) << msg;
  }
}

TEST(HfTokenizer, ByteTokenizerJsonMapsEveryByteToItsIdAndImportsBack) {
  const fs::path dir = temp_dir("byte");
  data::ByteTokenizer tok;
  data::write_hf_tokenizer(tok, dir.string(), 64);
  const json t = read_json(dir / "tokenizer.json");
  const json& vocab = t["model"]["vocab"];
  ASSERT_EQ(vocab.size(), 256u);
  std::vector<bool> seen(256, false);
  for (auto& [sym, id] : vocab.items()) seen[id.get<int>()] = true;
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 256);
  EXPECT_EQ(vocab["A"], 65);                  // printable ASCII stands for itself
  EXPECT_EQ(vocab["\xc4\xa0"], 32);           // space -> U+0120, the byte-level table's stand-in
  EXPECT_EQ(vocab["\xc4\x80"], 0);            // byte 0 -> U+0100
  EXPECT_EQ(t["added_tokens"][0]["id"], 256);
  EXPECT_EQ(read_json(dir / "tokenizer_config.json")["eos_token"], "<eos>");
  EXPECT_EQ(data::import_hf_tokenizer(dir.string(), dir.string()).spec, "byte");
  fs::remove(dir / "tokenizer.json");
  EXPECT_TRUE(data::import_hf_tokenizer(dir.string(), dir.string()).spec.empty());
}

namespace {

// transformers' BPE over one word: symbols are characters (bytes <0xNN> for characters outside the
// vocabulary), then the adjacent pair of lowest merge rank joins, leftmost first, until none is left.
std::vector<int> replay_bpe(const json& model, const std::string& text) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t i = 0; i < model["merges"].size(); ++i)
    rank[{model["merges"][i][0].get<std::string>(), model["merges"][i][1].get<std::string>()}] = i;
  std::string s;
  for (char ch : text) s += ch == ' ' ? std::string("\xe2\x96\x81") : std::string(1, ch);
  std::vector<std::string> sym;
  for (size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t n = lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
    const std::string c = s.substr(i, n);
    if (model["vocab"].contains(c)) {
      sym.push_back(c);
    } else {
      for (char b : c) sym.push_back(fmt::format("<0x{:02X}>", static_cast<unsigned char>(b)));
    }
    i += n;
  }
  while (true) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = rank.find({sym[i], sym[i + 1]});
      if (it != rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == SIZE_MAX) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<long>(at) + 1);
  }
  std::vector<int> ids;
  for (auto& x : sym) ids.push_back(model["vocab"][x].get<int>());
  return ids;
}

}  // namespace

TEST(HfTokenizer, SentencePieceMergesReplayToTheSameIds) {
  const fs::path dir = temp_dir("spm");
  std::vector<std::string> sentences;
  for (int i = 0; i < 200; ++i)
    sentences.push_back("The model reads " + std::to_string(i * 37) + " tokens; the window holds the latest ones.\n"
                        "    indented  code(x) returns x ** 2\n");
  data::SpmTrainOptions opt;
  opt.vocab_size = 300;
  opt.threads = 1;
  data::train_sentencepiece(sentences, (dir / "m.model").string(), opt);
  data::SentencePieceTokenizer tok((dir / "m.model").string());
  const fs::path out = temp_dir("spm_hf");
  data::write_hf_tokenizer(tok, out.string(), 64);
  const json t = read_json(out / "tokenizer.json");
  EXPECT_EQ(t["model"]["vocab"].size(), 300u);
  EXPECT_EQ(t["model"]["byte_fallback"], true);
  EXPECT_GT(t["model"]["merges"].size(), 0u);
  for (const std::string text : {"The model reads 1234 tokens; the window holds the latest ones.",
                                 "  two  spaces and\ttabs\n", "caf\xc3\xa9 \xf0\x9f\x99\x82 unseen", " x ** 2"})
  {
    const std::vector<int32_t> want = tok.encode(text);
    EXPECT_EQ(replay_bpe(t["model"], text), std::vector<int>(want.begin(), want.end())) << text;
  }
  EXPECT_TRUE(fs::exists(out / "tokenizer.model"));
  const auto imp = data::import_hf_tokenizer(out.string(), temp_dir("spm_import").string());
  EXPECT_NE(imp.spec.find("tokenizer.model"), std::string::npos);
}

namespace {

// Runs the hybridlm binary; returns the exit code, stderr in *err.
int hybridlm(const std::string& args, std::string* err = nullptr) {
  const fs::path log = kRoot / "stderr.txt";
  const int st = std::system((std::string(HLM_BINARY) + " " + args + " >/dev/null 2>" + log.string()).c_str());
  if (err) {
    std::ifstream f(log);
    err->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST(HfCli, TrainExportImportThenGenerateAndEvaluate) {
  const fs::path d = temp_dir("cli");
  {
    std::ofstream f(d / "corpus.txt");
    for (int i = 0; i < 300; ++i) f << "Line " << i << ": the window holds the latest tokens.\n";
  }
  ::setenv("HLM_DATA_CACHE", (d / "cache").c_str(), 1);
  const std::string model = "--set d_model=32 --set n_layers=2 --set n_heads=2 --set n_kv_heads=1 --set head_dim=16 "
                            "--set d_ff=48 --set max_seq_len=64 --set window=8 --set pattern=SF ";
  ASSERT_EQ(hybridlm("train " + model + "--data " + (d / "corpus.txt").string() +
                     " --tokenizer byte --steps 2 --seq-len 32 --batch 2 --quiet --threads 1 --out " + (d / "run").string()),
            0);
  std::string err;
  ASSERT_EQ(hybridlm("export --ckpt " + (d / "run").string() + " --format hf --out " + (d / "hf").string(), &err), 0) << err;
  EXPECT_EQ(read_json(d / "hf" / "config.json")["model_type"], "smollm3");
  ASSERT_EQ(hybridlm("import " + (d / "hf").string() + " --out " + (d / "imported").string(), &err), 0) << err;
  EXPECT_EQ(read_json(d / "imported" / "run.json")["tokenizer"], "byte");
  EXPECT_EQ(hybridlm("generate --ckpt " + (d / "imported").string() + " --prompt Line --max-tokens 4 --json", &err), 0)
      << err;
  EXPECT_EQ(hybridlm("logits --ckpt " + (d / "imported").string() + " --tokens \"1 2 3\" --out " +
                     (d / "l.safetensors").string()),
            0);
  EXPECT_EQ(SafeTensorsFile::read((d / "l.safetensors").string()).get("logits").shape, Shape({3, 257}));

  // Bad input: one-line errors naming the flag, the token or the key; a refused export writes nothing.
  EXPECT_NE(hybridlm("export --ckpt " + (d / "run").string() + " --format onnx --out " + (d / "x").string(), &err), 0);
  EXPECT_NE(err.find("--format 'onnx'"), std::string::npos) << err;
  EXPECT_NE(hybridlm("logits --ckpt " + (d / "run").string() + " --tokens \"1 999\" --out " + (d / "l2").string(), &err), 0);
  EXPECT_NE(err.find("'999'"), std::string::npos) << err;
  json cfg = read_json(d / "hf" / "config.json");
  cfg["rope_parameters"]["rope_type"] = "yarn";
  std::ofstream(d / "hf" / "config.json") << cfg.dump();
  EXPECT_NE(hybridlm("import " + (d / "hf").string() + " --out " + (d / "imported2").string(), &err), 0);
  EXPECT_NE(err.find("rope_parameters.rope_type"), std::string::npos) << err;
  ASSERT_EQ(hybridlm("train " + model + "--set pattern=LF --data " + (d / "corpus.txt").string() +
                     " --tokenizer byte --steps 1 --seq-len 32 --batch 2 --quiet --threads 1 --out " + (d / "runL").string()),
            0);
  EXPECT_NE(hybridlm("export --ckpt " + (d / "runL").string() + " --format hf --out " + (d / "hfL").string(), &err), 0);
  EXPECT_NE(err.find("layer type L (Lightning)"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(d / "hfL"));
}
