#pragma once
// The matmul precision of the engine (`--precision`), process-wide like oneDNN's own default math mode.
//   fp32: every product in fp32 (dnnl_sgemm).
//   bf16: the dense layers' matmuls (ops::linear_forward / linear_backward: every projection, the SwiGLU MLP) and
//         the LM head round both operands to bfloat16 and accumulate in fp32 (ops/matmul_bf16.h); their outputs,
//         the weights (the master copy), the gradients, the optimizer state and every other op (norms, softmax,
//         the scans' states) stay fp32; where the CPU has AVX512_BF16, the attention kernels' products (QK^T, PV and
//         the backward's five) and the chunked scans' small products run in bf16 too (ops/bf16_pairs.h).
//         Mixed precision as in PyTorch's CPU autocast, without a loss scale: bf16 has fp32's exponent range.
// docs/precision.md has the error analysis and the measurements.
#include <string>

namespace hlm::ops {

enum class Precision { fp32, bf16 };

// "fp32" | "bf16"; anything else throws hlm::Error naming `where`.
Precision parse_precision(const std::string& name, const std::string& where);
const char* precision_name(Precision p);

// "" when this CPU multiplies bf16 natively (AVX512_BF16 or AMX-BF16, as oneDNN sees it: ONEDNN_MAX_CPU_ISA caps
// it); otherwise one sentence saying what is missing and what oneDNN found.
std::string bf16_native_missing();
// Whether oneDNN runs bf16 matmuls on this CPU at all (natively or emulated with AVX-512; not on AVX2 alone).
bool bf16_matmul_available();

// Throws hlm::Error ("--precision bf16: <what is missing>; use --precision fp32") where `p` is bf16 and the CPU
// lacks native bf16; `where` prefixes the message (e.g. a run.json field).
void require_supported(Precision p, const std::string& where = "--precision bf16");

// Sets the process's precision. bf16 throws hlm::Error with bf16_native_missing() where the CPU lacks native bf16,
// unless allow_emulated (tests: the same numbers, emulated, on AVX-512 CPUs without AVX512_BF16).
void set_precision(Precision p, bool allow_emulated = false);
Precision precision();

// Sets a precision for a scope and restores the previous one.
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p, bool allow_emulated = false) : saved_(precision()) {
    set_precision(p, allow_emulated);
  }
  ~PrecisionScope() { set_precision(saved_, true); }
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision saved_;
};

}  // namespace hlm::ops
