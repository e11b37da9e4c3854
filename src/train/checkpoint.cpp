#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/safetensors.h"

namespace hlm {

namespace fs = std::filesystem;

namespace {

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::string& path) {
  std::string s = read_text(path);
  try {
    return nlohmann::json::parse(s);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: malformed JSON: {}", path, e.what());
  }
}

std::string step_name(long step) { return fmt::format("step_{:08d}", step); }

}  // namespace

void write_file_atomic(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail("{}: cannot write", tmp);
    if (std::fwrite(contents.data(), 1, contents.size(), f) != contents.size()) {
      std::fclose(f);
      fail("{}: short write", tmp);
    }
    std::fflush(f);
    ::fsync(::fileno(f));
    std::fclose(f);
  }
  fs::rename(tmp, path);
  fsync_path(fs::path(path).parent_path().string());
}

std::string save_checkpoint(const std::string& run_dir, long step, const Model& model, const AdamW* opt,
                            const nlohmann::json& trainer_state) {
  const fs::path ckdir = fs::path(run_dir) / "checkpoints";
  fs::create_directories(ckdir);
  const fs::path final_dir = ckdir / step_name(step);
  const fs::path tmp_dir = ckdir / (step_name(step) + ".tmp");
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  const auto& reg = model.registry();
  Model& m = const_cast<Model&>(model);
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  for (const auto& p : reg.all()) w.add_f32(p.name, p.shape, m.params() + p.offset);
  w.write((tmp_dir / "model.safetensors").string());
  if (opt) {
    SafeTensorsWriter o;
    o.set_metadata("step", std::to_string(opt->steps()));
    auto& mm = const_cast<AdamW*>(opt)->m();
    auto& vv = const_cast<AdamW*>(opt)->v();
    for (const auto& p : reg.all()) {
      o.add_f32("exp_avg." + p.name, p.shape, mm.data() + p.offset);
      o.add_f32("exp_avg_sq." + p.name, p.shape, vv.data() + p.offset);
    }
    o.write((tmp_dir / "optimizer.safetensors").string());
  }
  write_file_atomic((tmp_dir / "config.json").string(), model.config().to_json().dump(2) + "\n");
  write_file_atomic((tmp_dir / "trainer_state.json").string(), trainer_state.dump(2) + "\n");
  fsync_path(tmp_dir.string());
  fs::remove_all(final_dir);
  fs::rename(tmp_dir, final_dir);
  fsync_path(ckdir.string());
  write_file_atomic((fs::path(run_dir) / "latest").string(), step_name(step) + "\n");
  return final_dir.string();
}

void prune_checkpoints(const std::string& run_dir, int keep) {
  if (keep <= 0) return;
  const fs::path ckdir = fs::path(run_dir) / "checkpoints";
  if (!fs::exists(ckdir)) return;
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(ckdir)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < names.size(); ++i) fs::remove_all(ckdir / names[i]);
}

std::string resolve_checkpoint(const std::string& path) {
  fs::path p(path);
  if (!fs::exists(p)) fail("{}: no such checkpoint or run folder", path);
  if (fs::exists(p / "model.safetensors")) return p.string();
  if (fs::exists(p / "latest")) {
    std::string name = read_text((p / "latest").string());
    name.erase(std::remove_if(name.begin(), name.end(), ::isspace), name.end());
    fs::path c = p / "checkpoints" / name;
    if (!fs::exists(c / "model.safetensors")) fail("{}: 'latest' names {} which has no model.safetensors", path, c.string());
    return c.string();
  }
  fail("{}: neither a checkpoint folder (model.safetensors) nor a run folder (latest)", path);
}

ModelConfig load_checkpoint_config(const std::string& ckpt_dir) {
  const std::string path = (fs::path(ckpt_dir) / "config.json").string();
  return ModelConfig::from_json(read_json(path), path);
}

void load_model_params(const std::string& ckpt_dir, Model& model) {
  const std::string path = (fs::path(ckpt_dir) / "model.safetensors").string();
  SafeTensorsFile f = SafeTensorsFile::read(path);
  for (const auto& p : model.registry().all()) {
    const float* src = f.get_f32(p.name, p.shape);
    std::copy(src, src + p.shape.numel(), model.params() + p.offset);
  }
  for (const auto& n : f.names())
    if (model.registry().find(n) < 0) fail("{}: tensor '{}' does not belong to this model config", path, n);
}

void load_optimizer(const std::string& ckpt_dir, AdamW& opt) {
  const std::string path = (fs::path(ckpt_dir) / "optimizer.safetensors").string();
  SafeTensorsFile f = SafeTensorsFile::read(path);
  opt.load_moments(f);
  opt.set_steps(std::stol(f.meta("step")));
}

nlohmann::json load_trainer_state(const std::string& ckpt_dir) {
  return read_json((fs::path(ckpt_dir) / "trainer_state.json").string());
}

}  // namespace hlm
