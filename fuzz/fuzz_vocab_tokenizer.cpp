// libFuzzer target: a GGUF vocabulary dump (.gguf.json) given to load_tokenizer; an accepted tokenizer encodes a
// text with spaces, newlines, special tokens and bytes it may lack, to ids inside its vocabulary, and decodes them.
#include <cstdint>

#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hlm::fuzz::write_input(data, size, "vocab.gguf.json");
  try {
    auto tok = hlm::data::load_tokenizer(path);
    const auto ids = tok->encode("The quick  brown\n\nfox <bos>caf\xc3\xa9 \xe4\xb8\xad 42 \xf0\x9f\x98\x80\t<0x41>");
    for (auto id : ids)
      if (id < 0 || id >= tok->vocab_size()) std::abort();
    (void)tok->decode(ids);
  } catch (const hlm::Error&) {
  }
  return 0;
}
