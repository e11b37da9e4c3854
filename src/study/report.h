#pragma once
// The study report from findings.json alone (so `reproduce --report-only` can rewrite it from the committed
// JSON): DIR/report.md with the headline table of verdicts, each finding's claim, metric, rule, numbers
// (mean and spread over seeds) and figures, and the SVG figures beside it.
#include <string>

#include <nlohmann/json.hpp>

namespace hlm::study {

// Writes DIR/report.md and the figures; returns the report's path. hlm::Error naming findings.json's field
// when the JSON lacks what the report needs.
std::string write_report(const nlohmann::json& findings, const std::string& dir);

}  // namespace hlm::study
