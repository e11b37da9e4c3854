#include "train/run_json.h"

#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "train/run_folder.h"
#include "train/run_protocol.h"

namespace hlm {

nlohmann::json parse_run_json(const std::string& path) {
  const std::string text = read_text_file(path, "run.json", std::size_t{16} << 20);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number too large
    fail("{}: malformed JSON: {}", path, e.what());
  }
  if (!j.is_object()) fail("{}: expected a JSON object", path);
  for (const char* k : {"data", "tokenizer", "dataset_dir"})
    if (j.contains(k) && !j[k].is_string()) fail("{}: field '{}' must be a string", path, k);
  if (j.contains("train")) {
    const auto& t = j["train"];
    if (!t.is_object()) fail("{}: field 'train' must be an object", path);
    for (const char* k : {"steps", "batch", "seq_len", "grad_accum", "warmup", "niah_digits", "seed", "threads"})
      if (t.contains(k) && !t[k].is_number_integer()) fail("{}: field 'train.{}' must be an integer", path, k);
    for (const char* k : {"lr", "decay_fraction", "weight_decay", "grad_clip", "mix_niah"})
      if (t.contains(k) && !t[k].is_number()) fail("{}: field 'train.{}' must be a number", path, k);
    for (const char* k : {"schedule", "mix_haystack"})
      if (t.contains(k) && !t[k].is_string()) fail("{}: field 'train.{}' must be a string", path, k);
    if (t.contains("niah_digits") && t["niah_digits"].get<long>() < 1)
      fail("{}: field 'train.niah_digits' must be >= 1", path);
  }
  if (j.contains("protocol")) RunProtocol::from_json(j["protocol"], path);
  return j;
}

nlohmann::json read_run_config(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path p(dir);
  for (int up = 0; up < 3 && !p.empty(); ++up) {
    if (fs::exists(run_folder::run_json(p))) return parse_run_json(run_folder::run_json(p).string());
    p = p.parent_path();
  }
  return nlohmann::json::object();
}

int run_niah_digits(const nlohmann::json& run) {
  if (run.contains("train") && run["train"].contains("niah_digits") && run["train"]["niah_digits"].is_number_integer())
    return run["train"]["niah_digits"].get<int>();
  return 7;
}

}  // namespace hlm
