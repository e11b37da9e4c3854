// libFuzzer target: the GGUF reader (header, counts, metadata of every value type, tensor infos, layout) and the
// block decoders on arbitrary bytes. Every accepted tensor is dequantized (its bytes must be readable), and every
// key goes through every typed getter (each returns or refuses).
#include <cstdint>

#include "core/error.h"
#include "core/gguf.h"

namespace {
template <typename Fn>
void try_getter(Fn&& fn) {
  try {
    fn();
  } catch (const hlm::Error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const hlm::GgufFile f = hlm::GgufFile::parse(data, size, "fuzz");
    double sum = 0;
    for (const hlm::GgufTensor& t : f.tensors()) {
      if (!hlm::ggml_type_info(t.type).dequantizable) continue;
      for (float v : hlm::dequantize(t)) sum += static_cast<double>(v);
      if (t.n_rows() > 1)
        for (float v : hlm::dequantize_rows(t, 1, t.n_rows() - 1)) sum += static_cast<double>(v);
    }
    for (const hlm::GgufKeyValue& kv : f.metadata()) {
      const std::string& k = kv.key;
      try_getter([&] { sum += static_cast<double>(f.get_string(k).size()); });
      try_getter([&] { sum += static_cast<double>(f.get_int(k)); });
      try_getter([&] { sum += f.get_float(k); });
      try_getter([&] { sum += f.get_bool(k); });
      try_getter([&] { sum += static_cast<double>(f.get_string_array(k).size()); });
      try_getter([&] { sum += static_cast<double>(f.get_int_array(k).size()); });
      try_getter([&] { sum += static_cast<double>(f.get_float_array(k).size()); });
      sum += static_cast<double>(kv.value.type_name().size());
    }
    (void)sum;
  } catch (const hlm::Error&) {
  }
  return 0;
}
