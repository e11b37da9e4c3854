#pragma once
// metrics.jsonl as the trainer writes it: one JSON object per line, each with its integer "step", appended in
// step order. A resumed run continues from a checkpoint, so the rows a stopped process wrote after that checkpoint
// (the steps it is about to run again) are removed first: the resumed file equals the file of a run that never
// stopped, row for row.
#include <string>

namespace hlm {

// Keeps the rows of `path` whose step is <= `step` and drops the rest, with a last line cut short by a kill
// (no newline, not JSON); rewritten atomically, and only when something is dropped. A missing file is left
// missing. A malformed row before the end is an hlm::Error naming the file and line.
void keep_metrics_through(const std::string& path, long step);

}  // namespace hlm
