#!/usr/bin/env bash
# Opt-in check of hybridlm's tokenizers from GGUF metadata against llama.cpp and sentencepiece (docs/data.md).
#   tools/gguf_tokenizer/run.sh [path/to/hybridlm] [FILE.gguf] [compare.py options...]
# The GGUF file defaults to $HLM_GGUF. First run: a virtual environment with `gguf`, `sentencepiece` and
# `protobuf` from PyPI in $HLM_GGUF_VENV (default build/gguf_tokenizer_venv). llama-tokenize is used when on
# PATH or given as --llama-tokenize PATH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
hlm=${1:-$root/build/release/hybridlm}
gguf_file=${2:-${HLM_GGUF:-}}
shift $(( $# < 2 ? $# : 2 ))
if [[ -z "$gguf_file" ]]; then
  echo "gguf_tokenizer: no GGUF file (give it as the second argument or set HLM_GGUF)" >&2
  exit 1
fi
venv=${HLM_GGUF_VENV:-$root/build/gguf_tokenizer_venv}
if ! "$venv/bin/python" -c "import gguf, sentencepiece, google.protobuf" 2>/dev/null; then
  echo "gguf_tokenizer: creating $venv (gguf + sentencepiece + protobuf from PyPI)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet -r "$here/requirements.txt"
fi
exec "$venv/bin/python" "$here/compare.py" --gguf "$gguf_file" --hybridlm "$hlm" "$@"
