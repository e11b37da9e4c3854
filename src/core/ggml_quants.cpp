// ggml block formats decoded to fp32. Every formula is ggml's reference dequantizer's, with its operations in
// its order: `d * q - m` is a rounded product then a rounded difference (this file is compiled with
// -ffp-contract=off so that no compiler fuses them), which keeps the results bit-identical to gguf-py's and
// llama.cpp's. Multi-byte fields are little-endian; loads go through memcpy (blocks have no alignment).
#include "core/ggml_quants.h"

#include <bit>
#include <cstring>

#include "core/error.h"

namespace hlm {

static_assert(std::endian::native == std::endian::little, "the GGUF decoders read little-endian fields in place");

namespace {

// name, values per block, bytes per block, decodable. Sizes from ggml's type traits (gguf-py GGML_QUANT_SIZES).
constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, true},
    {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 18, true},
    {GgmlType::Q4_1, "Q4_1", 32, 20, true},
    {GgmlType::Q5_0, "Q5_0", 32, 22, true},
    {GgmlType::Q5_1, "Q5_1", 32, 24, true},
    {GgmlType::Q8_0, "Q8_0", 32, 34, true},
    {GgmlType::Q8_1, "Q8_1", 32, 40, false},
    {GgmlType::Q2_K, "Q2_K", 256, 84, true},
    {GgmlType::Q3_K, "Q3_K", 256, 110, true},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true},
    {GgmlType::Q5_K, "Q5_K", 256, 176, true},
    {GgmlType::Q6_K, "Q6_K", 256, 210, true},
    {GgmlType::Q8_K, "Q8_K", 256, 292, true},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, false},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, false},
    {GgmlType::IQ1_S, "IQ1_S", 256, 50, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, false},
    {GgmlType::IQ3_S, "IQ3_S", 256, 110, false},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82, false},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 136, false},
    {GgmlType::I8, "I8", 1, 1, false},
    {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, false},
    {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, false},
    {GgmlType::IQ1_M, "IQ1_M", 256, 56, false},
    {GgmlType::BF16, "BF16", 1, 2, true},
    {GgmlType::TQ1_0, "TQ1_0", 256, 54, false},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66, false},
    {GgmlType::MXFP4, "MXFP4", 32, 17, false},
    {GgmlType::NVFP4, "NVFP4", 64, 36, false},
    {GgmlType::Q1_0, "Q1_0", 128, 18, false},
};

constexpr int kQK = 256;  // values per K-quant super-block

std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
std::uint32_t load_u32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float load_f16(const std::uint8_t* p) { return fp16_to_fp32(load_u16(p)); }
float load_f32(const std::uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_0, 18 bytes / 32 values: f16 d, 16 bytes of nibbles. Value j (j < 16) is the low nibble of byte j,
// value j + 16 its high nibble; y = (q - 8) * d.
void q4_0(const std::uint8_t* b, float* y) {
  const float d = load_f16(b);
  const std::uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1, 20 bytes / 32 values: f16 d, f16 m, 16 bytes of nibbles (as Q4_0); y = q * d + m.
void q4_1(const std::uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const std::uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0, 22 bytes / 32 values: f16 d, u32 qh (bit i is the fifth bit of value i), 16 bytes of nibbles (as Q4_0);
// y = (q - 16) * d.
void q5_0(const std::uint8_t* b, float* y) {
  const float d = load_f16(b);
  const std::uint32_t qh = load_u32(b + 2);
  const std::uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

// Q5_1, 24 bytes / 32 values: f16 d, f16 m, u32 qh, 16 bytes of nibbles (as Q5_0); y = q * d + m.
void q5_1(const std::uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const std::uint32_t qh = load_u32(b + 4);
  const std::uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

// Q8_0, 34 bytes / 32 values: f16 d, 32 int8 q; y = q * d.
void q8_0(const std::uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<std::int8_t>(b[2 + j])) * d;
}

// Q2_K, 84 bytes / 256 values: 16 scale bytes (low nibble: scale, high nibble: min, one per 16 values), 64 bytes
// of 2-bit q, f16 d, f16 dmin. Each 128-value half reads 32 q bytes four times (shifts 0, 2, 4, 6), 32 values per
// shift; y = (d * scale) * q - (dmin * min).
void q2_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* scales = b;
  const std::uint8_t* qs = b + 16;
  const float d = load_f16(b + 80);
  const float dmin = load_f16(b + 82);
  int is = 0;
  for (int half = 0; half < 2; ++half, qs += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int group = 0; group < 2; ++group, ++is) {
        const float dl = d * static_cast<float>(scales[is] & 0x0F);
        const float ml = dmin * static_cast<float>(scales[is] >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((qs[group * 16 + l] >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K, 110 bytes / 256 values: 32 bytes hmask, 64 bytes of 2-bit q, 12 bytes of 6-bit scales, f16 d. Value
// e = 128 * half + 32 * s + l takes bits 2s..2s+1 of qs[32 * half + l] and, as a subtracted 4 when clear, bit
// 4 * half + s of hmask[l]. Scale i (one per 16 values): low 4 bits from the nibble of byte i % 8 (low for
// i < 8, high after), high 2 bits from byte 8 + i % 4 at bit 2 * (i / 4); minus 32. y = (d * scale) * q.
void q3_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* hmask = b;
  const std::uint8_t* qs = b + 32;
  const std::uint8_t* sc = b + 96;
  const float d = load_f16(b + 108);
  int scale[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? (sc[i] & 0x0F) : (sc[i - 8] >> 4);
    const int high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    scale[i] = (low | (high << 4)) - 32;
  }
  for (int half = 0; half < 2; ++half) {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) {
        const int e = 128 * half + 32 * s + l;
        const int q = ((qs[32 * half + l] >> (2 * s)) & 3) - (((hmask[l] >> (4 * half + s)) & 1) ? 0 : 4);
        const float dl = d * static_cast<float>(scale[e / 16]);
        y[e] = dl * static_cast<float>(q);
      }
    }
  }
}

// The 6-bit scale and min of sub-block j (of 8) in the 12 scale bytes of Q4_K and Q5_K: j < 4 uses the low 6 bits
// of bytes j and j + 4; j >= 4 takes a nibble of byte j + 4 (low: scale, high: min) and the top 2 bits of bytes
// j - 4 (scale) and j (min).
void scale_min_k4(int j, const std::uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The factors of Q4_K's and Q5_K's 8 sub-blocks, from the block's f16 d and dmin (bytes 0-3) and its 12 scale
// bytes (4-15): y = scale[sub] * q - min[sub].
void k4_factors(const std::uint8_t* b, float* scale, float* min) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  for (int sub = 0; sub < 8; ++sub) {
    int sc = 0, mn = 0;
    scale_min_k4(sub, b + 4, &sc, &mn);
    scale[sub] = d * static_cast<float>(sc);
    min[sub] = dmin * static_cast<float>(mn);
  }
}

// Q4_K, 144 bytes / 256 values: f16 d, f16 dmin, 12 scale bytes (8 sub-blocks of 32), 128 bytes of nibbles. Each
// 64 values read 32 bytes: low nibbles for sub-block 2k, high for 2k + 1. y = (d * scale) * q - (dmin * min).
void q4_k(const std::uint8_t* b, float* y) {
  float scale[8], min[8];
  k4_factors(b, scale, min);
  const std::uint8_t* qs = b + 16;
  for (int sub = 0; sub < 8; ++sub) {
    const std::uint8_t* q = qs + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int l = 0; l < 32; ++l) *y++ = scale[sub] * static_cast<float>((q[l] >> shift) & 0x0F) - min[sub];
  }
}

// Q5_K, 176 bytes / 256 values: f16 d, f16 dmin, 12 scale bytes, 32 bytes qh (bit `sub` of qh[l] is the fifth bit
// of value l of sub-block `sub`), 128 bytes of nibbles (as Q4_K). y = (d * scale) * q - (dmin * min).
void q5_k(const std::uint8_t* b, float* y) {
  float scale[8], min[8];
  k4_factors(b, scale, min);
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* qs = b + 48;
  for (int sub = 0; sub < 8; ++sub) {
    const std::uint8_t* q = qs + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0F) | (((qh[l] >> sub) & 1) << 4);
      *y++ = scale[sub] * static_cast<float>(v) - min[sub];
    }
  }
}

// Q6_K, 210 bytes / 256 values: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales (one per 16
// values), f16 d. Each 128-value half reads 64 ql and 32 qh bytes: value 32 * k + l (k < 4, l < 32) takes the low
// (k < 2) or high nibble of ql[l + 32 * (k % 2)] and bits 2k..2k+1 of qh[l]; q - 32. y = (d * scale) * q.
void q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const std::uint8_t* sc = b + 192;
  const float d = load_f16(b + 208);
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const int low = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0F;
        const int q = (low | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        const float dl = d * static_cast<float>(static_cast<std::int8_t>(sc[l / 16 + 2 * k]));
        y[32 * k + l] = dl * static_cast<float>(q);
      }
    }
  }
}

// Q8_K, 292 bytes / 256 values: f32 d, 256 int8 q, 16 int16 block sums (unused here); y = d * q.
void q8_k(const std::uint8_t* b, float* y) {
  const float d = load_f32(b);
  for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(static_cast<std::int8_t>(b[4 + j]));
}

using BlockDecoder = void (*)(const std::uint8_t*, float*);

BlockDecoder block_decoder(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
      return q4_0;
    case GgmlType::Q4_1:
      return q4_1;
    case GgmlType::Q5_0:
      return q5_0;
    case GgmlType::Q5_1:
      return q5_1;
    case GgmlType::Q8_0:
      return q8_0;
    case GgmlType::Q2_K:
      return q2_k;
    case GgmlType::Q3_K:
      return q3_k;
    case GgmlType::Q4_K:
      return q4_k;
    case GgmlType::Q5_K:
      return q5_k;
    case GgmlType::Q6_K:
      return q6_k;
    case GgmlType::Q8_K:
      return q8_k;
    default:
      return nullptr;
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(std::uint32_t code) {
  for (const GgmlTypeInfo& t : kTypes)
    if (static_cast<std::uint32_t>(t.type) == code) return &t;
  return nullptr;
}

const GgmlTypeInfo& ggml_type_info(GgmlType type) {
  const GgmlTypeInfo* t = ggml_type_info(static_cast<std::uint32_t>(type));
  HLM_CHECK(t, "ggml_type_info: {} is not a ggml type", static_cast<std::uint32_t>(type));
  return *t;
}

std::string ggml_dequantizable_type_names() {
  std::string s;
  for (const GgmlTypeInfo& t : kTypes)
    if (t.dequantizable) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

float fp16_to_fp32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  const std::uint32_t bits = exp == 0x1F ? (sign | 0x7F800000u | (mant << 13))  // inf, NaN
                                         : (sign | ((exp + 112) << 23) | (mant << 13));
  return std::bit_cast<float>(bits);
}

float bf16_to_fp32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

void ggml_dequantize(GgmlType type, const void* src, std::int64_t n_values, float* dst) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  if (!info.dequantizable)
    fail("ggml_dequantize: type {} cannot be dequantized (supported: {})", info.name, ggml_dequantizable_type_names());
  HLM_CHECK(n_values >= 0 && n_values % info.block_values == 0,
            "ggml_dequantize: {} values of type {} are not a whole number of {}-value blocks", n_values, info.name,
            info.block_values);
  const auto* p = static_cast<const std::uint8_t*>(src);
  switch (type) {
    case GgmlType::F32:
      if (n_values) std::memcpy(dst, p, static_cast<std::size_t>(n_values) * 4);
      return;
    case GgmlType::F16:
      for (std::int64_t i = 0; i < n_values; ++i) dst[i] = load_f16(p + 2 * i);
      return;
    case GgmlType::BF16:
      for (std::int64_t i = 0; i < n_values; ++i) dst[i] = bf16_to_fp32(load_u16(p + 2 * i));
      return;
    default:
      break;
  }
  const BlockDecoder decode = block_decoder(type);
  const std::int64_t n_blocks = n_values / info.block_values;
  for (std::int64_t i = 0; i < n_blocks; ++i) decode(p + i * info.block_bytes, dst + i * info.block_values);
}

}  // namespace hlm
