#!/usr/bin/env bash
# Cross-framework check of hybridlm's Hugging Face export/import (docs/hf.md). Opt-in: `ctest --test-dir
# build/release -L hf`, or directly: tools/hf_check/run.sh [path/to/hybridlm] [--keep DIR].
# First run: creates a virtual environment with torch and transformers from PyPI (requirements.txt; about
# 5.6 GB and a few minutes), in $HLM_HF_VENV (default build/hf_check_venv), and reuses it afterwards.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
hlm=${1:-$root/build/release/hybridlm}
shift || true
venv=${HLM_HF_VENV:-$root/build/hf_check_venv}
if ! "$venv/bin/python" -c "import torch, transformers" 2>/dev/null; then
  echo "hf_check: creating $venv (torch + transformers from PyPI)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet -r "$here/requirements.txt"
fi
exec "$venv/bin/python" "$here/check.py" --hybridlm "$hlm" "$@"
