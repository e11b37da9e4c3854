#!/usr/bin/env bash
# Reproduces docs/results-probes.md with one command: trains three small SSSF hybrids (swa128 and swa128-nope
# with their SWA window cut to 8, and swa128 itself, whose window covers the whole 128-token row) on NIAH rows
# (noise haystack) with checkpoints along the way, then runs the mechanism probes (NIAH, receptive-field
# restriction, retrieval heads on the final checkpoint and over the checkpoints, one attention map) and writes
# the tables to $OUT/summary.md, the SVGs beside it.
#
#   scripts/demo_probes.sh                                   # the documented runs (STEPS=1500)
#   STEPS=30 CKPT_EVERY=10 SAMPLES=1 scripts/demo_probes.sh   # a smoke run of the whole pipeline
#
# Environment (all optional):
#   STEPS       optimizer steps per run (1500)       CKPT_EVERY  checkpoint + NIAH-eval interval (STEPS/15)
#   RUNS        name:preset:window entries ("swa128:swa128:128 swa8:swa128:8 swa8-nope:swa128-nope:8")
#   PARALLEL    trainings at once (2; each then gets THREADS=1)   THREADS  OpenMP threads per process
#   OUT         output folder (runs/demo-probes)     BIN  hybridlm binary (build/release/hybridlm, built if missing)
#   SPANS       receptive-field spans ("4 16")       SAMPLES  NIAH needles per depth in the probes (4)
#   INIT_SCALE  the model's init_scale: N(0, 0.02 * INIT_SCALE) weights (3)
#   EXTRA       more train flags for every run, e.g. "--set layer_types.F.qk_norm=true"
#   TRAIN_ONLY  stop after training           SUMMARY_ONLY  only rewrite summary.md from the probe outputs
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-1500}
CKPT_EVERY=${CKPT_EVERY:-$(( STEPS / 15 > 0 ? STEPS / 15 : 1 ))}
# name:preset:window (window overrides the preset's SWA window; see docs/results-probes.md for why 8)
RUNS=${RUNS:-"swa128:swa128:128 swa8:swa128:8 swa8-nope:swa128-nope:8"}
PARALLEL=${PARALLEL:-2}
THREADS=${THREADS:-$(( PARALLEL > 1 ? 1 : 0 ))}
OUT=${OUT:-runs/demo-probes}
BIN=${BIN:-build/release/hybridlm}
SPANS=${SPANS:-"4 16"}
SAMPLES=${SAMPLES:-4}
INIT_SCALE=${INIT_SCALE:-3}

if [[ ! -x "$BIN" ]]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target hybridlm
fi
mkdir -p "$OUT"

# The recipe (docs/results-probes.md explains each choice): the presets' SSSF pattern at d_model 128, 4 heads
# of 32; rows of 128 tokens that are all NIAH prompts + answers on the noise haystack.
MODEL=(--set d_model=128 --set n_layers=4 --set d_ff=384 --set n_heads=4 --set n_kv_heads=4 --set head_dim=32)
RECIPE=(--data default --seq-len 128 --batch 16 --lr 3e-3 --warmup 30 --mix-niah 1.0 --mix-haystack noise)
EVAL=(--eval niah --eval-every "$CKPT_EVERY" --eval-batches 2 --ckpt-every "$CKPT_EVERY" --keep-checkpoints 0
      --log-every 25)

# With the 0.02 init the copy circuit stays on its plateau for the whole budget; init_scale 3 (as in the
# engine's own trained tests) gets it off.
train_one() {
  local name preset window dir t0
  IFS=: read -r name preset window <<<"$1"
  dir="$OUT/$name"
  if [[ -f "$dir/train.json" ]]; then echo "train $name: done already ($dir/train.json)"; return; fi
  rm -rf "$dir"
  t0=$SECONDS
  "$BIN" train --preset "$preset" "${MODEL[@]}" --set window="$window" --set init_scale="$INIT_SCALE" "${RECIPE[@]}" ${EXTRA:-} \
    --steps "$STEPS" "${EVAL[@]}" --threads "$THREADS" --out "$dir" --json \
    >"$OUT/$name.train.json.tmp" 2>"$OUT/$name.train.log"
  echo "{\"wall_s\": $(( SECONDS - t0 )), \"threads\": $THREADS, \"parallel\": $PARALLEL}" >"$dir/wall.json"
  mv "$OUT/$name.train.json.tmp" "$dir/train.json"
  echo "train $name: $(( SECONDS - t0 )) s"
}

# 1. Training, PARALLEL at a time.
running=0
for r in $RUNS; do
  train_one "$r" &
  running=$(( running + 1 ))
  if (( running >= PARALLEL )); then wait -n; running=$(( running - 1 )); fi
done
wait
[[ -n "${TRAIN_ONLY:-}" ]] && exit 0
NAMES=$(for r in $RUNS; do echo "${r%%:*}"; done)
first=$(echo $NAMES | cut -d" " -f1)
# The needle values' digits the runs were trained with (train --niah-digits, stored in run.json; eval niah and
# the probes read it themselves): the NIAH text and the attention-map prompt below use the same.
DIGITS=$(python3 -c "import json; print(json.load(open('$OUT/$first/run.json'))['train'].get('niah_digits', 7))")

# 2. Probes on each run (one process at a time). SUMMARY_ONLY=1 skips to the tables.
if [[ -z "${SUMMARY_ONLY:-}" ]]; then
# NIAH rows as plain text (4000 documents back to back in one file; its last 2% is the validation split):
# the models are trained on NIAH rows only, so loss on the corpus says little; receptive-field also
# measures the loss on this text (--data). Tokenised as a whole, not piece by piece as the engine's rows are.
mkdir -p "$OUT/niah-text"
NIAH_TEXT="$OUT/niah-text/niah.txt"
(( DIGITS == 7 )) || NIAH_TEXT="$OUT/niah-text/niah-d$DIGITS.txt"  # 7 digits keeps the documented file name
[[ -f "$NIAH_TEXT" ]] || python3 - "$NIAH_TEXT" 5 4000 "$DIGITS" <<'PY'
import random, sys
# NIAH documents as plain text, in the format of the engine's NIAH rows (data/niah_task.cpp, train/niah_mix.cpp):
# prefix, noise haystack with the needle at a uniform depth, question, answer; one file, documents back to back.
adj = "amber brave calm dusty eager fancy gentle hollow icy jolly kind lucky mellow noble odd proud quiet rapid silver tidy upbeat vivid witty young zesty bold crisp daring early fuzzy grand humble".split()
noun = "apple bridge castle dragon engine forest garden harbor island jacket kettle lantern meadow needle orchard pepper quarry river saddle tunnel umbrella valley window yacht zebra basket candle desert falcon glacier hammer insect".split()
noise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
rng = random.Random(int(sys.argv[2]))
words = (noise * 4).split(" ")
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[3])):
        key = rng.choice(adj) + "-" + rng.choice(noun)
        value = str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(int(sys.argv[4]) - 1))
        hay = words[:36]  # ~70 tokens of noise, like a 128-token training row
        at = rng.randint(0, len(hay))
        f.write("A special magic number is hidden in the following text. Remember it.\n" + " ".join(hay[:at]) +
                f"\nThe special magic number for {key} is: {value}.\n" + " ".join(hay[at:]) +
                f"\nWhat is the special magic number for {key}? The special magic number for {key} is: {value}.\n")
PY
PT=$(( THREADS > 0 ? THREADS * PARALLEL : 0 ))
for p in $NAMES; do
  dir="$OUT/$p"
  echo "eval niah $p (final checkpoint)"
  "$BIN" eval niah --ckpt "$dir" --haystack noise --depths 0.1,0.5,0.9 --samples "$SAMPLES" --threads "$PT" --json \
    >"$OUT/$p.niah.json"
  for s in $SPANS; do
    echo "probe receptive-field $p span $s"
    "$BIN" probe receptive-field --ckpt "$dir" --restrict "full;efficient" --span "$s" --samples "$SAMPLES" \
      --max-tokens 16384 --threads "$PT" --json --plot "$OUT/$p.rf$s.svg" >"$OUT/$p.rf$s.json"
  done
  echo "probe receptive-field $p span 4 on NIAH text"
  "$BIN" probe receptive-field --ckpt "$dir" --data "$NIAH_TEXT" --restrict "full;efficient" --span 4 \
    --samples 1 --max-tokens 16384 --threads "$PT" --json --plot "$OUT/$p.rf4-niahtext.svg" >"$OUT/$p.rf4-niahtext.json"
  echo "probe retrieval-heads $p (final checkpoint)"
  "$BIN" probe retrieval-heads --ckpt "$dir" --samples 4 --threads "$PT" --json --plot "$OUT/$p.heads.svg" \
    >"$OUT/$p.heads.json"
  echo "probe retrieval-heads $p --over-checkpoints"
  "$BIN" probe retrieval-heads --over-checkpoints "$dir" --samples 2 --threads "$PT" --json \
    --plot "$OUT/$p.heads-over.svg" >"$OUT/$p.heads-over.json"
done

# 3. One attention map (43 tokens, so the SVG stays ~120 KB): the first run's head with the highest retrieval
# score reading a needle sentence twice.
read -r layer head < <(python3 -c "
import json
s = json.load(open('$OUT/$first.heads.json'))['scores']
print(*max(((l, h) for l in range(len(s)) for h in range(len(s[l])) if s[l][h] is not None), key=lambda x: s[x[0]][x[1]]))")
value=$(python3 -c "print(('4817263' * 8)[:$DIGITS])")
prompt="The special magic number for calm-river is: $value."$'\n'"The special magic number for calm-river is: $value"
"$BIN" probe attention-map --ckpt "$OUT/$first" --prompt "$prompt" --layer "$layer" --head "$head" --threads "$PT" \
  --plot "$OUT/$first.attn-L${layer}H$head.svg"
fi

# 4. Summary tables.
OUT="$OUT" PRESETS="$NAMES" SPANS="$SPANS" python3 - <<'EOF'
import json, os, re
out, presets, spans = os.environ["OUT"], os.environ["PRESETS"].split(), os.environ["SPANS"].split()
L = []
L.append("## NIAH accuracy during training (6 needles: depths 0.1/0.5/0.9 x 2, length = training length)\n")
steps, acc = None, {}
for p in presets:
    rows = [json.loads(l) for l in open(f"{out}/{p}/metrics.jsonl")]
    ev = [r for r in rows if "niah_accuracy" in r]
    acc[p] = {r["step"]: (r["niah_accuracy"], r["val_loss"]) for r in ev}
    steps = sorted(acc[p]) if steps is None else steps
L.append("| step | " + " | ".join(f"{p} NIAH (val loss)" for p in presets) + " |")
L.append("|---" * (len(presets) + 1) + "|")
for s in steps:
    L.append(f"| {s} | " + " | ".join(
        f"{acc[p][s][0]:.2f} ({acc[p][s][1]:.2f})" if s in acc[p] else "-" for p in presets) + " |")
L.append("\n## Wall time\n")
L.append("| run | steps | wall (s) | threads | trainings in parallel | params |")
L.append("|---|---|---|---|---|---|")
for p in presets:
    w, t = json.load(open(f"{out}/{p}/wall.json")), json.load(open(f"{out}/{p}/train.json"))
    L.append(f"| {p} | {t['steps']} | {w['wall_s']} | {w['threads']} | {w['parallel']} | {t['params']} |")
L.append("\n## NIAH on the final checkpoint (noise haystack, depths 0.1/0.5/0.9, length = training length)\n")
L.append("| run | exact match | digits right (position-wise) | predictions (first 4) |")
L.append("|---|---|---|---|")
for p in presets:
    r = json.load(open(f"{out}/{p}.niah.json"))
    right = total = 0
    for c in r["cases"]:
        got = re.findall(r"\d+", c["prediction"])
        got = got[0] if got else ""
        right += sum(a == b for a, b in zip(got, c["value"]))
        total += len(c["value"])
    ex = ", ".join(f"{c['prediction'].strip()[:9]!r} for {c['value']}" for c in r["cases"][:4])
    L.append(f"| {p} | {r['mean']:.2f} | {right / total:.3f} (chance 0.1) | {ex} |")
L.append("\n## Receptive-field restriction (loss on validation text; NIAH on noise haystack at the training length)\n")
L.append("| run | span | restrict | layers | loss | delta loss | NIAH | delta NIAH | NIAH by depth |")
L.append("|---|---|---|---|---|---|---|---|---|")
for p in presets:
    for s in spans:
        r = json.load(open(f"{out}/{p}.rf{s}.json"))
        for row in r["rows"]:
            by_depth = " / ".join(f"{d}: {g[0]:.2f}" for d, g in zip(r["niah_depths"], row["niah_grid"]))
            L.append(f"| {p} | {s} | {row['restrict']} | {row['layers']} | {row['loss']:.3f} | {row['delta_loss']:+.3f} "
                     f"| {row['niah_accuracy']:.2f} | {row['delta_niah']:+.2f} | {by_depth} |")
L.append("\n## Receptive-field restriction, loss on NIAH text (span 4; NIAH column as above, 1 needle per depth)\n")
L.append("| run | restrict | layers | loss | delta loss | NIAH |")
L.append("|---|---|---|---|---|---|")
for p in presets:
    fn = f"{out}/{p}.rf4-niahtext.json"
    if not os.path.exists(fn):
        continue
    for row in json.load(open(fn))["rows"]:
        L.append(f"| {p} | {row['restrict']} | {row['layers']} | {row['loss']:.3f} | {row['delta_loss']:+.3f} | {row['niah_accuracy']:.2f} |")
L.append("\n## Retrieval heads on the final checkpoint (score > 0.1)\n")
L.append("| run | NIAH (probe) | kept cases | heads | scores [layer][head] |")
L.append("|---|---|---|---|---|")
for p in presets:
    h = json.load(open(f"{out}/{p}.heads.json"))
    heads = ", ".join(f"L{x['layer']}H{x['head']} ({x['type']}) {x['score']:.2f}" for x in h["retrieval_heads"]) or "none"
    sc = "; ".join("[" + ", ".join("-" if v is None else f"{v:.2f}" for v in row) + "]" for row in h["scores"])
    L.append(f"| {p} | {h['niah_accuracy']:.2f} | {h['kept']}/{h['cases']} | {heads} | {sc} |")
L.append("\n## Retrieval heads over training (number of heads with score > 0.1: all attention layers / full-attention layer)\n")
over = {p: {c["step"]: c for c in json.load(open(f"{out}/{p}.heads-over.json"))["checkpoints"]} for p in presets}
steps = sorted(set().union(*[set(o) for o in over.values()]))
L.append("| step | " + " | ".join(f"{p}: heads all/F (NIAH, kept)" for p in presets) + " |")
L.append("|---" * (len(presets) + 1) + "|")
for s in steps:
    cells = []
    for p in presets:
        c = over[p].get(s)
        cells.append("-" if c is None else
                     f"{c['n_retrieval_heads']}/{c['n_retrieval_heads_full']} ({c['niah_accuracy']:.2f}, kept {c['kept']}/{c['cases']})")
    L.append(f"| {s} | " + " | ".join(cells) + " |")
open(f"{out}/summary.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
echo "wrote $OUT/summary.md and the SVGs in $OUT/"
