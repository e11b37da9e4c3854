#include "train/checkpoint_reader.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "core/file_io.h"
#include "train/run_folder.h"

namespace hlm {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::string s = read_text_file(path, "JSON file", std::size_t{64} << 20);
  try {
    return nlohmann::json::parse(s);
  } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number too large
    fail("{}: malformed JSON: {}", path, e.what());
  }
}

}  // namespace

std::string latest_checkpoint_name(const fs::path& run_dir) {
  const fs::path lp = run_folder::latest(run_dir);
  if (!fs::exists(lp)) return "";
  std::string name = read_text_file(lp.string(), "'latest' file", 4096);
  name.erase(std::remove_if(name.begin(), name.end(), [](unsigned char c) { return std::isspace(c); }), name.end());
  if (run_folder::parse_step_name(name) < 0)
    fail("{}: names '{}', not a checkpoint of this run folder (expected step_NNNNNNNN)", lp.string(), name);
  return name;
}

std::string resolve_checkpoint(const std::string& path) {
  fs::path p(path);
  if (!fs::exists(p)) fail("{}: no such checkpoint or run folder", path);
  if (!fs::is_directory(p)) fail("{}: not a folder (expected a run folder or a checkpoint folder)", path);
  if (fs::exists(p / "model.safetensors")) return p.string();
  if (fs::exists(run_folder::latest(p))) {
    const fs::path c = run_folder::checkpoints(p) / latest_checkpoint_name(p);
    if (!fs::exists(c / "model.safetensors")) fail("{}: 'latest' names {} which has no model.safetensors", path, c.string());
    return c.string();
  }
  fail("{}: neither a checkpoint folder (model.safetensors) nor a run folder (latest)", path);
}

ModelConfig load_checkpoint_config(const std::string& ckpt_dir) {
  const std::string path = run_folder::model_config(ckpt_dir).string();
  return ModelConfig::from_json(read_json(path), path);
}

nlohmann::json load_trainer_state(const std::string& ckpt_dir) {
  const std::string path = run_folder::trainer_state(ckpt_dir).string();
  nlohmann::json st = read_json(path);
  if (!st.is_object()) fail("{}: expected a JSON object", path);
  if (!st.contains("step") || !st["step"].is_number_integer() || st["step"].get<long>() < 0)
    fail("{}: field 'step' must be a non-negative integer", path);
  if (!st.contains("train_loader") || !st["train_loader"].is_object())
    fail("{}: field 'train_loader' (the data position) must be an object", path);
  if (st.contains("tokens") && !st["tokens"].is_number()) fail("{}: field 'tokens' must be a number", path);
  if (st.contains("first_val_loss") && !st["first_val_loss"].is_number() && !st["first_val_loss"].is_null())
    fail("{}: field 'first_val_loss' must be a number", path);
  return st;
}

}  // namespace hlm
