// The GGUF reader (core/gguf.h) and ggml's block formats (core/ggml_quants.h): hand-built images of every value
// type and every refusal, and dequantization bit for bit against gguf-py's on the fixture that
// tools/gguf_check/make_fixtures.py writes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/gguf.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "gguf_image.h"

using namespace hlm;
using namespace hlm::testing::gguf_image;
namespace fs = std::filesystem;

namespace {

GgufFile parse(const std::string& bytes, const std::string& label = "mem.gguf") {
  return GgufFile::parse(bytes.data(), bytes.size(), label);
}

// Parsing `bytes` must fail with one line naming the label and containing every needle.
void expect_refused(const std::string& bytes, const std::vector<std::string>& needles, const std::string& label) {
  try {
    parse(bytes, label);
    ADD_FAILURE() << label << ": accepted, expected an error containing '" << needles.front() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("gguf: " + label + ": ", 0), 0u) << label << ": message does not name the file: " << msg;
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << label << ": expected '" << n << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << label << ": message is not one line: " << msg;
  }
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// One pair of every value type, nested and empty arrays included.
std::vector<std::string> every_value_type() {
  return {
      kv("v.u8", VT::UINT8, le(250, 1)),
      kv("v.i8", VT::INT8, le(0x80, 1)),  // -128
      kv("v.u16", VT::UINT16, le(65535, 2)),
      kv("v.i16", VT::INT16, le(0x8001, 2)),  // -32767
      kv("v.u32", VT::UINT32, u32(4294967295u)),
      kv("v.i32", VT::INT32, u32(0xFFFFFFFEu)),  // -2
      kv("v.f32", VT::FLOAT32, f32(-1.5f)),
      kv("v.bool", VT::BOOL, le(1, 1)),
      kv("v.string", VT::STRING, gstr("gemma3 \xc3\xa9")),
      kv("v.u64", VT::UINT64, u64(0xFFFFFFFFFFFFFFFFull)),
      kv("v.i64", VT::INT64, u64(0x8000000000000000ull)),  // INT64_MIN
      kv("v.f64", VT::FLOAT64, f64(0.1)),
      kv("v.array_strings", VT::ARRAY, arr(VT::STRING, 3, gstr("a") + gstr("") + gstr("<eos>"))),
      kv("v.array_f32", VT::ARRAY, arr(VT::FLOAT32, 2, f32(0.25f) + f32(-8.0f))),
      kv("v.array_i32", VT::ARRAY, arr(VT::INT32, 3, u32(1) + u32(0xFFFFFFFFu) + u32(7))),
      kv("v.array_u64", VT::ARRAY, arr(VT::UINT64, 1, u64(1ull << 40))),
      kv("v.array_bool", VT::ARRAY, arr(VT::BOOL, 2, le(0, 1) + le(1, 1))),
      kv("v.array_empty", VT::ARRAY, arr(VT::UINT8, 0, "")),
      kv("v.array_nested", VT::ARRAY,
         arr(VT::ARRAY, 2, arr(VT::INT16, 2, le(3, 2) + le(0xFFFF, 2)) + arr(VT::STRING, 1, gstr("x")))),
  };
}

// A valid image with metadata of every type and two tensors (F32 [3] and Q8_0 [32, 2]).
Image sample_image() {
  Image im;
  im.kvs = every_value_type();
  std::string q8(2 * 34, '\0');
  for (int b = 0; b < 2; ++b) {
    const std::uint16_t half = 0x3800;  // 0.5
    std::memcpy(&q8[static_cast<std::size_t>(b) * 34], &half, 2);
    for (int j = 0; j < 32; ++j)
      q8[static_cast<std::size_t>(b) * 34 + 2 + static_cast<std::size_t>(j)] = static_cast<char>(j - 16 + b);
  }
  im.tensors = {{"norm.weight", {3}, 0, 0, f32_bytes({1.0f, -2.0f, 3.5f})}, {"blk.0.w", {32, 2}, 8, 0, q8}};
  im.place();
  return im;
}

}  // namespace

TEST(Gguf, EveryValueTypeAndTheTypedGetters) {
  const GgufFile f = parse(sample_image().build());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.metadata().size(), every_value_type().size());
  EXPECT_EQ(f.metadata().front().key, "v.u8");  // file order kept
  EXPECT_EQ(f.get_int("v.u8"), 250);
  EXPECT_EQ(f.get_int("v.i8"), -128);
  EXPECT_EQ(f.get_int("v.u16"), 65535);
  EXPECT_EQ(f.get_int("v.i16"), -32767);
  EXPECT_EQ(f.get_int("v.u32"), 4294967295);
  EXPECT_EQ(f.get_int("v.i32"), -2);
  EXPECT_EQ(f.get_float("v.f32"), -1.5);
  EXPECT_TRUE(f.get_bool("v.bool"));
  EXPECT_EQ(f.get_string("v.string"), "gemma3 \xc3\xa9");
  EXPECT_EQ(f.value("v.u64").uint_value, 0xFFFFFFFFFFFFFFFFull);
  EXPECT_EQ(f.get_int("v.i64"), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(f.get_float("v.f64"), 0.1);
  EXPECT_EQ(f.get_string_array("v.array_strings"), (std::vector<std::string>{"a", "", "<eos>"}));
  EXPECT_EQ(f.get_float_array("v.array_f32"), (std::vector<float>{0.25f, -8.0f}));
  EXPECT_EQ(f.get_int_array("v.array_i32"), (std::vector<std::int64_t>{1, -1, 7}));
  EXPECT_EQ(f.get_int_array("v.array_u64"), (std::vector<std::int64_t>{1ll << 40}));
  EXPECT_EQ(f.value("v.array_bool").elem_bytes, (std::vector<std::uint8_t>{0, 1}));
  EXPECT_EQ(f.value("v.array_empty").count, 0u);
  EXPECT_TRUE(f.get_int_array("v.array_empty").empty());
  const GgufValue& nested = f.value("v.array_nested");
  ASSERT_EQ(nested.arrays.size(), 2u);
  EXPECT_EQ(nested.arrays[0].elem_type, VT::INT16);
  EXPECT_EQ(nested.arrays[0].elem_bytes, (std::vector<std::uint8_t>{3, 0, 0xFF, 0xFF}));
  EXPECT_EQ(nested.arrays[1].strings, (std::vector<std::string>{"x"}));
  EXPECT_EQ(nested.type_name(), "ARRAY[ARRAY[INT16]]");
  EXPECT_EQ(f.value("v.array_strings").type_name(), "ARRAY[STRING]");
  EXPECT_TRUE(f.has("v.f64"));
  EXPECT_FALSE(f.has("v.nope"));
  EXPECT_EQ(f.find("v.nope"), nullptr);

  // Missing keys and wrong types name the file and the key.
  const std::vector<std::pair<std::string, std::string>> errors = {
      {error_of([&] { f.get_string("v.nope"); }), "gguf: mem.gguf: missing key \"v.nope\""},
      {error_of([&] { f.get_string("v.u32"); }), "gguf: mem.gguf: key \"v.u32\" is UINT32, expected STRING"},
      {error_of([&] { f.get_int("v.f32"); }), "key \"v.f32\" is FLOAT32, expected an integer"},
      {error_of([&] { f.get_int("v.u64"); }), "key \"v.u64\": UINT64 value 18446744073709551615 does not fit"},
      {error_of([&] { f.get_float("v.i32"); }), "key \"v.i32\" is INT32, expected FLOAT32 or FLOAT64"},
      {error_of([&] { f.get_bool("v.u8"); }), "key \"v.u8\" is UINT8, expected BOOL"},
      {error_of([&] { f.get_string_array("v.array_f32"); }),
       "key \"v.array_f32\" is ARRAY[FLOAT32], expected ARRAY[STRING]"},
      {error_of([&] { f.get_int_array("v.array_strings"); }),
       "key \"v.array_strings\" is ARRAY[STRING], expected an ARRAY of integers"},
      {error_of([&] { f.get_float_array("v.string"); }), "key \"v.string\" is STRING, expected ARRAY[FLOAT32]"},
      {error_of([&] { f.get_int_array("v.nope"); }), "missing key \"v.nope\""},
      {error_of([&] { f.tensor("blk.9.w"); }), "gguf: mem.gguf: no tensor named \"blk.9.w\""},
  };
  for (const auto& [msg, want] : errors) EXPECT_NE(msg.find(want), std::string::npos) << msg;
}

TEST(Gguf, TensorInfosShapesAndDequantization) {
  const Image im = sample_image();
  const std::string bytes = im.build();
  const GgufFile f = parse(bytes);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "norm.weight");  // file order kept
  const GgufTensor& w = f.tensor("blk.0.w");
  EXPECT_EQ(w.type, GgmlType::Q8_0);
  EXPECT_STREQ(w.type_name(), "Q8_0");
  EXPECT_EQ(w.dims, (std::vector<std::int64_t>{32, 2}));
  EXPECT_EQ(w.row_length(), 32);
  EXPECT_EQ(w.n_rows(), 2);
  EXPECT_EQ(w.numel(), 64);
  EXPECT_EQ(w.row_major_shape(), (Shape{2, 32}));
  EXPECT_EQ(w.nbytes, 68u);
  EXPECT_EQ(w.row_bytes(), 34u);
  EXPECT_EQ(w.offset, 32u);  // 12 bytes of F32, padded to 32
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(w.data, reinterpret_cast<const std::uint8_t*>(f.tensors()[0].data) + 32);
  EXPECT_EQ(std::memcmp(w.data, im.tensors[1].bytes.data(), w.nbytes), 0);

  EXPECT_EQ(dequantize(f.tensor("norm.weight")), (std::vector<float>{1.0f, -2.0f, 3.5f}));
  std::vector<float> want;
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 32; ++j) want.push_back(0.5f * static_cast<float>(j - 16 + b));
  EXPECT_EQ(dequantize(w), want);
  EXPECT_EQ(dequantize_rows(w, 1, 1), std::vector<float>(want.begin() + 32, want.end()));
  EXPECT_TRUE(dequantize_rows(w, 2, 0).empty());
  EXPECT_NE(error_of([&] { dequantize_rows(w, 1, 2); }).find("tensor \"blk.0.w\": rows [1, 3) outside its 2 rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { dequantize_rows(w, -1, 1); }).find("outside its 2 rows"), std::string::npos);

  // A custom alignment moves the data section and the offsets; zero-size and 0-d tensors are fine; types the
  // reader knows but cannot decode are listed, and refused by name only when dequantized.
  Image a;
  a.alignment = 64;
  a.kvs = {kv("general.alignment", VT::UINT32, u32(64))};
  a.tensors = {{"scalar", {}, 0, 0, f32_bytes({7.0f})},
               {"empty", {0, 5}, 2, 0, ""},
               {"iq", {256}, static_cast<std::uint32_t>(GgmlType::IQ2_XXS), 0, std::string(66, '\1')},
               {"cube", {2, 3, 4}, 1, 0, std::string(48, '\0')}};
  a.place();
  const GgufFile g = parse(a.build());
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(g.data_offset() % 64, 0u);
  EXPECT_EQ(g.tensor("iq").offset, 64u);  // after the zero-size tensor at 64
  EXPECT_EQ(dequantize(g.tensor("scalar")), std::vector<float>{7.0f});
  EXPECT_EQ(g.tensor("scalar").row_major_shape(), Shape{});
  EXPECT_EQ(g.tensor("empty").numel(), 0);
  EXPECT_TRUE(dequantize(g.tensor("empty")).empty());
  EXPECT_EQ(g.tensor("cube").n_rows(), 12);
  EXPECT_EQ(g.tensor("cube").row_major_shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(dequantize(g.tensor("cube")), std::vector<float>(24, 0.0f));
  EXPECT_NE(error_of([&] {
              dequantize(g.tensor("iq"));
            }).find("gguf: mem.gguf: tensor \"iq\": type IQ2_XXS cannot be dequantized (supported: F32, F16, Q4_0"),
            std::string::npos);

  // Version 2 has the same layout.
  Image v2 = sample_image();
  v2.version = 2;
  EXPECT_EQ(parse(v2.build()).version(), 2u);
}

TEST(Gguf, RefusalsNameTheFileAndTheField) {
  struct Case {
    std::string label;
    std::string bytes;
    std::vector<std::string> needles;
  };
  std::vector<Case> cases;
  auto with = [](auto&& edit) {
    Image im = sample_image();
    edit(im);
    return im.build();
  };
  const std::string good = sample_image().build();

  cases.push_back({"short", good.substr(0, 23), {"file is 23 bytes, shorter than the 24-byte header"}});
  cases.push_back({"magic", with([](Image& im) { im.magic = "GGUG"; }), {"not a GGUF file", "47 47 55 47"}});
  cases.push_back({"version1", with([](Image& im) { im.version = 1; }), {"GGUF version 1 is not supported"}});
  cases.push_back({"version4", with([](Image& im) { im.version = 4; }), {"GGUF version 4 is not supported"}});
  cases.push_back({"bigendian", with([](Image& im) { im.version = 0x03000000; }), {"big-endian"}});
  cases.push_back({"lying_tensor_count",
                   with([](Image& im) { im.n_tensors = 1ull << 60; }),
                   {"tensor count 1152921504606846976", "lying counts"}});
  cases.push_back({"lying_kv_count",
                   with([](Image& im) { im.n_kv = 0xFFFFFFFFFFFFFFFFull; }),
                   {"key-value count", "lying counts"}});
  cases.push_back({"lying_key_length",
                   with([](Image& im) { im.kvs[0] = u64(1ull << 62) + "v.u8"; }),
                   {"the key of key-value pair 0", "string length 4611686018427387904 runs past the end"}});
  cases.push_back({"lying_string_value",
                   with([](Image& im) { im.kvs[8] = gstr("v.string") + vtype(VT::STRING) + u64(1ull << 40) + "abc"; }),
                   {"the value of key \"v.string\"", "string length 1099511627776"}});
  cases.push_back(
      {"lying_array_count",
       with([](Image& im) { im.kvs[13] = kv("v.array_f32", VT::ARRAY, arr(VT::FLOAT32, 1ull << 61, f32(1))); }),
       {"key \"v.array_f32\": array of 2305843009213693952 FLOAT32 elements", "lying length"}});
  cases.push_back(
      {"lying_string_array_count",
       with([](Image& im) { im.kvs[12] = kv("v.array_strings", VT::ARRAY, arr(VT::STRING, 1ull << 40, gstr("a"))); }),
       {"key \"v.array_strings\": array of 1099511627776 STRING elements"}});
  cases.push_back({"lying_string_in_array",
                   with([](Image& im) {
                     im.kvs[12] = kv("v.array_strings", VT::ARRAY, arr(VT::STRING, 2, gstr("a") + u64(999999) + "b"));
                   }),
                   {"element 1 of key \"v.array_strings\"", "string length 999999"}});
  cases.push_back({"lying_nested_count",
                   with([](Image& im) {
                     im.kvs[18] = kv("v.array_nested", VT::ARRAY, arr(VT::ARRAY, 1, arr(VT::UINT64, 1ull << 50, "")));
                   }),
                   {"key \"v.array_nested\": array of 1125899906842624 UINT64 elements"}});
  cases.push_back({"unknown_value_type",
                   with([](Image& im) { im.kvs[1] = gstr("v.i8") + u32(13) + le(1, 1); }),
                   {"key \"v.i8\": unknown value type 13"}});
  cases.push_back({"unknown_array_type",
                   with([](Image& im) { im.kvs[1] = kv("v.i8", VT::ARRAY, u32(99) + u64(0)); }),
                   {"key \"v.i8\": unknown array element type 99"}});
  cases.push_back({"bool_value",
                   with([](Image& im) { im.kvs[7] = kv("v.bool", VT::BOOL, le(2, 1)); }),
                   {"key \"v.bool\": BOOL value 2 is neither 0 nor 1"}});
  cases.push_back(
      {"bool_array",
       with([](Image& im) { im.kvs[16] = kv("v.array_bool", VT::ARRAY, arr(VT::BOOL, 2, le(1, 1) + le(9, 1))); }),
       {"key \"v.array_bool\": element 1 of the BOOL array is 9"}});
  cases.push_back({"deep_nesting",
                   with([](Image& im) {
                     std::string v = arr(VT::UINT8, 0, "");
                     for (int i = 0; i < 9; ++i) v = arr(VT::ARRAY, 1, v);
                     im.kvs[18] = kv("v.array_nested", VT::ARRAY, v);
                   }),
                   {"key \"v.array_nested\": arrays nested deeper than 8"}});
  cases.push_back({"duplicate_key",
                   with([](Image& im) { im.kvs.push_back(kv("v.u16", VT::UINT16, le(1, 2))); }),
                   {"duplicate key \"v.u16\""}});
  cases.push_back({"key_with_newline",
                   with([](Image& im) {
                     im.kvs.push_back(kv("v.u8\nx", VT::UINT8, le(1, 1)));
                     im.kvs.push_back(kv("v.u8\nx", VT::UINT8, le(1, 1)));
                   }),
                   {"duplicate key \"v.u8\\x0ax\""}});
  cases.push_back({"alignment_type",
                   with([](Image& im) { im.kvs.push_back(kv("general.alignment", VT::UINT64, u64(32))); }),
                   {"key \"general.alignment\" is UINT64, expected UINT32"}});
  cases.push_back({"alignment_pow2",
                   with([](Image& im) { im.kvs.push_back(kv("general.alignment", VT::UINT32, u32(24))); }),
                   {"key \"general.alignment\" is 24, not a power of two"}});
  cases.push_back({"alignment_zero",
                   with([](Image& im) { im.kvs.push_back(kv("general.alignment", VT::UINT32, u32(0))); }),
                   {"key \"general.alignment\" is 0, not a power of two"}});
  cases.push_back({"n_dims",
                   with([](Image& im) {
                     im.tensors[1].dims = {32, 1, 1, 1, 2};
                   }),
                   {"tensor \"blk.0.w\": n_dims 5 exceeds ggml's 4"}});
  cases.push_back({"dims_overflow",
                   with([](Image& im) {
                     im.tensors[1].dims = {32, 1ull << 40, 1ull << 40};
                   }),
                   {"tensor \"blk.0.w\": dims overflow (dim 2 is 1099511627776)"}});
  cases.push_back({"dim_negative",
                   with([](Image& im) {
                     im.tensors[1].dims = {32, 0x8000000000000000ull};
                   }),
                   {"tensor \"blk.0.w\": dims overflow (dim 1 is 9223372036854775808)"}});
  cases.push_back(
      {"unknown_type", with([](Image& im) { im.tensors[1].type = 99; }), {"tensor \"blk.0.w\": unknown ggml type 99"}});
  cases.push_back(
      {"removed_type", with([](Image& im) { im.tensors[1].type = 4; }), {"tensor \"blk.0.w\": unknown ggml type 4"}});
  cases.push_back({"row_not_blocks",
                   with([](Image& im) {
                     im.tensors[1].dims = {48, 1};
                   }),
                   {"tensor \"blk.0.w\": row length 48 (dims[0]) is not a multiple of the Q8_0 block size 32"}});
  cases.push_back({"huge_tensor",
                   with([](Image& im) {
                     im.tensors[1].dims = {32, 1ull << 50};
                   }),
                   {"tensor \"blk.0.w\": 32 x 1125899906842624 Q8_0 values need more bytes than the"}});
  cases.push_back({"duplicate_tensor",
                   with([](Image& im) { im.tensors[1].name = "norm.weight"; }),
                   {"duplicate tensor name \"norm.weight\""}});
  cases.push_back({"misaligned",
                   with([](Image& im) { im.tensors[1].offset = 16; }),
                   {"tensor \"blk.0.w\": offset 16 is not a multiple of the alignment 32"}});
  cases.push_back({"overlap",
                   with([](Image& im) {
                     im.tensors[0].bytes = std::string(40, '\0');
                     im.tensors[0].dims = {10};
                   }),
                   {"tensor \"blk.0.w\": bytes [32, 100) overlap tensor \"norm.weight\" (bytes [0, 40))"}});
  cases.push_back({"same_offset",
                   with([](Image& im) { im.tensors[1].offset = 0; }),
                   {"tensor \"blk.0.w\": bytes [0, 68) overlap tensor \"norm.weight\" (bytes [0, 12))"}});
  cases.push_back(
      {"gap",
       with([](Image& im) { im.tensors[1].offset = 64; }),
       {"tensor \"blk.0.w\": offset 64 leaves a gap of 32 bytes after tensor \"norm.weight\" (expected offset 32)"}});
  cases.push_back({"gap_at_start",
                   with([](Image& im) { im.tensors.erase(im.tensors.begin()); }),
                   {"tensor \"blk.0.w\": offset 32 leaves a gap of 32 bytes after the data start"}});
  cases.push_back(
      {"past_end",
       with([](Image& im) {
         im.tensors[1].offset = 1ull << 40;
         im.tensors[1].bytes.clear();
       }),
       {"tensor \"blk.0.w\": bytes [1099511627776, 1099511627844) run past the end of the 32-byte data section"}});
  cases.push_back({"offset_wraps",
                   with([](Image& im) {
                     im.tensors[1].offset = 0xFFFFFFFFFFFFFFE0ull;
                     im.tensors[1].bytes.clear();
                   }),
                   {"tensor \"blk.0.w\"", "run past the end"}});
  cases.push_back(
      {"trailing", good + std::string(64, '\0'), {"64 bytes of trailing data after the last tensor \"blk.0.w\""}});
  cases.push_back(
      {"truncated_data", good.substr(0, good.size() - 40), {"tensor \"blk.0.w\": bytes [32, 100) run past the end"}});
  {
    Image im;  // no tensors: nothing may follow the header but padding
    im.kvs = {kv("a", VT::UINT8, le(1, 1))};
    cases.push_back(
        {"trailing_no_tensors", im.build() + std::string(32, 'x'), {"32 bytes of trailing data after the header"}});
  }
  {
    // A tensor name length that lies (the builder writes true lengths): patch the second name's length.
    const Image im = sample_image();
    std::string bytes = im.build();
    const std::string name = gstr("blk.0.w");
    const std::size_t at = bytes.find(name);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 8, u64(1ull << 50));
    cases.push_back({"lying_tensor_name", bytes, {"the name of tensor 1", "string length 1125899906842624"}});
  }
  for (const Case& c : cases) expect_refused(c.bytes, c.needles, c.label);
}

TEST(Gguf, TruncationAtEveryByteIsRefusedUntilTheLastTensorEnds) {
  const Image im = sample_image();
  const std::string bytes = im.build();
  const GgufFile full = parse(bytes);
  const GgufTensor& last = full.tensor("blk.0.w");
  const std::size_t tensors_end = full.data_offset() + last.offset + last.nbytes;
  ASSERT_LT(tensors_end, bytes.size());  // the final padding exists
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    const std::string label = "cut" + std::to_string(cut);
    if (cut < tensors_end) {
      const std::string msg = error_of([&] { parse(bytes.substr(0, cut), label); });
      EXPECT_EQ(msg.rfind("gguf: " + label + ": ", 0), 0u) << msg;
    } else {
      EXPECT_EQ(parse(bytes.substr(0, cut), label).tensors().size(), 2u) << "the final padding may be missing";
    }
  }
  // Cuts inside a field name that field (in images small enough that the counts still fit the bytes left).
  auto cut_in = [](const Image& im, const std::string& marker, long extra) {
    const std::string s = im.build();
    return s.substr(0, static_cast<std::size_t>(static_cast<long>(s.find(marker)) + extra));
  };
  Image one_string, one_array, no_metadata = sample_image();
  one_string.kvs = {every_value_type()[8]};
  one_array.kvs = {every_value_type()[12]};
  no_metadata.kvs.clear();
  expect_refused(cut_in(one_string, "gemma3 ", 3), {"the value of key \"v.string\": string length 9 runs past the end"},
                 "cut_string");
  expect_refused(cut_in(one_array, "<eos>", 2), {"element 2 of key \"v.array_strings\": string length 5"}, "cut_array");
  expect_refused(
      cut_in(one_array, "<eos>", -3),  // the count no longer fits the bytes left
      {"key \"v.array_strings\": array of 3 STRING elements needs at least 8 bytes per element", "truncated"},
      "cut_array_length");
  expect_refused(cut_in(no_metadata, "blk.0.w", 3), {"the name of tensor 1: string length 7"}, "cut_tensor_name");
  expect_refused(cut_in(no_metadata, "blk.0.w", 7 + 4 + 5), {"file ends inside the info of tensor \"blk.0.w\""},
                 "cut_tensor_dims");
}

// Random byte edits and cuts of a valid image give an hlm::Error or a file whose every tensor dequantizes.
TEST(Gguf, MutationsNeverCrash) {
  const std::string good = sample_image().build();
  Rng rng(53);
  int refused = 0, accepted = 0;
  for (int it = 0; it < 4000; ++it) {
    std::string b = good;
    const int edits = 1 + static_cast<int>(rng.below(4));
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng.below(b.size());
      switch (rng.below(4)) {
        case 0:
          b[at] = static_cast<char>(rng.below(256));
          break;
        case 1:
          b[at] = static_cast<char>(b[at] ^ (1 << (rng.below(8))));
          break;
        case 2:
          b[at] = static_cast<char>(0xFF);
          break;
        default:
          b.resize(at);
          break;
      }
      if (b.empty()) break;
    }
    try {
      const GgufFile f = parse(b);
      for (const GgufTensor& t : f.tensors())
        if (ggml_type_info(t.type).dequantizable) {
          EXPECT_EQ(dequantize(t).size(), static_cast<std::size_t>(t.numel()));
        }
      ++accepted;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("gguf: mem.gguf: ", 0), 0u) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 2000);
  EXPECT_GT(accepted, 100);  // edits inside values and data leave valid files
}

TEST(Gguf, FilesAreMappedAndOpenErrorsNameThePath) {
  const fs::path dir = fs::temp_directory_path() / ("hlm_gguf_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "m.gguf").string();
  const std::string bytes = sample_image().build();
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  {
    GgufFile f = GgufFile::read(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(dequantize(f.tensor("norm.weight")), (std::vector<float>{1.0f, -2.0f, 3.5f}));
    GgufFile moved = std::move(f);
    EXPECT_EQ(moved.tensor("blk.0.w").dims[0], 32);  // the mapping moves with the object
  }
  EXPECT_NE(error_of([&] {
              GgufFile::read((dir / "none.gguf").string());
            }).find("gguf: " + (dir / "none.gguf").string() + ": cannot open"),
            std::string::npos);
  EXPECT_NE(error_of([&] { GgufFile::read(dir.string()); }).find("not a regular file"), std::string::npos);
  std::ofstream(dir / "short.gguf") << "GGUF";
  EXPECT_NE(error_of([&] { GgufFile::read((dir / "short.gguf").string()); }).find("file is 4 bytes"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(GgmlQuants, HalfAndBfloat16ConvertExactly) {
  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(fp16_to_fp32(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(std::bit_cast<std::uint32_t>(fp16_to_fp32(0x8000)), 0x80000000u);
  EXPECT_EQ(fp16_to_fp32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_fp32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7C01)));
  // Every finite half round-trips through float.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    const float f = fp16_to_fp32(static_cast<std::uint16_t>(h));
    const double back = static_cast<double>(f);
    const int sign = (h & 0x8000) ? -1 : 1;
    const int exp = static_cast<int>((h >> 10) & 0x1F), mant = static_cast<int>(h & 0x3FF);
    const double want = sign * (exp ? std::ldexp(1024.0 + mant, exp - 25) : std::ldexp(static_cast<double>(mant), -24));
    ASSERT_EQ(back, want) << h;
  }
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xC0A0), -5.0f);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(0x7FC1)));
}

TEST(GgmlQuants, TypeTableMatchesGgml) {
  ASSERT_NE(ggml_type_info(12), nullptr);
  EXPECT_STREQ(ggml_type_info(12)->name, "Q4_K");
  EXPECT_EQ(ggml_type_info(12)->block_values, 256);
  EXPECT_EQ(ggml_type_info(12)->block_bytes, 144);
  EXPECT_EQ(ggml_type_info(14)->block_bytes, 210);
  EXPECT_EQ(ggml_type_info(30)->block_bytes, 2);
  for (std::uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u, 1000u})
    EXPECT_EQ(ggml_type_info(removed), nullptr) << removed;
  EXPECT_EQ(ggml_dequantizable_type_names(),
            "F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, BF16");
  float out[32];
  const std::uint8_t block[34] = {};
  EXPECT_NE(
      error_of([&] { ggml_dequantize(GgmlType::Q8_0, block, 31, out); }).find("not a whole number of 32-value blocks"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] { ggml_dequantize(GgmlType::TQ2_0, block, 256, out); }).find("type TQ2_0 cannot be dequantized"),
      std::string::npos);
}

// Compares n values bit for bit (two NaNs count as equal: the reference may quiet a signalling NaN) and returns
// how many were NaN.
int expect_same_bits(const std::string& name, const float* got, const float* want, std::size_t n) {
  std::size_t mismatches = 0;
  int nans = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    nans += both_nan;
    if (!both_nan && std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]) &&
        mismatches++ < 5)
      ADD_FAILURE() << name << "[" << i << "]: " << got[i] << " vs gguf-py " << want[i];
  }
  EXPECT_EQ(mismatches, 0u) << name;
  return nans;
}

// Random blocks of every type (tools/gguf_check/make_fixtures.py) decode to gguf-py's values, bit for bit.
TEST(GgmlQuants, EveryTypeMatchesGgufPyBitForBit) {
  const std::string dir = std::string(HLM_SOURCE_DIR) + "/tests/data/gguf/";
  const GgufFile f = GgufFile::read(dir + "quants.gguf");
  const SafeTensorsFile expected = SafeTensorsFile::read(dir + "quants_expected.safetensors");
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);

  std::vector<std::string> types_seen;
  int nan_values = 0;
  for (const GgufTensor& t : f.tensors()) {
    SCOPED_TRACE(t.name);
    const SafeTensor& want = expected.get(t.name);
    EXPECT_EQ(t.row_major_shape(), want.shape);
    const std::vector<float> got = dequantize(t);
    ASSERT_EQ(got.size(), static_cast<std::size_t>(want.numel()));
    nan_values += expect_same_bits(t.name, got.data(), want.f32(), got.size());
    // Any row range is the same slice.
    const std::int64_t rows = t.n_rows();
    const std::vector<float> mid = dequantize_rows(t, 1, rows - 2);
    ASSERT_EQ(mid.size(), static_cast<std::size_t>((rows - 2) * t.row_length()));
    EXPECT_EQ(std::memcmp(mid.data(), got.data() + t.row_length(), mid.size() * sizeof(float)), 0);
    types_seen.push_back(t.type_name());
  }
  EXPECT_GT(nan_values, 0) << "the F16 / BF16 / F32 fixtures carry NaNs";
  EXPECT_EQ(types_seen, (std::vector<std::string>{"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K",
                                                  "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "Q8_0"}));
  EXPECT_EQ(f.tensor("q8_0_3d").dims, (std::vector<std::int64_t>{64, 3, 2}));
}

// The metadata gguf-py's writer put in the fixture reads back as written.
TEST(Gguf, MetadataWrittenByGgufPyReadsBack) {
  const GgufFile f = GgufFile::read(std::string(HLM_SOURCE_DIR) + "/tests/data/gguf/quants.gguf");
  EXPECT_EQ(f.get_int("test.u8"), 200);
  EXPECT_EQ(f.get_int("test.i8"), -100);
  EXPECT_EQ(f.get_int("test.u16"), 60000);
  EXPECT_EQ(f.get_int("test.i16"), -30000);
  EXPECT_EQ(f.get_int("test.u32"), 4000000000);
  EXPECT_EQ(f.get_int("test.i32"), -2000000000);
  EXPECT_EQ(f.get_float("test.f32"), static_cast<double>(0.1f));
  EXPECT_TRUE(f.get_bool("test.bool_true"));
  EXPECT_FALSE(f.get_bool("test.bool_false"));
  EXPECT_EQ(f.get_string("test.string"), "h\xc3\xa9llo \xe2\x9c\x93 \xe6\x97\xa5\xe6\x9c\xac");
  EXPECT_EQ(f.value("test.u64").type, VT::UINT64);
  EXPECT_EQ(f.value("test.u64").uint_value, (1ull << 63) + 5);
  EXPECT_EQ(f.get_int("test.i64"), -(1ll << 62) - 7);
  EXPECT_EQ(f.get_float("test.f64"), 0.1);
  EXPECT_EQ(f.get_int_array("test.array_u8"), (std::vector<std::int64_t>{0, 7, 255}));
  EXPECT_EQ(f.get_int_array("test.array_i16"), (std::vector<std::int64_t>{-32768, 0, 32767}));
  EXPECT_EQ(f.get_int_array("test.array_u32"), (std::vector<std::int64_t>{1, 4000000000}));
  EXPECT_EQ(f.get_int_array("test.array_i64"), (std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(),
                                                                          std::numeric_limits<std::int64_t>::max()}));
  EXPECT_EQ(f.get_float_array("test.array_f32"), (std::vector<float>{0.5f, -1.25f, 3.0e38f}));
  EXPECT_EQ(f.get_float_array("test.array_f64"), (std::vector<float>{0.1f, -2.5f}));
  EXPECT_EQ(f.value("test.array_bool").elem_bytes, (std::vector<std::uint8_t>{1, 0, 1}));
  EXPECT_EQ(f.get_string_array("test.array_string"),
            (std::vector<std::string>{"a", "", "\xc3\xbc\xc3\x9f", "two words"}));
  const GgufValue& nested = f.value("test.array_nested");
  ASSERT_EQ(nested.arrays.size(), 2u);
  EXPECT_EQ(nested.arrays[0].count, 3u);
  EXPECT_EQ(nested.arrays[1].count, 1u);
  EXPECT_EQ(nested.type_name(), "ARRAY[ARRAY[INT32]]");
}

// Opt-in: HLM_GGUF_FILE=path/to/model.gguf parses a released file, lists it, and dequantizes the last row of every
// tensor; with HLM_GGUF_EXPECTED (tools/gguf_check/dequantize_released.py) the first rows must equal gguf-py's bits.
TEST(Gguf, ReleasedFileFromEnvironment) {
  const char* path = std::getenv("HLM_GGUF_FILE");
  if (!path) GTEST_SKIP() << "set HLM_GGUF_FILE to a .gguf file";
  const GgufFile f = GgufFile::read(path);
  if (const char* expected_path = std::getenv("HLM_GGUF_EXPECTED")) {
    const SafeTensorsFile expected = SafeTensorsFile::read(expected_path);
    std::size_t values = 0;
    for (const SafeTensor& want : expected.tensors()) {
      const GgufTensor& t = f.tensor(want.name);
      const std::vector<float> got = dequantize_rows(t, 0, want.shape[0]);
      ASSERT_EQ(got.size(), static_cast<std::size_t>(want.numel())) << want.name;
      expect_same_bits(want.name, got.data(), want.f32(), got.size());
      values += got.size();
    }
    std::printf("%zu values of %zu tensors equal gguf-py's bit for bit\n", values, expected.tensors().size());
  }
  std::printf("%s: GGUF v%u, alignment %llu, %zu keys, %zu tensors\n", path, f.version(),
              static_cast<unsigned long long>(f.alignment()), f.metadata().size(), f.tensors().size());
  for (const GgufKeyValue& kv : f.metadata()) {
    std::string shown;
    const GgufValue& v = kv.value;
    if (v.type == VT::STRING)
      shown = v.string_value.substr(0, 60);
    else if (v.type == VT::ARRAY)
      shown = std::to_string(v.count) + " elements";
    else if (v.type == VT::FLOAT32 || v.type == VT::FLOAT64)
      shown = std::to_string(v.float_value);
    else if (v.type == VT::BOOL)
      shown = v.bool_value ? "true" : "false";
    else
      shown = std::to_string(f.get_int(kv.key));
    std::printf("  %-45s %-15s %s\n", kv.key.c_str(), v.type_name().c_str(), shown.c_str());
  }
  for (const GgufTensor& t : f.tensors()) {
    std::string dims;
    for (std::int64_t d : t.dims) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    std::printf("  %-40s %-6s [%s]\n", t.name.c_str(), t.type_name(), dims.c_str());
    if (!ggml_type_info(t.type).dequantizable) continue;
    for (float x : dequantize_rows(t, t.n_rows() - 1, 1)) ASSERT_TRUE(std::isfinite(x)) << t.name;
  }
}
