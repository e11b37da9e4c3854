#pragma once
// GGUF images built by hand in tests (the reader's and the import's): little-endian encoders for keys, values and
// tensor infos, and an Image that lays them out with its data section as ggml writes it.
#include <bit>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/gguf.h"

namespace hlm::testing::gguf_image {

using VT = GgufValueType;

inline std::string le(std::uint64_t v, int n) {
  std::string s(static_cast<std::size_t>(n), '\0');
  for (int i = 0; i < n; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}
inline std::string u32(std::uint32_t v) { return le(v, 4); }
inline std::string u64(std::uint64_t v) { return le(v, 8); }
inline std::string f32(float v) { return u32(std::bit_cast<std::uint32_t>(v)); }
inline std::string f64(double v) { return u64(std::bit_cast<std::uint64_t>(v)); }
inline std::string gstr(const std::string& s) { return u64(s.size()) + s; }
inline std::string vtype(VT t) { return u32(static_cast<std::uint32_t>(t)); }
// A key-value pair: key, value type, encoded value.
inline std::string kv(const std::string& key, VT t, const std::string& value) { return gstr(key) + vtype(t) + value; }
// An array value: element type, count, encoded elements.
inline std::string arr(VT elem, std::uint64_t count, const std::string& elems) { return vtype(elem) + u64(count) + elems; }

struct TensorSpec {
  std::string name;
  std::vector<std::uint64_t> dims;
  std::uint32_t type = 0;
  std::uint64_t offset = 0;
  std::string bytes;  // placed at `offset` in the data section
};

// A GGUF image from its parts; counts default to the parts' sizes and the data section is padded to the alignment
// at the end, as ggml writes it.
struct Image {
  std::string magic = "GGUF";
  std::uint32_t version = 3;
  std::vector<std::string> kvs;
  std::vector<TensorSpec> tensors;
  std::uint64_t alignment = 32;  // the padding used (add a general.alignment pair to change the file's)
  std::optional<std::uint64_t> n_tensors, n_kv;

  // Gives each tensor the next aligned offset after the previous one.
  Image& place() {
    std::uint64_t off = 0;
    for (TensorSpec& t : tensors) {
      t.offset = off;
      off = (off + t.bytes.size() + alignment - 1) / alignment * alignment;
    }
    return *this;
  }
  std::string header_and_infos() const {
    std::string s = magic + u32(version) + u64(n_tensors.value_or(tensors.size())) + u64(n_kv.value_or(kvs.size()));
    for (const std::string& k : kvs) s += k;
    for (const TensorSpec& t : tensors) {
      s += gstr(t.name) + u32(static_cast<std::uint32_t>(t.dims.size()));
      for (std::uint64_t d : t.dims) s += u64(d);
      s += u32(t.type) + u64(t.offset);
    }
    return s;
  }
  std::string build() const {
    std::string s = header_and_infos();
    s.append((alignment - s.size() % alignment) % alignment, '\0');
    std::string data;
    for (const TensorSpec& t : tensors) {
      if (t.bytes.empty()) continue;  // lets a test point a tensor anywhere without writing there
      if (data.size() < t.offset + t.bytes.size()) data.resize(t.offset + t.bytes.size(), '\0');
      std::memcpy(data.data() + t.offset, t.bytes.data(), t.bytes.size());
    }
    data.append((alignment - data.size() % alignment) % alignment, '\0');
    return s + data;
  }
};

inline std::string f32_bytes(std::initializer_list<float> v) {
  std::string s;
  for (float x : v) s += f32(x);
  return s;
}

}  // namespace hlm::testing::gguf_image
