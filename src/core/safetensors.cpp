#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace hlm {

namespace {

using json = nlohmann::json;

constexpr std::uint64_t kMaxHeader = 100'000'000;  // the reference implementation's limit
constexpr int kMaxJsonDepth = 8;                    // real headers nest 3 deep
constexpr std::size_t kAlign = 64;

// Element size in bytes of every safetensors dtype we can address bytewise; 0 = known but
// sub-byte (F4/F6: unsupported), -1 = unknown.
int dtype_size(const std::string& d) {
  static const std::map<std::string, int> sizes = {
      {"BOOL", 1},        {"U8", 1},          {"I8", 1},      {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"F8_E8M0", 1},     {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1},
      {"I16", 2},         {"U16", 2},         {"F16", 2},     {"BF16", 2},    {"I32", 4},
      {"U32", 4},         {"F32", 4},         {"I64", 8},     {"U64", 8},     {"F64", 8},
      {"C64", 8},         {"F4", 0},          {"F6_E2M3", 0}, {"F6_E3M2", 0}};
  auto it = sizes.find(d);
  return it == sizes.end() ? -1 : it->second;
}

std::string sys_err() { return std::strerror(errno); }

std::uint64_t read_u64_le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void check_lengths(const std::string& file, std::uint64_t size, std::uint64_t n_header) {
  if (n_header > kMaxHeader)
    fail("safetensors: {}: header length {} exceeds the 100 MB limit (corrupt file?)", file, n_header);
  if (n_header > size - 8)
    fail("safetensors: {}: header length {} runs past the end of the file ({} bytes; truncated?)", file,
         n_header, size);
}

// Parses the JSON header, rejecting duplicate keys at any level (nlohmann would silently keep the
// last one) and absurd nesting.
json parse_header_json(const std::string& file, const std::string& header) {
  // nlohmann stops at a NUL as if the input ended, which would accept "{...}\0garbage"; valid JSON
  // never contains a raw NUL.
  if (const auto nul = header.find('\0'); nul != std::string::npos)
    fail("safetensors: {}: header is not valid JSON (NUL byte at offset {})", file, nul);
  std::vector<std::set<std::string>> keys;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) fail("safetensors: {}: header JSON nested deeper than {}", file, kMaxJsonDepth);
        if (ev == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second) {
          if (depth == 1) fail("safetensors: {}: duplicate tensor name \"{}\" in header", file, parsed.get<std::string>());
          fail("safetensors: {}: duplicate key \"{}\" in header", file, parsed.get<std::string>());
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(header, cb);
  } catch (const json::exception& e) {
    fail("safetensors: {}: header is not valid JSON ({})", file, e.what());
  }
}

bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafeTensor

namespace {
template <typename T>
const T* typed(const SafeTensor& t, const char* want) {
  if (t.dtype != want) fail("safetensors: {}: tensor \"{}\" has dtype {}, expected {}", t.file, t.name, t.dtype, want);
  return reinterpret_cast<const T*>(t.data);
}
}  // namespace

const float* SafeTensor::f32() const { return typed<float>(*this, "F32"); }
const double* SafeTensor::f64() const { return typed<double>(*this, "F64"); }
const std::int32_t* SafeTensor::i32() const { return typed<std::int32_t>(*this, "I32"); }
const std::int64_t* SafeTensor::i64() const { return typed<std::int64_t>(*this, "I64"); }
const std::uint8_t* SafeTensor::u8() const { return typed<std::uint8_t>(*this, "U8"); }

std::vector<float> SafeTensor::to_f32() const {
  if (dtype == "F32") return {f32(), f32() + numel()};
  if (dtype == "F64") return {f64(), f64() + numel()};
  fail("safetensors: {}: tensor \"{}\" has dtype {}, expected F32 or F64", file, name, dtype);
}

std::vector<double> SafeTensor::to_f64() const {
  if (dtype == "F32") return {f32(), f32() + numel()};
  if (dtype == "F64") return {f64(), f64() + numel()};
  fail("safetensors: {}: tensor \"{}\" has dtype {}, expected F32 or F64", file, name, dtype);
}

void SafeTensor::expect_shape(const Shape& want) const {
  if (!(shape == want))
    fail("safetensors: {}: tensor \"{}\" has shape {}, expected {}", file, name, shape.str(), want.str());
}

// ---------------------------------------------------------------------------------------------
// SafeTensorsFile

void SafeTensorsFile::AlignedFree::operator()(char* p) const { ::operator delete[](p, std::align_val_t(kAlign)); }

SafeTensorsFile::Buffer SafeTensorsFile::alloc(std::size_t n) {
  return Buffer(static_cast<char*>(::operator new[](std::max<std::size_t>(n, 1), std::align_val_t(kAlign))));
}

SafeTensorsFile SafeTensorsFile::read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("safetensors: {}: cannot open ({})", path, sys_err());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("safetensors: {}: cannot stat ({})", path, sys_err());
  if (!S_ISREG(st.st_mode)) fail("safetensors: {}: not a regular file", path);
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);

  // Reads exactly n bytes at offset off.
  auto read_at = [&](char* dst, std::size_t n, std::uint64_t off, const char* what) {
    std::size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd, dst + got, n - got, static_cast<off_t>(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("safetensors: {}: read error in the {} ({})", path, what, sys_err());
      if (r == 0) fail("safetensors: {}: file ended inside the {} (changed while reading?)", path, what);
      got += static_cast<std::size_t>(r);
    }
  };

  if (size < 8) fail("safetensors: {}: file is {} bytes, shorter than the 8-byte header length", path, size);
  unsigned char len[8];
  read_at(reinterpret_cast<char*>(len), 8, 0, "header length");
  const std::uint64_t n_header = read_u64_le(len);
  check_lengths(path, size, n_header);
  std::string header(n_header, '\0');
  read_at(header.data(), n_header, 8, "header");
  const std::size_t n_data = size - 8 - n_header;
  Buffer data = alloc(n_data);
  read_at(data.get(), n_data, 8 + n_header, "data section");

  SafeTensorsFile f;
  f.path_ = path;
  f.bind(header, std::move(data), n_data);
  return f;
}

SafeTensorsFile SafeTensorsFile::parse(const char* bytes, std::size_t n, const std::string& label) {
  if (n < 8) fail("safetensors: {}: file is {} bytes, shorter than the 8-byte header length", label, n);
  const std::uint64_t n_header = read_u64_le(reinterpret_cast<const unsigned char*>(bytes));
  check_lengths(label, n, n_header);
  std::string header(bytes + 8, n_header);
  const std::size_t n_data = n - 8 - n_header;
  Buffer data = alloc(n_data);
  if (n_data) std::memcpy(data.get(), bytes + 8 + n_header, n_data);
  SafeTensorsFile f;
  f.path_ = label;
  f.bind(header, std::move(data), n_data);
  return f;
}

void SafeTensorsFile::bind(const std::string& header, Buffer data, std::size_t n_data) {
  const std::string& file = path_;
  const json j = parse_header_json(file, header);
  if (!j.is_object()) fail("safetensors: {}: header is JSON but not an object (it is {})", file, j.type_name());

  struct Span {
    std::uint64_t begin, end;
    std::size_t tensor;
  };
  std::vector<Span> spans;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("safetensors: {}: \"__metadata__\" must be an object of strings", file);
      for (const auto& [k, mv] : v.items()) {
        if (!mv.is_string()) fail("safetensors: {}: __metadata__.\"{}\" is not a string", file, k);
        metadata_[k] = mv.get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail("safetensors: {}: tensor \"{}\": entry is not an object", file, name);
    for (const auto& [k, unused] : v.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        fail("safetensors: {}: tensor \"{}\": unknown field \"{}\"", file, name, k);
    if (!v.contains("dtype") || !v["dtype"].is_string())
      fail("safetensors: {}: tensor \"{}\": missing or non-string \"dtype\"", file, name);
    const std::string dtype = v["dtype"].get<std::string>();
    const int esize = dtype_size(dtype);
    if (esize < 0) fail("safetensors: {}: tensor \"{}\": unknown dtype \"{}\"", file, name, dtype);
    if (esize == 0) fail("safetensors: {}: tensor \"{}\": sub-byte dtype {} is not supported", file, name, dtype);

    if (!v.contains("shape") || !v["shape"].is_array())
      fail("safetensors: {}: tensor \"{}\": missing or non-array \"shape\"", file, name);
    const json& js = v["shape"];
    if (js.size() > static_cast<std::size_t>(kMaxDims))
      fail("safetensors: {}: tensor \"{}\": shape has {} dims, at most {} supported", file, name, js.size(), kMaxDims);
    Shape shape;
    std::uint64_t numel = 1;
    for (const json& d : js) {
      if (!d.is_number_unsigned())
        fail("safetensors: {}: tensor \"{}\": shape entry {} is not a non-negative integer", file, name, d.dump());
      const std::uint64_t x = d.get<std::uint64_t>();
      if (x > static_cast<std::uint64_t>(INT64_MAX) || !mul_ok(numel, x, &numel))
        fail("safetensors: {}: tensor \"{}\": shape {} overflows", file, name, js.dump());
      shape.dims[shape.ndim++] = static_cast<i64>(x);
    }
    std::uint64_t nbytes = 0;
    if (!mul_ok(numel, static_cast<std::uint64_t>(esize), &nbytes))
      fail("safetensors: {}: tensor \"{}\": shape {} overflows", file, name, js.dump());

    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2 ||
        !v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned())
      fail("safetensors: {}: tensor \"{}\": \"data_offsets\" must be two non-negative integers", file, name);
    const std::uint64_t begin = v["data_offsets"][0].get<std::uint64_t>();
    const std::uint64_t end = v["data_offsets"][1].get<std::uint64_t>();
    if (begin > end || end > n_data)
      fail("safetensors: {}: tensor \"{}\": data_offsets [{}, {}] outside the {}-byte data section", file, name,
           begin, end, n_data);
    if (end - begin != nbytes)
      fail("safetensors: {}: tensor \"{}\": data_offsets [{}, {}] span {} bytes but dtype {} shape {} needs {}",
           file, name, begin, end, end - begin, dtype, shape.str(), nbytes);

    SafeTensor t;
    t.name = name;
    t.dtype = dtype;
    t.shape = shape;
    t.nbytes = nbytes;
    t.file = file;
    // Temporarily store the offset; pointers are bound once the layout is validated.
    t.data = reinterpret_cast<const char*>(static_cast<std::uintptr_t>(begin));
    spans.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(t));
  }

  // The data section must be covered exactly: no holes, no overlap (zero-size tensors sit at the
  // current position), nothing left over.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t pos = 0;
  const std::string* prev = nullptr;
  for (const Span& s : spans) {
    const std::string& nm = tensors_[s.tensor].name;
    if (s.begin < pos)
      fail("safetensors: {}: tensor \"{}\": data_offsets [{}, {}] overlap tensor \"{}\"", file, nm, s.begin, s.end,
           prev ? *prev : std::string());
    if (s.begin > pos)
      fail("safetensors: {}: tensor \"{}\": data_offsets [{}, {}] leave a hole of {} bytes before them", file, nm,
           s.begin, s.end, s.begin - pos);
    pos = s.end;
    prev = &nm;
  }
  if (pos != n_data)
    fail("safetensors: {}: data section has {} bytes but the tensors cover only {} (trailing bytes)", file, n_data,
         pos);

  char* base = data.get();
  buffers_.push_back(std::move(data));
  for (SafeTensor& t : tensors_) {
    const std::uint64_t off = reinterpret_cast<std::uintptr_t>(t.data);
    const std::size_t esize = static_cast<std::size_t>(dtype_size(t.dtype));
    if (off % esize == 0) {
      t.data = base + off;
    } else {  // another writer packed it unaligned: give it its own aligned copy
      Buffer b = alloc(t.nbytes);
      std::memcpy(b.get(), base + off, t.nbytes);
      t.data = b.get();
      buffers_.push_back(std::move(b));
    }
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const SafeTensor& a, const SafeTensor& b) { return a.name < b.name; });
  for (std::size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const SafeTensor& SafeTensorsFile::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("safetensors: {}: no tensor named \"{}\"", path_, name);
  return tensors_[it->second];
}

const float* SafeTensorsFile::get_f32(const std::string& name, const Shape& shape) const {
  const SafeTensor& t = get(name);
  t.expect_shape(shape);
  return t.f32();
}

std::vector<std::string> SafeTensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

const std::string& SafeTensorsFile::meta(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) fail("safetensors: {}: no metadata key \"{}\"", path_, key);
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// SafeTensorsWriter

void SafeTensorsWriter::add(const std::string& name, const char* dtype, const Shape& shape, const void* data,
                            std::size_t elem_size) {
  if (name.empty()) fail("safetensors writer: empty tensor name");
  if (name == "__metadata__") fail("safetensors writer: \"__metadata__\" is reserved, not a tensor name");
  if (tensors_.count(name)) fail("safetensors writer: duplicate tensor name \"{}\"", name);
  for (int i = 0; i < shape.ndim; ++i)
    if (shape[i] < 0) fail("safetensors writer: tensor \"{}\": negative dim in shape {}", name, shape.str());
  const std::size_t n = static_cast<std::size_t>(shape.numel()) * elem_size;
  if (n && !data) fail("safetensors writer: tensor \"{}\": null data for shape {}", name, shape.str());
  Entry e{dtype, shape, std::vector<char>(n)};
  if (n) std::memcpy(e.bytes.data(), data, n);
  tensors_.emplace(name, std::move(e));
}

void SafeTensorsWriter::add_f32(const std::string& name, const Shape& shape, const float* data) {
  add(name, "F32", shape, data, 4);
}
void SafeTensorsWriter::add_f64(const std::string& name, const Shape& shape, const double* data) {
  add(name, "F64", shape, data, 8);
}
void SafeTensorsWriter::add_i32(const std::string& name, const Shape& shape, const std::int32_t* data) {
  add(name, "I32", shape, data, 4);
}
void SafeTensorsWriter::add_i64(const std::string& name, const Shape& shape, const std::int64_t* data) {
  add(name, "I64", shape, data, 8);
}
void SafeTensorsWriter::add_u8(const std::string& name, const Shape& shape, const std::uint8_t* data) {
  add(name, "U8", shape, data, 1);
}

void SafeTensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

namespace {
// Header text (padded) and the order in which tensor bytes follow it.
template <typename Entries>
std::pair<std::string, std::vector<const std::vector<char>*>> layout(const Entries& tensors,
                                                                     const std::map<std::string, std::string>& meta) {
  std::vector<std::pair<const std::string*, decltype(&tensors.begin()->second)>> order;
  for (const auto& [name, e] : tensors) order.emplace_back(&name, &e);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return dtype_size(a.second->dtype) > dtype_size(b.second->dtype);  // names already sorted within
  });
  json h = json::object();
  if (!meta.empty()) h["__metadata__"] = meta;
  std::uint64_t off = 0;
  std::vector<const std::vector<char>*> blobs;
  for (const auto& [name, e] : order) {
    h[*name] = {{"dtype", e->dtype}, {"shape", e->shape.vec()}, {"data_offsets", {off, off + e->bytes.size()}}};
    off += e->bytes.size();
    blobs.push_back(&e->bytes);
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const json::exception& e) {
    fail("safetensors writer: a tensor name or metadata string is not valid UTF-8 ({})", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  return {std::move(text), std::move(blobs)};
}

void put_u64_le(char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
}  // namespace

std::vector<char> SafeTensorsWriter::serialize() const {
  auto [header, blobs] = layout(tensors_, metadata_);
  std::size_t total = 8 + header.size();
  for (auto* b : blobs) total += b->size();
  std::vector<char> out(total);
  put_u64_le(out.data(), header.size());
  std::memcpy(out.data() + 8, header.data(), header.size());
  std::size_t pos = 8 + header.size();
  for (auto* b : blobs) {
    if (!b->empty()) std::memcpy(out.data() + pos, b->data(), b->size());
    pos += b->size();
  }
  return out;
}

void SafeTensorsWriter::write(const std::string& path) const {
  auto [header, blobs] = layout(tensors_, metadata_);
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("safetensors writer: {}: cannot create ({})", tmp, sys_err());
  auto abort_with = [&](const char* what) {
    const std::string err = sys_err();
    ::close(fd);
    ::unlink(tmp.c_str());
    fail("safetensors writer: {}: {} failed ({})", tmp, what, err);
  };
  auto put = [&](const char* p, std::size_t n) {
    while (n) {
      ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) abort_with("write");
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  };
  char len[8];
  put_u64_le(len, header.size());
  put(len, 8);
  put(header.data(), header.size());
  for (auto* b : blobs) put(b->data(), b->size());
  if (::fsync(fd) != 0) abort_with("fsync");
  if (::close(fd) != 0) {
    const std::string err = sys_err();
    ::unlink(tmp.c_str());
    fail("safetensors writer: {}: close failed ({})", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = sys_err();
    ::unlink(tmp.c_str());
    fail("safetensors writer: cannot rename {} to {} ({})", tmp, path, err);
  }
  // Make the rename itself durable.
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace hlm
