#include "study/json_file.h"

#include <fstream>

#include "core/error.h"

namespace hlm::study {

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream f(path);
  if (!f) fail("{}: cannot open{}", path, what);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number too large
    fail("{}: malformed JSON: {}", path, e.what());
  }
}

}  // namespace hlm::study
