#include "train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "train/run_folder.h"

namespace hlm {

namespace fs = std::filesystem;

using run_folder::parse_step_name;
using run_folder::step_name;

std::string save_checkpoint(const std::string& run_dir, long step, const Model& model, const AdamW* opt,
                            const nlohmann::json& trainer_state) {
  const fs::path ckdir = run_folder::checkpoints(run_dir);
  fs::create_directories(ckdir);
  const fs::path final_dir = ckdir / step_name(step);
  const fs::path tmp_dir = ckdir / (step_name(step) + ".tmp");
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  const auto& reg = model.registry();
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  for (const auto& p : reg.all()) w.add_f32(p.name, p.shape, model.params() + p.offset);
  w.write(run_folder::model_weights(tmp_dir).string());
  if (opt) {
    SafeTensorsWriter o;
    o.set_metadata("step", std::to_string(opt->steps()));
    const auto& mm = opt->m();
    const auto& vv = opt->v();
    for (const auto& p : reg.all()) {
      o.add_f32("exp_avg." + p.name, p.shape, mm.data() + p.offset);
      o.add_f32("exp_avg_sq." + p.name, p.shape, vv.data() + p.offset);
    }
    o.write(run_folder::optimizer_state(tmp_dir).string());
  }
  write_file_atomic(run_folder::model_config(tmp_dir).string(), model.config().to_json().dump(2) + "\n");
  write_file_atomic(run_folder::trainer_state(tmp_dir).string(), trainer_state.dump(2) + "\n");
  fsync_dir(tmp_dir.string());
  // Every file is written and synced: only now does the folder take its final name. A folder of the same step
  // (a resumed run that saves its last step again) is moved aside first and removed once the new one is in place.
  const fs::path old_dir = ckdir / (step_name(step) + ".old");
  fs::remove_all(old_dir);
  if (fs::exists(final_dir)) fs::rename(final_dir, old_dir);
  fs::rename(tmp_dir, final_dir);
  fsync_dir(ckdir.string());
  write_file_atomic(run_folder::latest(run_dir).string(), step_name(step) + "\n");
  fs::remove_all(old_dir);
  return final_dir.string();
}

void prune_checkpoints(const std::string& run_dir, int keep) {
  const fs::path ckdir = run_folder::checkpoints(run_dir);
  if (!fs::exists(ckdir)) return;
  // The newest by step number (names stop sorting by step past 8 digits), and never the one `latest` names,
  // whatever its number; folders of unfinished writes (.tmp, .old) are left-overs of a killed run.
  const std::string latest = latest_checkpoint_name(run_dir);
  std::vector<std::pair<long, std::string>> steps;
  for (auto& e : fs::directory_iterator(ckdir)) {
    if (!e.is_directory()) continue;
    const std::string n = e.path().filename().string();
    const long st = parse_step_name(n);
    if (st >= 0) steps.emplace_back(st, n);
    else if (n.rfind("step_", 0) == 0 && (n.ends_with(".tmp") || n.ends_with(".old")) && !latest.empty())
      fs::remove_all(e.path());
  }
  if (keep <= 0) return;
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  int kept = 0;
  for (const auto& [st, n] : steps) {
    if (n == latest) continue;
    if (kept + (latest.empty() ? 0 : 1) < keep) {
      ++kept;
      continue;
    }
    fs::remove_all(ckdir / n);
  }
}

void load_model_params(const std::string& ckpt_dir, Model& model) {
  const std::string path = (fs::path(ckpt_dir) / "model.safetensors").string();
  SafeTensorsFile f = SafeTensorsFile::read(path);
  for (const auto& p : model.registry().all()) {
    const float* src = f.get_f32(p.name, p.shape);
    const i64 n = p.shape.numel();
    for (i64 i = 0; i < n; ++i)
      if (!std::isfinite(src[i]))
        fail("{}: tensor '{}' holds a non-finite value ({}) at index {}; the checkpoint is unusable", path, p.name,
             src[i], i);
    std::copy(src, src + n, model.params() + p.offset);
  }
  for (const auto& n : f.names())
    if (model.registry().find(n) < 0) fail("{}: tensor '{}' does not belong to this model config", path, n);
}

void load_optimizer(const std::string& ckpt_dir, AdamW& opt) {
  const std::string path = (fs::path(ckpt_dir) / "optimizer.safetensors").string();
  SafeTensorsFile f = SafeTensorsFile::read(path);
  opt.load_moments(f);
  const std::string step = f.meta("step");
  long n = -1;
  const auto [end, ec] = std::from_chars(step.data(), step.data() + step.size(), n);
  if (ec != std::errc() || end != step.data() + step.size() || n < 0)
    fail("{}: metadata \"step\" is '{}', expected a non-negative integer", path, step);
  opt.set_steps(n);
}

}  // namespace hlm
