// libFuzzer target: the tokenizer loader on an arbitrary .model file; an accepted tokenizer encodes and decodes.
#include <cstdint>

#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hlm::fuzz::write_input(data, size, "tok.model");
  try {
    auto tok = hlm::data::load_tokenizer(path);
    const auto ids = tok->encode("The quick brown fox, 42.\n");
    for (auto id : ids)
      if (id < 0 || id >= tok->vocab_size()) std::abort();
    (void)tok->decode(ids);
  } catch (const hlm::Error&) {
  }
  return 0;
}
