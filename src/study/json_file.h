#pragma once
// Reading a JSON file that a person or a child process wrote, with errors that name the file.
#include <string>

#include <nlohmann/json.hpp>

namespace hlm::study {

// hlm::Error "<path>: cannot open<what>" or "<path>: malformed JSON: ..." (what: e.g. " the plan file").
nlohmann::json read_json_file(const std::string& path, const std::string& what = "");

}  // namespace hlm::study
