// libFuzzer target: token shard files (header fields against the file size, every token against the vocab).
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "data/shard.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hlm::fuzz::write_input(data, size, "shard.tok");
  try {
    hlm::data::TokenShard s(path);
    const std::int64_t n = s.n_tokens();
    std::vector<std::int32_t> out(static_cast<size_t>(std::min<std::int64_t>(n, 64)));
    if (!out.empty()) s.read(n - static_cast<std::int64_t>(out.size()), static_cast<std::int64_t>(out.size()), out.data());
    for (std::int32_t t : out)
      if (t < 0 || t >= s.vocab_size()) std::abort();  // an accepted shard holds only ids < vocab_size
  } catch (const hlm::Error&) {
  }
  return 0;
}
