#include "study/json_file.h"

#include "core/error.h"
#include "core/file_io.h"

namespace hlm::study {

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  // A directory, FIFO or device is refused naming the file (a stream would report it as a parse error).
  const std::string text = read_text_file(path, what.empty() ? "file" : what.substr(what.find_first_not_of(' ')));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number too large
    fail("{}: malformed JSON: {}", path, e.what());
  }
}

}  // namespace hlm::study
