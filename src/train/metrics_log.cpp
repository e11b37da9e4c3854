#include "train/metrics_log.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"

namespace hlm {

void keep_metrics_through(const std::string& path, long step) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  const std::string text = read_text_file(path, "metrics file", std::size_t{4} << 30);
  std::string kept;
  kept.reserve(text.size());
  bool dropped = false;
  std::size_t line_no = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    ++line_no;
    const std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) {  // a row cut short by a kill: its step is not done
      dropped = true;
      break;
    }
    const std::string_view line(text.data() + pos, end - pos);
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object() || !row.contains("step") || !row["step"].is_number_integer())
      fail("{}: line {} is not a metrics row (a JSON object with an integer 'step')", path, line_no);
    if (row["step"].get<long>() <= step) kept.append(line).push_back('\n');
    else dropped = true;
    pos = end + 1;
  }
  if (dropped) write_file_atomic(path, kept);
}

}  // namespace hlm
