#pragma once
// ggml's tensor element types (the block formats GGUF files store weights in) and their decoding to fp32.
// A type packs `block_values` consecutive values of a row into `block_bytes` bytes; rows are whole blocks.
// The decoders follow ggml's reference dequantizers value for value (same operations in the same order,
// compiled without FMA contraction), so their output is bit-identical to gguf-py's and llama.cpp's.
// See docs/reference.md.
#include <cstdint>
#include <string>

namespace hlm {

// The numbers are ggml's (they appear in files). 4, 5, 31-33 and 36-38 were removed from ggml.
enum class GgmlType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;           // gguf-py's spelling: "F32", "Q4_K", "BF16", ...
  std::int64_t block_values;  // values per block (1 for plain element types)
  std::int64_t block_bytes;   // bytes per block
  bool dequantizable;         // ggml_dequantize decodes it
};

// The type with this number, or nullptr when ggml has no such type (or no longer has it).
const GgmlTypeInfo* ggml_type_info(std::uint32_t code);
// Same for a known type (never null).
const GgmlTypeInfo& ggml_type_info(GgmlType type);
inline const char* ggml_type_name(GgmlType type) { return ggml_type_info(type).name; }
// "F32, F16, BF16, Q4_0, ...": the types ggml_dequantize decodes, for messages and docs.
std::string ggml_dequantizable_type_names();

// Decodes `n_values` values (a whole number of blocks) from `src` (n_values / block_values × block_bytes bytes,
// any alignment) into `dst`. The type must be dequantizable; hlm::Error otherwise.
void ggml_dequantize(GgmlType type, const void* src, std::int64_t n_values, float* dst);

// IEEE half and bfloat16 to float, exact (NaN payloads kept).
float fp16_to_fp32(std::uint16_t h);
float bf16_to_fp32(std::uint16_t b);

}  // namespace hlm
