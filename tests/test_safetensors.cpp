#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "core/safetensors.h"

using namespace hlm;
namespace fs = std::filesystem;

namespace {

// A fresh per-process scratch directory (several people run the tests at once).
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / ("hlm_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A raw file image from a header text and a data section.
std::string image(const std::string& header, const std::string& data) { return u64_le(header.size()) + header + data; }

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Reads `bytes` from a file and expects an hlm::Error whose message names the file and contains
// `needle`.
void expect_read_error(const TempDir& dir, const std::string& name, const std::string& bytes,
                       const std::string& needle) {
  const std::string path = dir.file(name);
  write_bytes(path, bytes);
  try {
    SafeTensorsFile::read(path);
    ADD_FAILURE() << name << ": no error, expected one containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << name << ": message does not name the file: " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << name << ": expected '" << needle << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << name << ": message is not one line: " << msg;
  }
}

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

SafeTensorsWriter sample_writer() {
  SafeTensorsWriter w;
  const float a[6] = {1.5f, -2.f, 3.25f, 0.f, -0.f, 1e-30f};
  const std::int32_t ids[4] = {0, -7, 2147483647, -2147483647 - 1};
  const double d[3] = {3.141592653589793, -1e300, 5e-324};
  const std::int64_t l[2] = {INT64_MIN, 1234567890123LL};
  const std::uint8_t u[5] = {0, 1, 127, 128, 255};
  const float scalar = 42.f;
  w.add_f32("model.layers.0.w", Shape{2, 3}, a);
  w.add_i32("input_ids", Shape{2, 2}, ids);
  w.add_f64("c.double", Shape{3}, d);
  w.add_i64("b.long", Shape{1, 1, 1, 2}, l);
  w.add_u8("a.bytes", Shape{5}, u);  // 5 bytes: later tensors would be misaligned if sorted by name only
  w.add_f32("scalar", Shape{}, &scalar);
  w.add_f32("empty", Shape{0, 4}, nullptr);
  w.set_metadata("config", R"({"d_model": 32})");
  w.set_metadata("format", "pt");
  return w;
}

}  // namespace

TEST(SafeTensors, RoundTripAllDtypesMetadataAndAlignment) {
  TempDir dir;
  const std::string path = dir.file("rt.safetensors");
  sample_writer().write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  const SafeTensorsFile f = SafeTensorsFile::read(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a.bytes", "b.long", "c.double", "empty", "input_ids",
                                                  "model.layers.0.w", "scalar"}));
  const SafeTensor& w = f.get("model.layers.0.w");
  EXPECT_EQ(w.dtype, "F32");
  EXPECT_EQ(w.shape, (Shape{2, 3}));
  const float want[6] = {1.5f, -2.f, 3.25f, 0.f, -0.f, 1e-30f};
  EXPECT_EQ(std::memcmp(w.f32(), want, sizeof want), 0);  // bit-exact, including -0
  EXPECT_EQ(f.get_f32("model.layers.0.w", Shape{2, 3})[2], 3.25f);
  EXPECT_EQ(f.get("input_ids").i32()[2], 2147483647);
  EXPECT_EQ(f.get("input_ids").i32()[3], -2147483647 - 1);
  EXPECT_EQ(f.get("c.double").f64()[0], 3.141592653589793);
  EXPECT_EQ(f.get("c.double").f64()[2], 5e-324);
  EXPECT_EQ(f.get("b.long").shape, (Shape{1, 1, 1, 2}));
  EXPECT_EQ(f.get("b.long").i64()[0], INT64_MIN);
  EXPECT_EQ(f.get("a.bytes").u8()[4], 255);
  EXPECT_EQ(f.get("scalar").shape.ndim, 0);
  EXPECT_EQ(f.get("scalar").f32()[0], 42.f);
  EXPECT_EQ(f.get("empty").numel(), 0);
  EXPECT_EQ(f.get("c.double").to_f32()[0], 3.1415927f);
  EXPECT_EQ(f.meta("config"), R"({"d_model": 32})");
  EXPECT_EQ(f.metadata().size(), 2u);
  for (const SafeTensor& t : f.tensors()) {
    const std::size_t esize = t.dtype == "U8" ? 1 : (t.dtype == "F64" || t.dtype == "I64") ? 8 : 4;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data) % esize, 0u) << t.name;
  }

  // The on-disk layout: header padded to a multiple of 8 with spaces, same bytes as serialize().
  const std::string disk = read_all(path);
  const auto ser = sample_writer().serialize();
  EXPECT_EQ(disk, std::string(ser.begin(), ser.end()));
  std::uint64_t n = 0;
  std::memcpy(&n, disk.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(disk.at(8), '{');
  // Independent check of the header with a plain JSON parser.
  auto h = nlohmann::json::parse(disk.substr(8, n));
  EXPECT_EQ(h["model.layers.0.w"]["dtype"], "F32");
  EXPECT_EQ(h["__metadata__"]["format"], "pt");

  // Overwriting an existing file replaces it.
  SafeTensorsWriter w2;
  const float one = 1.f;
  w2.add_f32("x", Shape{1}, &one);
  w2.write(path);
  EXPECT_EQ(SafeTensorsFile::read(path).names(), std::vector<std::string>{"x"});
}

TEST(SafeTensors, AccessErrorsNameFileTensorAndField) {
  TempDir dir;
  const std::string path = dir.file("acc.safetensors");
  sample_writer().write(path);
  const SafeTensorsFile f = SafeTensorsFile::read(path);
  auto expect_msg = [&](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error, expected '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { f.get("model.layers.9.w"); }, "model.layers.9.w");
  expect_msg([&] { f.get("input_ids").f32(); }, "input_ids");
  expect_msg([&] { f.get_f32("model.layers.0.w", Shape{3, 2}); }, "[3, 2]");
  expect_msg([&] { f.meta("optimizer"); }, "optimizer");
  EXPECT_FALSE(f.has("nope"));
  EXPECT_TRUE(f.has("scalar"));

  SafeTensorsWriter w;
  const float x = 0;
  w.add_f32("x", Shape{1}, &x);
  EXPECT_THROW(w.add_f32("x", Shape{1}, &x), Error);
  EXPECT_THROW(w.add_f32("__metadata__", Shape{1}, &x), Error);
  EXPECT_THROW(w.add_f32("", Shape{1}, &x), Error);
  EXPECT_THROW(w.write(dir.file("no/such/dir/x.safetensors")), Error);
  EXPECT_THROW(SafeTensorsFile::read(dir.file("missing.safetensors")), Error);
}

TEST(SafeTensors, CorruptFilesGiveOneLineErrorsNamingFileAndField) {
  TempDir dir;
  const std::string d8 = f32_bytes({1, 2});
  auto ent = [](const std::string& name, const std::string& dtype, const std::string& shape, int b, int e) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  expect_read_error(dir, "short", "abcde", "shorter than the 8-byte");
  expect_read_error(dir, "empty", "", "shorter than the 8-byte");
  expect_read_error(dir, "beyond", u64_le(100) + "{}", "runs past the end");
  expect_read_error(dir, "huge", u64_le(200'000'000) + "{}", "100 MB");
  expect_read_error(dir, "huge64", u64_le(~0ULL) + "{}", "100 MB");
  expect_read_error(dir, "notjson", image("{\"a\": ", ""), "not valid JSON");
  expect_read_error(dir, "nul_in_header", image(std::string("{}\0\0\0\0\0\0", 8), ""), "NUL byte at offset 2");
  expect_read_error(dir, "trailing_json", image("{} x", ""), "not valid JSON");
  expect_read_error(dir, "notobject", image("[1, 2, 3]", ""), "not an object");
  expect_read_error(dir, "entry_not_object", image("{\"a\": 3}", ""), "\"a\"");
  expect_read_error(dir, "unknown_dtype", image("{" + ent("w", "F33", "[2]", 0, 8) + "}", d8), "unknown dtype");
  expect_read_error(dir, "subbyte", image("{" + ent("w", "F4", "[2]", 0, 1) + "}", "x"), "sub-byte");
  expect_read_error(dir, "no_dtype", image(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", d8), "\"dtype\"");
  expect_read_error(dir, "no_shape", image(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", d8), "\"shape\"");
  expect_read_error(dir, "no_offsets", image(R"({"w":{"dtype":"F32","shape":[2]}})", d8), "data_offsets");
  expect_read_error(dir, "extra_field",
                    image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", d8), "unknown field");
  expect_read_error(dir, "size_mismatch", image("{" + ent("w", "F32", "[2,2]", 0, 8) + "}", d8), "needs 16");
  expect_read_error(dir, "dtype_mismatch", image("{" + ent("w", "F64", "[2]", 0, 8) + "}", d8), "needs 16");
  expect_read_error(dir, "out_of_range", image("{" + ent("w", "F32", "[4]", 0, 16) + "}", d8), "outside");
  expect_read_error(dir, "begin_gt_end", image("{" + ent("w", "F32", "[0]", 8, 4) + "}", d8), "outside");
  expect_read_error(dir, "neg_shape", image("{" + ent("w", "F32", "[-2]", 0, 8) + "}", d8), "non-negative");
  expect_read_error(dir, "float_shape", image("{" + ent("w", "F32", "[2.0]", 0, 8) + "}", d8), "non-negative");
  expect_read_error(dir, "five_dims", image("{" + ent("w", "F32", "[1,1,1,1,2]", 0, 8) + "}", d8), "5 dims");
  expect_read_error(dir, "overflow",
                    image("{" + ent("w", "F32", "[4294967296,4294967296,4294967296]", 0, 8) + "}", d8), "overflow");
  const std::string d16 = f32_bytes({1, 2, 3, 4});
  expect_read_error(dir, "overlap",
                    image("{" + ent("a", "F32", "[2]", 0, 8) + "," + ent("b", "F32", "[2]", 4, 12) + "}",
                          d16.substr(0, 12)),
                    "overlap");
  expect_read_error(dir, "hole",
                    image("{" + ent("a", "F32", "[1]", 0, 4) + "," + ent("b", "F32", "[2]", 8, 16) + "}", d16),
                    "hole of 4 bytes");
  expect_read_error(dir, "trailing", image("{" + ent("a", "F32", "[2]", 0, 8) + "}", d16), "trailing");
  expect_read_error(dir, "zero_size_elsewhere",
                    image("{" + ent("a", "F32", "[2]", 0, 8) + "," + ent("z", "F32", "[0]", 4, 4) + "}", d8),
                    "overlap");
  expect_read_error(dir, "duplicate",
                    image("{" + ent("a", "F32", "[1]", 0, 4) + "," + ent("a", "F32", "[1]", 4, 8) + "}", d8),
                    "duplicate tensor name \"a\"");
  expect_read_error(dir, "duplicate_field",
                    image(R"({"a":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}})", d8),
                    "duplicate key \"dtype\"");
  expect_read_error(dir, "meta_not_string",
                    image("{\"__metadata__\":{\"k\":1}," + ent("a", "F32", "[2]", 0, 8) + "}", d8), "__metadata__");
  expect_read_error(dir, "deep", image(std::string(100, '[') + std::string(100, ']'), ""), "nested deeper");
  expect_read_error(dir, "bad_utf8", image("{\"\xff\xfe\":1}", ""), "not valid JSON");

  // A well-formed minimal file with leading/trailing whitespace in the header is accepted.
  const std::string ok = dir.file("ok");
  write_bytes(ok, image("  {" + ent("a", "F32", "[2]", 0, 8) + "}   ", d8));
  EXPECT_EQ(SafeTensorsFile::read(ok).get("a").f32()[1], 2.f);
}

TEST(SafeTensors, TruncatedAndLyingFilesAreRejected) {
  TempDir dir;
  const auto ser = sample_writer().serialize();
  const std::string good(ser.begin(), ser.end());
  std::uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  // Truncated in the data section, in the header, in the length field.
  expect_read_error(dir, "trunc_data", good.substr(0, good.size() - 3), "outside");
  expect_read_error(dir, "trunc_header", good.substr(0, 8 + n / 2), "runs past the end");
  expect_read_error(dir, "trunc_len", good.substr(0, 5), "shorter than the 8-byte");
  // Extra bytes appended.
  expect_read_error(dir, "appended", good + "abcd", "trailing");

  // A header that lies: a shape grown in place (same header length) no longer matches its offsets.
  std::string lie = good;
  const auto at = lie.find("[2,3]");
  ASSERT_NE(at, std::string::npos);
  lie.replace(at, 5, "[3,3]");
  expect_read_error(dir, "lie_shape", lie, "needs 36");
  // A header that claims more data than there is: a tensor grown consistently (shape and offsets)
  // then runs into its neighbour or past the end.
  for (const char* name : {"scalar", "c.double"}) {
    auto h = nlohmann::json::parse(good.substr(8, n));
    const std::uint64_t end = h[name]["data_offsets"][1].get<std::uint64_t>();
    h[name]["shape"] = h[name]["dtype"] == "F64" ? nlohmann::json{4} : nlohmann::json{2};
    h[name]["data_offsets"][1] = end + (h[name]["dtype"] == "F64" ? 8 : 4);
    expect_read_error(dir, std::string("lie_") + name, image(h.dump(), good.substr(8 + n)), name);
  }
  // A header length pointing into the data section makes the JSON invalid.
  std::string lie3 = good;
  const std::string longer = u64_le(n + 8);
  lie3.replace(0, 8, longer);
  expect_read_error(dir, "lie_length", lie3, "not valid JSON");
}

// Random mutations of a valid file must give an hlm::Error or a file that reads (and can be fully
// touched), never a crash or another exception type. Run under the asan preset for memory errors.
TEST(SafeTensors, FuzzMutationsNeverCrash) {
  const auto ser = sample_writer().serialize();
  const std::string good(ser.begin(), ser.end());
  std::uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  const std::string header = good.substr(8, n), data = good.substr(8 + n);
  const std::string alphabet = "0123456789[]{}\",:- eFIU";
  Rng rng(1234);
  int ok = 0, errors = 0, semantic = 0;
  for (int it = 0; it < 4000; ++it) {
    std::string m;
    if (it % 2 == 0) {
      // Raw mode: byte edits anywhere, truncation, length-field damage.
      m = good;
      const int n_mut = 1 + static_cast<int>(rng.below(4));
      for (int k = 0; k < n_mut; ++k) {
        switch (rng.below(4)) {
          case 0:
            m[rng.below(m.size())] = static_cast<char>(rng.below(256));
            break;
          case 1:
            if (m.size() > 8) m[8 + rng.below(std::min<std::uint64_t>(n, m.size() - 8))] = alphabet[rng.below(alphabet.size())];
            break;
          case 2:
            m.resize(rng.below(m.size() + 1));
            break;
          case 3:
            if (m.size() >= 8) m[rng.below(8)] = static_cast<char>(rng.below(256));
            break;
        }
      }
    } else {
      // Header mode: edit the JSON text, keep the length field consistent, so the semantic checks
      // (dtypes, shapes, offsets, coverage) are reached.
      std::string h = header, d = data;
      const int n_mut = 1 + static_cast<int>(rng.below(3));
      for (int k = 0; k < n_mut; ++k) {
        const std::size_t p = rng.below(h.size());
        switch (rng.below(5)) {
          case 0:  // a digit becomes another digit (shapes, offsets)
          case 1: {
            std::size_t q = p;
            while (q < h.size() && !std::isdigit(static_cast<unsigned char>(h[q]))) ++q;
            if (q < h.size()) h[q] = static_cast<char>('0' + rng.below(10));
            break;
          }
          case 2:
            h[p] = alphabet[rng.below(alphabet.size())];
            break;
          case 3:
            h.insert(h.begin() + static_cast<long>(p), alphabet[rng.below(alphabet.size())]);
            break;
          case 4:
            h.erase(p, 1);
            break;
        }
      }
      if (rng.below(8) == 0) d.resize(rng.below(d.size() + 9), 'x');
      m = image(h, d);
    }
    try {
      SafeTensorsFile f = SafeTensorsFile::parse(m.data(), m.size(), "fuzz.safetensors");
      unsigned sum = 0;
      for (const SafeTensor& t : f.tensors())
        for (std::size_t b = 0; b < t.nbytes; ++b) sum += static_cast<unsigned char>(t.data[b]);
      (void)sum;
      ++ok;
    } catch (const Error& e) {
      const std::string msg = e.what();
      ASSERT_NE(msg.find("fuzz.safetensors"), std::string::npos) << msg;
      ++errors;
      semantic += msg.find(": tensor \"") != std::string::npos || msg.find("data section") != std::string::npos;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-hlm exception: " << e.what();
    }
  }
  EXPECT_GT(errors, 2000);
  EXPECT_GT(semantic, 300) << "the mutations should reach the per-tensor checks";
  EXPECT_GT(ok, 100);  // some mutations (e.g. in metadata values or padding) leave a valid file
}

// The golden reference files from tools/reference/make_golden.py load, with the expected layout.
TEST(GoldenFiles, SwaNopeHasExpectedTensors) {
  const std::string path = std::string(HLM_SOURCE_DIR) + "/tests/data/golden_swa_nope.safetensors";
  const SafeTensorsFile f = SafeTensorsFile::read(path);
  const auto cfg = nlohmann::json::parse(f.meta("config"));
  const auto opt = nlohmann::json::parse(f.meta("optimizer"));
  EXPECT_EQ(cfg.at("pattern"), "SSSF");
  EXPECT_EQ(cfg.at("n_layers"), 4);
  EXPECT_EQ(cfg.at("layer_types").at("S").at("window"), 5);
  EXPECT_EQ(cfg.at("layer_types").at("F").at("rope"), false);
  EXPECT_DOUBLE_EQ(opt.at("lr").get<double>(), 3e-3);
  EXPECT_DOUBLE_EQ(opt.at("beta2").get<double>(), 0.95);
  EXPECT_DOUBLE_EQ(opt.at("weight_decay").get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(opt.at("grad_clip").get<double>(), 1.0);

  const i64 V = 61, D = 32, H = 2, Hkv = 1, hd = 16, Fd = 48, B = 2, T = 16;
  EXPECT_EQ(f.get("input_ids").dtype, "I32");
  EXPECT_EQ(f.get("input_ids").shape, (Shape{B, T}));
  EXPECT_EQ(f.get("targets").shape, (Shape{B, T}));
  for (i64 i = 0; i < B * T; ++i) {
    EXPECT_GE(f.get("input_ids").i32()[i], 0);
    EXPECT_LT(f.get("targets").i32()[i], V);
  }
  EXPECT_EQ(f.get("logits").shape, (Shape{B, T, V}));
  EXPECT_EQ(f.get("loss").shape, (Shape{1}));
  EXPECT_EQ(f.get("losses").shape, (Shape{10}));
  // Untrained loss is near ln V; the 10-step curve goes down.
  EXPECT_NEAR(f.get("loss").f32()[0], std::log(61.0), 0.3);
  EXPECT_EQ(f.get("losses").f32()[0], f.get("loss").f32()[0]);
  EXPECT_LT(f.get("losses").f32()[9], f.get("losses").f32()[0] - 0.05);

  std::vector<std::pair<std::string, Shape>> params = {
      {"model.embed_tokens.weight", {V, D}}, {"model.norm.weight", {D}}, {"lm_head.weight", {V, D}}};
  for (int l = 0; l < 4; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    params.push_back({p + "input_layernorm.weight", {D}});
    params.push_back({p + "post_attention_layernorm.weight", {D}});
    params.push_back({p + "mlp.gate_proj.weight", {Fd, D}});
    params.push_back({p + "mlp.up_proj.weight", {Fd, D}});
    params.push_back({p + "mlp.down_proj.weight", {D, Fd}});
    params.push_back({p + "self_attn.q_proj.weight", {H * hd, D}});
    params.push_back({p + "self_attn.k_proj.weight", {Hkv * hd, D}});
    params.push_back({p + "self_attn.v_proj.weight", {Hkv * hd, D}});
    params.push_back({p + "self_attn.o_proj.weight", {D, H * hd}});
  }
  for (const auto& [name, shape] : params) {
    for (const std::string& n : {name, "grad." + name}) {
      const SafeTensor& t = f.get(n);
      EXPECT_EQ(t.dtype, "F32") << n;
      EXPECT_EQ(t.shape, shape) << n << " " << t.shape.str();
      for (i64 i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isfinite(t.f32()[i])) << n << "[" << i << "]";
    }
  }
  // Exactly these tensors: params, their grads, and the 5 data tensors.
  EXPECT_EQ(f.tensors().size(), 2 * params.size() + 5);
}
