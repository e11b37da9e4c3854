#!/usr/bin/env bash
# Installs every build/run dependency from Debian packages (idempotent), then configures and builds
# the release preset. Safe to run again: apt skips what is installed, cmake rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config            # toolchain
  libdnnl-dev                                 # oneDNN: fp32 matmul (AVX-512 JIT)
  libhwy-dev                                  # Google Highway: SIMD kernels per target, run-time dispatch
  ocl-icd-opencl-dev                          # OpenCL: Debian's dnnl-config.cmake requires it; libdnnl-dev only *recommends* it
  libsentencepiece-dev sentencepiece          # BPE tokenizer
  libonig-dev libutf8proc-dev                 # Hugging Face byte-level BPE tokenizers: Oniguruma regexes, NFC
  zlib1g-dev                                  # .gz corpus files
  liblbfgs-dev                                # L-BFGS for scaling-law fits
  libopenmpi-dev openmpi-bin                  # MPI: data-parallel training under mpirun/srun (docs/distributed.md)
  nlohmann-json3-dev libcli11-dev libfmt-dev  # config/JSON, CLI, formatting
  libgtest-dev libbenchmark-dev               # tests, micro-benchmarks
  clang-14 libclang-rt-14-dev libomp-14-dev   # the asan presets: ASan/UBSan unit tests and libFuzzer targets (CI)
  llvm-14 lld-14                              # what CMake picks beside clang-14 (llvm-ar-14, ld.lld-14, ...): named, not found by chance
  python3.11-doc linux-doc-6.1                # the built-in default corpus (reST sources)
  python3                                     # bench/tools/peer_ratios.py and its test (tests/peer_ratios_test.sh)
)
if [ "${1:-}" = "--list-packages" ]; then printf '%s\n' "${PACKAGES[@]}"; exit 0; fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake --preset release >/dev/null
cmake --build --preset release
echo "setup: built build/release/hybridlm"
