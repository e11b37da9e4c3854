#!/usr/bin/env bash
# Same-sitting comparison with llama.cpp on the same weights: each model that hybridlm hands to llama.cpp
# (`hybridlm export --format hf`, then llama.cpp's own convert_hf_to_gguf.py to F32 and BF16):
#   smollm3  the attention hybrid SSSF, NoPE on F, the S window past the longest context (llama.cpp's SmolLM3
#            is full attention with NoPE on every 4th layer, so this is the one SSSF layout both compute alike)
#   bamba    the Mamba-2 hybrid MMMF (llama.cpp's granitehybrid), norm_eps 1e-5 as Bamba's export needs
# both at MODEL_SET (default: d_model 768, 12 layers of 12 heads of 64, SwiGLU 2048, vocabulary 4096 from the
# default SentencePiece BPE: 91M and 103M parameters), untrained (one step at lr 1e-9: speed does not depend on
# the weights' values).
# llama.cpp comes from bench/llama_cpp.sh (built there on first use, outside the repository); the models, their HF
# folders and GGUFs live in WORK (default $HOME/.cache/hybridlm/compare_llama), also outside.
#
# Per round, per model, per size, alternating hybridlm / llama.cpp F32 / llama.cpp BF16, each a process of its own
# under /usr/bin/time -v (peak RSS):
#   prefill of N random tokens, N in PREFILL (default "512 4096 16384 32768"):
#     hybridlm bench --ckpt RUN --prompt-tokens N --decode-tokens 0      llama-bench -p N -n 0
#   decode of DECODE_TOKENS (default 64) tokens at depth D, D in DECODE_DEPTHS (default "512 4096 16384"):
#     hybridlm bench --ckpt RUN --prompt-tokens D --decode-tokens 64     llama-bench -p 0 -n 64 -d D
#     (hybridlm's run prefills the D tokens untimed for this measure: the prefill at D is timed as its own test)
# both at THREADS (default 2) threads, hybridlm with --decode-threads THREADS too, REPS (default 1) timed runs per
# process (hybridlm --steps, llama-bench -r), hybridlm with one untimed warm-up run up to WARMUP_MAX tokens (default
# 4096; llama-bench warms up by itself). llama.cpp runs with its defaults otherwise (KV cache f16, flash attention
# as it decides); LLAMA_BENCH_EXTRA adds options (e.g. "-ctk f32 -ctv f32"). ROUNDS (default 3) repeats it all;
# MODELS (default "smollm3 bamba") and TYPES (default "f32 bf16") pick the rest; CONTEXT (default 65536) is the
# models' max_seq_len and S window. A quick run:
#   ROUNDS=1 PREFILL="512 4096" DECODE_DEPTHS="512 4096" bench/compare_llama.sh
# Writes bench/results/<date>-<HHMM>-llama-r<round>-<model>-<test>-<who>.json (+ .rss: peak RSS in KiB), <who> =
# hybridlm, llama-f32, llama-bf16, and ends with bench/tools/llama_ratios.py's table: per model and test, the median
# and range over rounds of hybridlm's tokens/s over llama.cpp's (paired per round: a shared machine's speed drifts
# within minutes) and the peak RSS of each. Run nothing else meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/release/hybridlm}
WORK=${WORK:-$HOME/.cache/hybridlm/compare_llama}
ROUNDS=${ROUNDS:-3} REPS=${REPS:-1} THREADS=${THREADS:-2} WARMUP_MAX=${WARMUP_MAX:-4096}
PREFILL=${PREFILL:-512 4096 16384 32768}
DECODE_DEPTHS=${DECODE_DEPTHS:-512 4096 16384}
DECODE_TOKENS=${DECODE_TOKENS:-64}
MODELS=${MODELS:-smollm3 bamba}
TYPES=${TYPES:-f32 bf16}
MODEL_SET=${MODEL_SET:-d_model=768 n_layers=12 n_heads=12 n_kv_heads=12 head_dim=64 d_ff=2048}
for v in ROUNDS REPS THREADS DECODE_TOKENS; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "compare_llama.sh: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
for n in $PREFILL $DECODE_DEPTHS; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "compare_llama.sh: sizes must be positive integers, got '$n'" >&2; exit 2; }
done
[ -x "$BIN" ] || { echo "compare_llama.sh: no $BIN (build the hybridlm target, or set BIN)" >&2; exit 2; }

# llama.cpp's paths (LLAMA_CPP_BIN, BENCH, LLAMA_CPP_PYTHON, LLAMA_CPP_CONVERT, LLAMA_CPP_VERSION, ...).
eval "$(bench/llama_cpp.sh build)"
[ -n "${BENCH:-}" ] || { echo "compare_llama.sh: the llama.cpp build has no llama-bench" >&2; exit 1; }

# The models' context (max_seq_len, and the S window: past every context, so S computes full attention), the same
# for quick and full runs so that both measure the same models.
CONTEXT=${CONTEXT:-65536}
for n in $PREFILL $DECODE_DEPTHS; do
  [ $((n + DECODE_TOKENS)) -le "$CONTEXT" ] ||
    { echo "compare_llama.sh: $n tokens + $DECODE_TOKENS decoded exceed CONTEXT=$CONTEXT" >&2; exit 2; }
done
sets() { local s; for s in $MODEL_SET "$@"; do printf -- '--set %s ' "$s"; done; }

# A model: its untrained run, HF export and GGUFs, made once per (model, MODEL_SET, CONTEXT).
make_model() {
  local name=$1 dir flags
  case "$name" in
    smollm3) flags="--preset swa128-nope $(sets max_seq_len=$CONTEXT window=$CONTEXT)" ;;
    bamba) flags="--preset mamba2 $(sets max_seq_len=$CONTEXT norm_eps=1e-5)" ;;
    *) echo "compare_llama.sh: unknown model '$name' (known: smollm3 bamba)" >&2; exit 2 ;;
  esac
  dir=$WORK/$name-$(echo "$flags" | sha256sum | cut -c1-12)
  if [ ! -f "$dir/run/run.json" ]; then
    echo "making $name in $dir" >&2
    # shellcheck disable=SC2086
    $BIN train $flags --steps 1 --lr 1e-9 --seq-len 64 --batch 1 --eval-every 0 --eval-batches 1 \
      --out "$dir/run" --overwrite > "$dir.train.log" 2>&1 || { cat "$dir.train.log" >&2; exit 1; }
  fi
  [ -f "$dir/hf/config.json" ] || $BIN export --ckpt "$dir/run" --format hf --out "$dir/hf" >&2
  local t
  for t in $TYPES; do
    [ -f "$dir/model-$t.gguf" ] && continue
    "$LLAMA_CPP_PYTHON" "$LLAMA_CPP_CONVERT" "$dir/hf" --outtype "$t" --outfile "$dir/model-$t.gguf.partial" \
      > "$dir/convert-$t.log" 2>&1 || { cat "$dir/convert-$t.log" >&2; exit 1; }
    mv "$dir/model-$t.gguf.partial" "$dir/model-$t.gguf"
  done
  echo "$dir"
}

# Runs a command under /usr/bin/time -v: its stdout to $1.json, its peak RSS (KiB) to $1.rss.
timed() {
  local base=$1
  shift
  if /usr/bin/time -v -o "$base.time" "$@" > "$base.json" 2> "$base.log"; then
    sed -n 's/.*Maximum resident set size (kbytes): //p' "$base.time" > "$base.rss"
    rm -f "$base.time" "$base.log"
  else
    echo "failed: $* (see $base.log)" >&2
    rm -f "$base.json" "$base.time"
  fi
}

mkdir -p bench/results "$WORK"
d=$(date +%Y-%m-%d-%H%M)
declare -A model_dir
for m in $MODELS; do model_dir[$m]=$(make_model "$m"); done
tests=()
for n in $PREFILL; do tests+=("pp$n"); done
for n in $DECODE_DEPTHS; do tests+=("tg$DECODE_TOKENS@d$n"); done
echo "llama.cpp: $LLAMA_CPP_VERSION; hybridlm: $($BIN --version 2>&1 | head -1); threads $THREADS" >&2

for r in $(seq "$ROUNDS"); do
  echo "round $r of $ROUNDS" >&2
  for m in $MODELS; do
    dir=${model_dir[$m]}
    for test in "${tests[@]}"; do
      out="bench/results/$d-llama-r$r-$m-${test/@/-}"
      if [[ "$test" == pp* ]]; then
        n=${test#pp} decode=0 llama=(-p "$n" -n 0)
      else
        n=${test#*@d} decode=$DECODE_TOKENS llama=(-p 0 -n "$DECODE_TOKENS" -d "$n")
      fi
      warm=0
      [ "$n" -le "$WARMUP_MAX" ] && warm=1
      timed "$out-hybridlm" $BIN bench --ckpt "$dir/run" --prompt-tokens "$n" --decode-tokens "$decode" \
        --threads "$THREADS" --decode-threads "$THREADS" --steps "$REPS" --warmup "$warm" --json
      for t in $TYPES; do
        # shellcheck disable=SC2086
        timed "$out-llama-$t" "$BENCH" -m "$dir/model-$t.gguf" -t "$THREADS" "${llama[@]}" -r "$REPS" -o json \
          ${LLAMA_BENCH_EXTRA:-}
      done
      python3 bench/tools/llama_ratios.py --line "$out" "$m $test"
    done
  done
done
python3 bench/tools/llama_ratios.py "bench/results/$d-llama" "$ROUNDS" "$MODELS" "${tests[@]}"
