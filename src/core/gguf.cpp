#include "core/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <new>

#include "core/error.h"
#include "core/parallel.h"

namespace hlm {

namespace {

constexpr std::uint64_t kHeaderBytes = 24;         // magic, version, tensor count, key-value count
constexpr std::uint64_t kMinKeyValueBytes = 13;    // key length (8), value type (4), a 1-byte value
constexpr std::uint64_t kMinTensorInfoBytes = 24;  // name length (8), n_dims (4), type (4), offset (8)
constexpr std::uint64_t kMinArrayBytes = 12;       // element type (4), count (8)
constexpr int kMaxArrayNesting = 8;
constexpr std::uint64_t kDefaultAlignment = 32;
constexpr int kMaxGgmlDims = 4;  // ggml's GGML_MAX_DIMS
constexpr std::size_t kImageAlign = 64;

std::string sys_err() { return std::strerror(errno); }

// A name from the file, quoted for a one-line message: control bytes, quotes and backslashes escaped, long names cut.
std::string quoted(const std::string& s) {
  constexpr std::size_t kMaxShown = 120;
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F || c == '"' || c == '\\')
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  out += s.size() > kMaxShown ? "\"..." : "\"";
  return out;
}

// Size in bytes of a fixed-size value type; 0 for STRING and ARRAY, -1 for an unknown type number.
int value_size(std::uint32_t t) {
  switch (static_cast<GgufValueType>(t)) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL:
      return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
      return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32:
      return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64:
      return 8;
    case GgufValueType::STRING:
    case GgufValueType::ARRAY:
      return 0;
  }
  return -1;
}

// The smallest encoding of one array element of type t (a string's length field, an array's type and count).
std::uint64_t min_elem_bytes(std::uint32_t t) {
  const int n = value_size(t);
  if (n > 0) return static_cast<std::uint64_t>(n);
  return static_cast<GgufValueType>(t) == GgufValueType::STRING ? 8 : kMinArrayBytes;
}

bool is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
      return true;
    default:
      return false;
  }
}

bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 ||
         t == GgufValueType::UINT64;
}

template <typename T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Sign- or zero-extends the integer of type t at p (UINT64 values above INT64_MAX are the caller's to refuse).
std::uint64_t load_uint(GgufValueType t, const std::uint8_t* p) {
  switch (t) {
    case GgufValueType::UINT8:
      return p[0];
    case GgufValueType::UINT16:
      return load<std::uint16_t>(p);
    case GgufValueType::UINT32:
      return load<std::uint32_t>(p);
    default:
      return load<std::uint64_t>(p);
  }
}
std::int64_t load_int(GgufValueType t, const std::uint8_t* p) {
  switch (t) {
    case GgufValueType::INT8:
      return static_cast<std::int8_t>(p[0]);
    case GgufValueType::INT16:
      return load<std::int16_t>(p);
    case GgufValueType::INT32:
      return load<std::int32_t>(p);
    default:
      return load<std::int64_t>(p);
  }
}

// Reads the file front to back; every read is checked against the bytes left, and a short read names what it was
// reading (built only on failure).
class Cursor {
 public:
  Cursor(const std::uint8_t* p, std::size_t n, const std::string& file) : p_(p), n_(n), file_(file) {}
  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return n_ - pos_; }
  const std::uint8_t* here() const { return p_ + pos_; }

  template <typename What>
  void need(std::uint64_t k, What&& what) const {
    if (k > left())
      fail("gguf: {}: file ends inside {} (needs {} bytes at offset {}, {} left; truncated?)", file_, what(), k, pos_,
           left());
  }
  template <typename What>
  const std::uint8_t* take(std::uint64_t k, What&& what) {
    need(k, what);
    const std::uint8_t* at = p_ + pos_;
    pos_ += k;
    return at;
  }
  template <typename What>
  std::uint32_t u32(What&& what) {
    return load<std::uint32_t>(take(4, what));
  }
  template <typename What>
  std::uint64_t u64(What&& what) {
    return load<std::uint64_t>(take(8, what));
  }
  // A u64 length and that many bytes; the length is checked against the bytes left before anything is allocated.
  template <typename What>
  std::string string(What&& what) {
    const std::uint64_t len = u64(what);
    if (len > left())
      fail("gguf: {}: {}: string length {} runs past the end of the file ({} bytes left at offset {})", file_, what(),
           len, left(), pos_);
    const std::uint8_t* at = take(len, what);
    return std::string(reinterpret_cast<const char*>(at), len);
  }

 private:
  const std::uint8_t* p_;
  std::uint64_t n_;
  std::uint64_t pos_ = 0;
  const std::string& file_;
};

class MetadataParser {
 public:
  MetadataParser(Cursor& c, const std::string& file) : c_(c), file_(file) {}

  // The value of `key` (of type `type`), arrays nested at most kMaxArrayNesting deep.
  GgufValue value(const std::string& key, std::uint32_t type, int depth) {
    auto where = [&] { return fmt::format("the value of key {}", quoted(key)); };
    const int size = value_size(type);
    if (size < 0) fail("gguf: {}: key {}: unknown value type {}", file_, quoted(key), type);
    GgufValue v;
    v.type = static_cast<GgufValueType>(type);
    if (v.type == GgufValueType::STRING) {
      v.string_value = c_.string(where);
    } else if (v.type == GgufValueType::ARRAY) {
      array(key, v, depth, where);
    } else {
      scalar(key, v, c_.take(static_cast<std::uint64_t>(size), where));
    }
    return v;
  }

 private:
  void scalar(const std::string& key, GgufValue& v, const std::uint8_t* p) {
    switch (v.type) {
      case GgufValueType::FLOAT32:
        v.float_value = load<float>(p);
        break;
      case GgufValueType::FLOAT64:
        v.float_value = load<double>(p);
        break;
      case GgufValueType::BOOL:
        if (p[0] > 1) fail("gguf: {}: key {}: BOOL value {} is neither 0 nor 1", file_, quoted(key), p[0]);
        v.bool_value = p[0] != 0;
        break;
      default:
        if (is_unsigned(v.type))
          v.uint_value = load_uint(v.type, p);
        else
          v.int_value = load_int(v.type, p);
    }
  }

  // `where` describes the array for a short read (a std::function: the recursion must not make a new type per level).
  void array(const std::string& key, GgufValue& v, int depth, const std::function<std::string()>& where) {
    if (depth >= kMaxArrayNesting)
      fail("gguf: {}: key {}: arrays nested deeper than {}", file_, quoted(key), kMaxArrayNesting);
    const std::uint32_t elem = c_.u32(where);
    if (value_size(elem) < 0) fail("gguf: {}: key {}: unknown array element type {}", file_, quoted(key), elem);
    v.elem_type = static_cast<GgufValueType>(elem);
    v.count = c_.u64(where);
    const std::uint64_t min_bytes = min_elem_bytes(elem);
    if (v.count > c_.left() / min_bytes)
      fail(
          "gguf: {}: key {}: array of {} {} elements needs at least {} bytes per element, but only {} bytes are left "
          "(lying length or truncated file)",
          file_, quoted(key), v.count, gguf_value_type_name(v.elem_type), min_bytes, c_.left());
    if (v.elem_type == GgufValueType::STRING) {
      for (std::uint64_t i = 0; i < v.count; ++i)
        v.strings.push_back(c_.string([&] { return fmt::format("element {} of key {}", i, quoted(key)); }));
    } else if (v.elem_type == GgufValueType::ARRAY) {
      for (std::uint64_t i = 0; i < v.count; ++i) {
        GgufValue inner;
        inner.type = GgufValueType::ARRAY;
        array(key, inner, depth + 1, [&] { return fmt::format("element {} of key {}", i, quoted(key)); });
        v.arrays.push_back(std::move(inner));
      }
    } else {
      const std::uint64_t n = v.count * min_bytes;  // no overflow: count <= left / min_bytes
      const std::uint8_t* p = c_.take(n, where);
      if (v.elem_type == GgufValueType::BOOL)
        for (std::uint64_t i = 0; i < n; ++i)
          if (p[i] > 1)
            fail("gguf: {}: key {}: element {} of the BOOL array is {}, neither 0 nor 1", file_, quoted(key), i, p[i]);
      v.elem_bytes.assign(p, p + n);
    }
  }

  Cursor& c_;
  const std::string& file_;
};

bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

std::uint64_t round_up(std::uint64_t x, std::uint64_t align) { return (x + align - 1) / align * align; }

}  // namespace

const char* gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
      return "UINT8";
    case GgufValueType::INT8:
      return "INT8";
    case GgufValueType::UINT16:
      return "UINT16";
    case GgufValueType::INT16:
      return "INT16";
    case GgufValueType::UINT32:
      return "UINT32";
    case GgufValueType::INT32:
      return "INT32";
    case GgufValueType::FLOAT32:
      return "FLOAT32";
    case GgufValueType::BOOL:
      return "BOOL";
    case GgufValueType::STRING:
      return "STRING";
    case GgufValueType::ARRAY:
      return "ARRAY";
    case GgufValueType::UINT64:
      return "UINT64";
    case GgufValueType::INT64:
      return "INT64";
    case GgufValueType::FLOAT64:
      return "FLOAT64";
  }
  return "UNKNOWN";
}

std::string GgufValue::type_name() const {
  if (type != GgufValueType::ARRAY) return gguf_value_type_name(type);
  if (elem_type != GgufValueType::ARRAY) return fmt::format("ARRAY[{}]", gguf_value_type_name(elem_type));
  return arrays.empty() ? "ARRAY[ARRAY]" : fmt::format("ARRAY[{}]", arrays.front().type_name());
}

// ---------------------------------------------------------------------------------------------
// GgufTensor

std::int64_t GgufTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;  // checked not to overflow when the file was read
  return n;
}

std::int64_t GgufTensor::n_rows() const {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < dims.size(); ++i) n *= dims[i];
  return n;
}

std::size_t GgufTensor::row_bytes() const {
  const GgmlTypeInfo& info = ggml_type_info(type);
  return static_cast<std::size_t>(row_length() / info.block_values * info.block_bytes);
}

Shape GgufTensor::row_major_shape() const {
  Shape s;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) s.dims[s.ndim++] = *it;
  return s;
}

// ---------------------------------------------------------------------------------------------
// GgufFile

// The bytes the tensors point into: a read-only mapping of the file, or an aligned copy of an in-memory image.
struct GgufFile::Storage {
  void* base = nullptr;
  std::size_t size = 0;
  bool mapped = false;
  ~Storage() {
    if (mapped)
      ::munmap(base, size);
    else if (base)
      ::operator delete[](base, std::align_val_t(kImageAlign));
  }
};

GgufFile::GgufFile() = default;
GgufFile::~GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;

GgufFile GgufFile::read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("gguf: {}: cannot open ({})", path, sys_err());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("gguf: {}: cannot stat ({})", path, sys_err());
  if (!S_ISREG(st.st_mode)) fail("gguf: {}: not a regular file", path);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < kHeaderBytes)
    fail("gguf: {}: file is {} bytes, shorter than the {}-byte header (magic, version, tensor and key counts)", path,
         size, kHeaderBytes);
  GgufFile f;
  f.path_ = path;
  f.storage_ = std::make_unique<Storage>();
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) fail("gguf: {}: cannot map {} bytes ({})", path, size, sys_err());
  f.storage_->base = p;
  f.storage_->size = size;
  f.storage_->mapped = true;
  f.parse_image(static_cast<const std::uint8_t*>(p), size);
  return f;
}

GgufFile GgufFile::parse(const void* bytes, std::size_t n, const std::string& label) {
  GgufFile f;
  f.path_ = label;
  f.storage_ = std::make_unique<Storage>();
  f.storage_->base = ::operator new[](std::max<std::size_t>(n, 1), std::align_val_t(kImageAlign));
  f.storage_->size = n;
  if (n) std::memcpy(f.storage_->base, bytes, n);
  f.parse_image(static_cast<const std::uint8_t*>(f.storage_->base), n);
  return f;
}

void GgufFile::parse_image(const std::uint8_t* bytes, std::size_t n) {
  const std::string& file = path_;
  if (n < kHeaderBytes)
    fail("gguf: {}: file is {} bytes, shorter than the {}-byte header (magic, version, tensor and key counts)", file, n,
         kHeaderBytes);
  Cursor c(bytes, n, file);
  auto header = [] { return std::string("the header"); };
  const std::uint8_t* magic = c.take(4, header);
  if (std::memcmp(magic, "GGUF", 4) != 0)
    fail("gguf: {}: not a GGUF file (magic bytes {:02x} {:02x} {:02x} {:02x}, expected \"GGUF\" = 47 47 55 46)", file,
         magic[0], magic[1], magic[2], magic[3]);
  version_ = c.u32(header);
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xFFFFu) == 0 && version_ != 0)
      fail("gguf: {}: GGUF version field reads {:#x}: a big-endian file? Only little-endian GGUF is supported", file,
           version_);
    fail("gguf: {}: GGUF version {} is not supported (only versions 2 and 3)", file, version_);
  }
  const std::uint64_t n_tensors = c.u64(header);
  const std::uint64_t n_kv = c.u64(header);
  // Each key-value pair and tensor info takes a minimum number of bytes: a count that the rest of the file cannot
  // hold is refused here. Nothing is reserved from a count (an entry in memory is larger than its smallest
  // encoding): memory grows with what is actually parsed.
  if (n_kv > c.left() / kMinKeyValueBytes || n_tensors > c.left() / kMinTensorInfoBytes ||
      n_kv * kMinKeyValueBytes + n_tensors * kMinTensorInfoBytes > c.left())
    fail(
        "gguf: {}: tensor count {} and key-value count {} need at least {} and {} bytes each, but only {} bytes "
        "follow the header (lying counts or truncated file)",
        file, n_tensors, n_kv, kMinTensorInfoBytes, kMinKeyValueBytes, c.left());

  MetadataParser meta(c, file);
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string([&] { return fmt::format("the key of key-value pair {}", i); });
    if (key_index_.count(key)) fail("gguf: {}: duplicate key {}", file, quoted(key));
    const std::uint32_t type = c.u32([&] { return fmt::format("the value type of key {}", quoted(key)); });
    GgufValue v = meta.value(key, type, 0);
    key_index_.emplace(key, metadata_.size());
    metadata_.push_back({std::move(key), std::move(v)});
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufValueType::UINT32)
      fail("gguf: {}: key \"general.alignment\" is {}, expected UINT32", file, a->type_name());
    if (a->uint_value == 0 || (a->uint_value & (a->uint_value - 1)) != 0)
      fail("gguf: {}: key \"general.alignment\" is {}, not a power of two", file, a->uint_value);
    alignment_ = a->uint_value;
  } else {
    alignment_ = kDefaultAlignment;
  }

  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.file = file;
    t.name = c.string([&] { return fmt::format("the name of tensor {}", i); });
    if (tensor_index_.count(t.name)) fail("gguf: {}: duplicate tensor name {}", file, quoted(t.name));
    const std::string name = quoted(t.name);
    auto info = [&] { return fmt::format("the info of tensor {}", name); };
    const std::uint32_t n_dims = c.u32(info);
    if (n_dims > static_cast<std::uint32_t>(kMaxGgmlDims))
      fail("gguf: {}: tensor {}: n_dims {} exceeds ggml's {}", file, name, n_dims, kMaxGgmlDims);
    std::uint64_t rows = 1, bounded = 1;  // bounded: the product of the dims with zeros counted as 1
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t x = c.u64(info);
      if (x > static_cast<std::uint64_t>(INT64_MAX) || !mul_ok(bounded, std::max<std::uint64_t>(x, 1), &bounded) ||
          bounded > static_cast<std::uint64_t>(INT64_MAX))
        fail("gguf: {}: tensor {}: dims overflow (dim {} is {})", file, name, d, x);
      t.dims.push_back(static_cast<std::int64_t>(x));
      if (d > 0) rows *= x;
    }
    const std::uint32_t type = c.u32(info);
    const GgmlTypeInfo* ti = ggml_type_info(type);
    if (!ti) fail("gguf: {}: tensor {}: unknown ggml type {}", file, name, type);
    t.type = ti->type;
    const auto row = static_cast<std::uint64_t>(t.row_length());
    if (row % static_cast<std::uint64_t>(ti->block_values) != 0)
      fail("gguf: {}: tensor {}: row length {} (dims[0]) is not a multiple of the {} block size {}", file, name, row,
           ti->name, ti->block_values);
    std::uint64_t nbytes = 0;
    if (!mul_ok(row / static_cast<std::uint64_t>(ti->block_values), static_cast<std::uint64_t>(ti->block_bytes),
                &nbytes) ||
        !mul_ok(nbytes, rows, &nbytes) || nbytes > n)
      fail("gguf: {}: tensor {}: {} x {} {} values need more bytes than the {}-byte file holds", file, name, row, rows,
           ti->name, n);
    t.nbytes = static_cast<std::size_t>(nbytes);
    t.offset = c.u64(info);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (the padding may be missing when nothing
  // follows).
  data_offset_ = round_up(c.pos(), alignment_);
  const std::uint64_t data_bytes = data_offset_ <= n ? n - data_offset_ : 0;

  // Tensors sit in the data section, each at a multiple of the alignment, without overlap; in offset order each
  // starts where the previous one ends, padded to the alignment (the layout ggml writes and llama.cpp requires).
  std::vector<std::size_t> order(tensors_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (const GgufTensor& t : tensors_) {
    if (t.offset % alignment_ != 0)
      fail("gguf: {}: tensor {}: offset {} is not a multiple of the alignment {}", file, quoted(t.name), t.offset,
           alignment_);
    if (t.offset > data_bytes || t.nbytes > data_bytes - t.offset)
      fail(
          "gguf: {}: tensor {}: bytes [{}, {}) run past the end of the {}-byte data section (file offset {}; "
          "truncated?)",
          file, quoted(t.name), t.offset, t.offset + t.nbytes, data_bytes, data_offset_);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const GgufTensor &x = tensors_[a], &y = tensors_[b];
    return x.offset != y.offset ? x.offset < y.offset : x.nbytes < y.nbytes;
  });
  std::uint64_t end = 0, padded_end = 0;
  const GgufTensor* prev = nullptr;
  for (std::size_t i : order) {
    const GgufTensor& t = tensors_[i];
    if (t.offset < end)
      fail("gguf: {}: tensor {}: bytes [{}, {}) overlap tensor {} (bytes [{}, {}))", file, quoted(t.name), t.offset,
           t.offset + t.nbytes, quoted(prev->name), prev->offset, end);
    if (t.offset > padded_end)
      fail("gguf: {}: tensor {}: offset {} leaves a gap of {} bytes after {} (expected offset {})", file,
           quoted(t.name), t.offset, t.offset - padded_end, prev ? "tensor " + quoted(prev->name) : "the data start",
           padded_end);
    end = t.offset + t.nbytes;
    padded_end = round_up(end, alignment_);
    prev = &t;
  }
  if (data_bytes > padded_end)
    fail("gguf: {}: {} bytes of trailing data after {} (data section of {} bytes, tensors end at {})", file,
         data_bytes - padded_end, prev ? "the last tensor " + quoted(prev->name) : "the header", data_bytes,
         padded_end);
  for (GgufTensor& t : tensors_) t.data = t.nbytes ? bytes + data_offset_ + t.offset : nullptr;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail("gguf: {}: missing key {}", path_, quoted(key));
  return *v;
}

namespace {
[[noreturn]] void wrong_type(const std::string& file, const std::string& key, const GgufValue& v, const char* want) {
  fail("gguf: {}: key {} is {}, expected {}", file, quoted(key), v.type_name(), want);
}
}  // namespace

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::STRING) wrong_type(path_, key, v, "STRING");
  return v.string_value;
}

std::int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!is_integer(v.type)) wrong_type(path_, key, v, "an integer");
  if (!is_unsigned(v.type)) return v.int_value;
  if (v.uint_value > static_cast<std::uint64_t>(INT64_MAX))
    fail("gguf: {}: key {}: UINT64 value {} does not fit in int64", path_, quoted(key), v.uint_value);
  return static_cast<std::int64_t>(v.uint_value);
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::FLOAT32 && v.type != GgufValueType::FLOAT64)
    wrong_type(path_, key, v, "FLOAT32 or FLOAT64");
  return v.float_value;
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::BOOL) wrong_type(path_, key, v, "BOOL");
  return v.bool_value;
}

const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY || v.elem_type != GgufValueType::STRING)
    wrong_type(path_, key, v, "ARRAY[STRING]");
  return v.strings;
}

std::vector<std::int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::ARRAY || !is_integer(v.elem_type)) wrong_type(path_, key, v, "an ARRAY of integers");
  const auto size = static_cast<std::size_t>(value_size(static_cast<std::uint32_t>(v.elem_type)));
  std::vector<std::int64_t> out(v.count);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::uint8_t* p = v.elem_bytes.data() + i * size;
    if (!is_unsigned(v.elem_type)) {
      out[i] = load_int(v.elem_type, p);
      continue;
    }
    const std::uint64_t u = load_uint(v.elem_type, p);
    if (u > static_cast<std::uint64_t>(INT64_MAX))
      fail("gguf: {}: key {}: element {} ({}) does not fit in int64", path_, quoted(key), i, u);
    out[i] = static_cast<std::int64_t>(u);
  }
  return out;
}

std::vector<float> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = value(key);
  const bool f32 = v.elem_type == GgufValueType::FLOAT32;
  if (v.type != GgufValueType::ARRAY || (!f32 && v.elem_type != GgufValueType::FLOAT64))
    wrong_type(path_, key, v, "ARRAY[FLOAT32] or ARRAY[FLOAT64]");
  std::vector<float> out(v.count);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] =
        f32 ? load<float>(v.elem_bytes.data() + 4 * i) : static_cast<float>(load<double>(v.elem_bytes.data() + 8 * i));
  return out;
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) fail("gguf: {}: no tensor named {}", path_, quoted(name));
  return tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
// Dequantization

std::vector<float> dequantize(const GgufTensor& t) { return dequantize_rows(t, 0, t.n_rows()); }

std::vector<float> dequantize_rows(const GgufTensor& t, std::int64_t first_row, std::int64_t n_rows) {
  const GgmlTypeInfo& info = ggml_type_info(t.type);
  if (!info.dequantizable)
    fail("gguf: {}: tensor {}: type {} cannot be dequantized (supported: {})", t.file, quoted(t.name), info.name,
         ggml_dequantizable_type_names());
  const std::int64_t rows = t.n_rows();
  if (first_row < 0 || n_rows < 0 || first_row > rows || n_rows > rows - first_row)
    fail("gguf: {}: tensor {}: rows [{}, {}) outside its {} rows", t.file, quoted(t.name), first_row,
         first_row + n_rows, rows);
  const std::int64_t row = t.row_length();
  const std::size_t row_bytes = t.row_bytes();
  std::vector<float> out(static_cast<std::size_t>(n_rows * row));
  if (out.empty()) return out;
  const std::uint8_t* src = t.data + static_cast<std::size_t>(first_row) * row_bytes;
  // Rows decode independently; a static split keeps the result the same for any thread count.
  parallel_for(
      n_rows,
      [&](std::int64_t b, std::int64_t e) {
        ggml_dequantize(t.type, src + static_cast<std::size_t>(b) * row_bytes, (e - b) * row, out.data() + b * row);
      },
      std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(row, 1)));
  return out;
}

}  // namespace hlm
