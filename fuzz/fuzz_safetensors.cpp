// libFuzzer target: the safetensors reader (header JSON, offsets, dtypes, shapes) on arbitrary bytes.
#include <cstdint>

#include "core/error.h"
#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    hlm::SafeTensorsFile f = hlm::SafeTensorsFile::parse(reinterpret_cast<const char*>(data), size, "fuzz");
    double sum = 0;
    for (const auto& t : f.tensors()) {
      if (t.dtype == "F32" || t.dtype == "F64") {
        for (float v : t.to_f32()) sum += v;  // every accepted tensor's bytes must be readable
      }
    }
    for (const auto& [k, v] : f.metadata()) sum += static_cast<double>(k.size() + v.size());
    (void)sum;
  } catch (const hlm::Error&) {
  }
  return 0;
}
