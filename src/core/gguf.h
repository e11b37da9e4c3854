#pragma once
// GGUF reader (llama.cpp's model files, versions 2 and 3, little-endian). Layout: "GGUF", u32 version, u64 tensor
// count, u64 key-value count; the key-value pairs (string key, u32 value type, value); the tensor infos (string
// name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset); padding to `general.alignment` (default 32); the
// data section, each tensor at its offset from the section's start. Strings are u64 length + bytes; arrays are
// u32 element type + u64 count + elements. The reader treats files as untrusted: every count, length, offset and
// size is checked against the file before it is used, and every inconsistency is an hlm::Error naming the file
// and the key or tensor. See docs/reference.md.
//
//   GgufFile f = GgufFile::read("model.gguf");
//   std::string arch = f.get_string("general.architecture");
//   std::int64_t n_layers = f.get_int(arch + ".block_count");
//   const GgufTensor& t = f.tensor("blk.0.attn_q.weight");   // t.dims = {ne0 (row length), ne1 (rows)}
//   std::vector<float> w = dequantize(t);                     // row-major [ne1][ne0], like PyTorch's [out][in]
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ggml_quants.h"
#include "core/tensor.h"

namespace hlm {

// GGUF's metadata value types (numbers as in files).
enum class GgufValueType : std::uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);  // "UINT32", "STRING", ...

// One metadata value. Scalars fill the field of their kind; arrays keep their element type, their count and their
// elements in the field for that element type. Prefer GgufFile's typed getters, which name the key in errors.
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  std::uint64_t uint_value = 0;  // UINT8, UINT16, UINT32, UINT64
  std::int64_t int_value = 0;    // INT8, INT16, INT32, INT64
  double float_value = 0;        // FLOAT32 (exactly widened), FLOAT64
  bool bool_value = false;       // BOOL
  std::string string_value;      // STRING (bytes as stored; GGUF promises UTF-8)

  // ARRAY only.
  GgufValueType elem_type = GgufValueType::UINT8;
  std::uint64_t count = 0;
  std::vector<std::uint8_t> elem_bytes;  // numeric and BOOL elements: count x element size, little-endian
  std::vector<std::string> strings;      // STRING elements
  std::vector<GgufValue> arrays;         // ARRAY elements (nested arrays)

  // "UINT32", or "ARRAY[STRING]" (nested: "ARRAY[ARRAY[INT8]]" from the first element; "ARRAY[ARRAY]" if empty).
  std::string type_name() const;
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

// One tensor of a file. Its bytes live in the GgufFile it came from (valid while that object lives; moving the
// file keeps them valid; null for a zero-size tensor) and have no alignment guarantee beyond the file's (use
// dequantize or memcpy).
struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  // GGUF (ggml) order: dims[0] is the fastest-varying dimension (ne0, the row length), dims[1] the number of rows
  // of a matrix, ... 0 to 4 dims.
  std::vector<std::int64_t> dims;
  std::uint64_t offset = 0;  // from the start of the data section
  const std::uint8_t* data = nullptr;
  std::size_t nbytes = 0;
  std::string file;  // for error messages

  std::int64_t numel() const;
  std::int64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
  std::int64_t n_rows() const;    // product of dims[1..] (1 for 0-d and 1-d tensors)
  std::size_t row_bytes() const;  // bytes of one row (row_length / block_values x block_bytes)
  // The dims reversed, the row-major order of PyTorch and safetensors: {ne1, ne0} for a matrix.
  Shape row_major_shape() const;
  const char* type_name() const { return ggml_type_name(type); }
};

class GgufFile {
 public:
  GgufFile();
  ~GgufFile();
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  // Maps the file read-only (the tensors' bytes are not copied; the file must not shrink while it is mapped).
  static GgufFile read(const std::string& path);
  // Parses an in-memory image (copied); `label` stands in for the file name in error messages.
  static GgufFile parse(const void* bytes, std::size_t n, const std::string& label);

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }  // file offset of the data section

  // Metadata, in file order.
  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  bool has(const std::string& key) const { return key_index_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;  // nullptr when absent
  // The typed getters throw hlm::Error naming the file and the key when the key is missing ("missing key") or
  // holds another type ("key \"k\" is UINT32, expected STRING").
  const GgufValue& value(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  std::int64_t get_int(const std::string& key) const;  // any integer type (a UINT64 must fit)
  double get_float(const std::string& key) const;      // FLOAT32 or FLOAT64
  bool get_bool(const std::string& key) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  std::vector<std::int64_t> get_int_array(const std::string& key) const;  // any integer element type
  std::vector<float> get_float_array(const std::string& key) const;       // FLOAT32 (FLOAT64 rounded)

  // Tensors, in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  bool has_tensor(const std::string& name) const { return tensor_index_.count(name) != 0; }
  // Throws hlm::Error naming the file and the tensor when missing.
  const GgufTensor& tensor(const std::string& name) const;

 private:
  struct Storage;
  void parse_image(const std::uint8_t* bytes, std::size_t n);

  std::string path_;
  std::unique_ptr<Storage> storage_;  // the mapping or the copied image
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::map<std::string, std::size_t> key_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
};

// The tensor's values as fp32, row-major [n_rows][row_length] (dims reversed). hlm::Error naming the file, the
// tensor and the type for a type that cannot be dequantized (ggml_dequantizable_type_names()).
std::vector<float> dequantize(const GgufTensor& t);
// Rows [first_row, first_row + n_rows) only (a row is dims[0] values; for a 3-d or 4-d tensor rows run over all
// higher dims flattened). Range outside the tensor: hlm::Error naming the tensor.
std::vector<float> dequantize_rows(const GgufTensor& t, std::int64_t first_row, std::int64_t n_rows);

}  // namespace hlm
