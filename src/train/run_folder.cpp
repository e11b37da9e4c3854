#include "train/run_folder.h"

#include <algorithm>

#include <fmt/format.h>

namespace hlm::run_folder {

std::string step_name(long step) { return fmt::format("step_{:08d}", step); }

long parse_step_name(const std::string& name) {
  if (name.size() < 6 || name.size() > 24 || name.rfind("step_", 0) != 0) return -1;
  long step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
    if (step > (1L << 50)) return -1;
  }
  return step;
}

std::vector<std::pair<long, Path>> list_checkpoints(const Path& run) {
  std::vector<std::pair<long, Path>> out;
  const Path dir = checkpoints(run);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    const long step = parse_step_name(e.path().filename().string());
    if (step >= 0 && e.is_directory()) out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());  // by step: names stop sorting by step past 8 digits
  return out;
}

}  // namespace hlm::run_folder
