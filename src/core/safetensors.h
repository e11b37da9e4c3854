#pragma once
// safetensors reader and writer (checkpoints, golden reference files, tests). Format: u64 LE header
// length N, N bytes of UTF-8 JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {str: str}}, then the data buffer (offsets relative to its start, end exclusive,
// buffer exactly covered). The reader treats files as untrusted: every inconsistency is an hlm::Error
// naming the file and the field. See docs/reference.md.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace hlm {

// One tensor of a file. Data is little-endian row-major, aligned to its element size, and owned by
// the SafeTensorsFile it came from (valid while that object lives; moving the file keeps it valid).
struct SafeTensor {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "I32", "F64", "I64", "U8", ...
  Shape shape;
  const char* data = nullptr;
  std::size_t nbytes = 0;
  std::string file;  // for error messages

  hlm::i64 numel() const { return shape.numel(); }  // qualified: i64() below is a member
  // Typed access; throws hlm::Error naming file and tensor when the dtype differs.
  const float* f32() const;
  const double* f64() const;
  const std::int32_t* i32() const;
  const std::int64_t* i64() const;
  const std::uint8_t* u8() const;
  // Copies converted to float / double (from F32 or F64; integer dtypes are rejected).
  std::vector<float> to_f32() const;
  std::vector<double> to_f64() const;
  // Throws hlm::Error naming file, tensor and both shapes when the shape differs.
  void expect_shape(const Shape& want) const;
};

class SafeTensorsFile {
 public:
  SafeTensorsFile() = default;
  SafeTensorsFile(SafeTensorsFile&&) noexcept = default;
  SafeTensorsFile& operator=(SafeTensorsFile&&) noexcept = default;
  SafeTensorsFile(const SafeTensorsFile&) = delete;
  SafeTensorsFile& operator=(const SafeTensorsFile&) = delete;

  static SafeTensorsFile read(const std::string& path);
  // Parses an in-memory image; `label` stands in for the file name in error messages.
  static SafeTensorsFile parse(const char* bytes, std::size_t n, const std::string& label);

  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws hlm::Error naming the file and the tensor when missing.
  const SafeTensor& get(const std::string& name) const;
  // get() plus dtype "F32" and shape checks; returns the data.
  const float* get_f32(const std::string& name, const Shape& shape) const;
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  const std::vector<SafeTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Metadata value; throws hlm::Error naming file and key when absent.
  const std::string& meta(const std::string& key) const;
  const std::string& path() const { return path_; }

 private:
  struct AlignedFree {
    void operator()(char* p) const;
  };
  using Buffer = std::unique_ptr<char[], AlignedFree>;
  static Buffer alloc(std::size_t n);
  // Parses the header and binds tensors to `data` (n_data bytes, already read).
  void bind(const std::string& header, Buffer data, std::size_t n_data);

  std::string path_;
  std::vector<SafeTensor> tensors_;  // sorted by name
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::vector<Buffer> buffers_;  // the data section, plus copies of any misaligned tensors
};

class SafeTensorsWriter {
 public:
  // add_* copy the data. Names must be unique and non-empty ("__metadata__" is reserved).
  void add_f32(const std::string& name, const Shape& shape, const float* data);
  void add_f64(const std::string& name, const Shape& shape, const double* data);
  void add_i32(const std::string& name, const Shape& shape, const std::int32_t* data);
  void add_i64(const std::string& name, const Shape& shape, const std::int64_t* data);
  void add_u8(const std::string& name, const Shape& shape, const std::uint8_t* data);
  void set_metadata(const std::string& key, const std::string& value);
  std::size_t size() const { return tensors_.size(); }

  // The complete file image. Layout: tensors ordered by descending element size, then name, so every
  // tensor stays aligned to its element size; header padded with spaces to a multiple of 8.
  std::vector<char> serialize() const;
  // Atomic: writes "<path>.tmp", fsyncs it, renames over `path`, fsyncs the directory.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string dtype;
    Shape shape;
    std::vector<char> bytes;
  };
  void add(const std::string& name, const char* dtype, const Shape& shape, const void* data,
           std::size_t elem_size);
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace hlm
