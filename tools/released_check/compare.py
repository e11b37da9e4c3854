"""hybridlm against llama.cpp on the same released weights (tools/released_check/run.sh writes the inputs).

Checks, each printed as one line and all of them failing the run when off:
  weights     hybridlm's import of the Q4_K_M file equals its import of llama-quantize's F32 requantization
  tokens      the prompt's ids (with BOS) equal llama-debug's
  logits      the last position's logits: max |diff| within --logit-tol, same argmax
  generation  64 greedy tokens: hybridlm's own against llama.cpp's, and teacher-forced on llama.cpp's, where every
              step where the top tokens differ must be a near-tie within the logits' measured difference
  perplexity  of a fixed text under llama-perplexity's protocol (chunks of n_ctx tokens, BOS first, the second half
              of each chunk scored): ratio to llama-perplexity's within --ppl-tol
Numpy only (the safetensors files are read by hand)."""
import argparse
import json
import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np


def read_safetensors(path):
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dtype = {"F32": np.float32, "I32": np.int32, "F64": np.float64}[info["dtype"]]
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=dtype).reshape(info["shape"])
    return out


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"released_check: {' '.join(map(str, cmd))} failed:\n{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hybridlm", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--logit-tol", type=float, default=2e-2)
    ap.add_argument("--ppl-tol", type=float, default=1e-3)
    ap.add_argument("--json", help="write the measured numbers here")
    a = ap.parse_args()
    work, ref, hlm = Path(a.work), Path(a.ref), a.hybridlm
    ckpt = work / "run-f32"
    failures, result = [], {}

    # The quantized file dequantized by hybridlm equals llama-quantize's F32 requantization of it, byte for byte.
    weights = [work / k / "checkpoints" / "step_00000000" / "model.safetensors" for k in ("run-q4", "run-f32")]
    if weights[0].exists():
        same = weights[0].read_bytes() == weights[1].read_bytes()
        result["q4_import_equals_f32_requantization"] = same
        print(f"weights     the Q4_K_M import and the F32 file's are {'identical' if same else 'DIFFERENT'}")
        if not same:
            failures.append("weights")

    prompt_file = next((ref / "logits").glob("*-prompt.txt"))
    meta = prompt_file.read_text()
    prompt = re.search(r"^prompt: (.*)$", meta, re.M).group(1)
    want_ids = [int(x) for x in re.search(r"^token ids: (.*)$", meta, re.M).group(1).split(",")]
    got_ids = [int(x) for x in run([hlm, "tokenizer", "encode", "--tokenizer", str(ckpt / "tokenizer.gguf.json"),
                                    "--add-special", "--text", prompt]).split()]
    print(f"tokens      {'equal' if got_ids == want_ids else 'DIFFER'}: {got_ids}")
    if got_ids != want_ids:
        failures.append("tokens")

    want = np.fromfile(next(p for p in (ref / "logits").glob("*.bin") if not p.name.endswith("-tokens.bin")),
                       dtype=np.float32)
    out = work / "logits.safetensors"
    run([hlm, "logits", "--ckpt", str(ckpt), "--tokens", " ".join(map(str, want_ids)), "--last", "1",
         "--out", str(out)])
    got = read_safetensors(out)["logits"][-1]
    diff = float(np.max(np.abs(got.astype(np.float64) - want)))
    same_top = int(np.argmax(got)) == int(np.argmax(want))
    result["max_abs_logit_diff"] = diff
    result["logit_scale"] = float(np.max(np.abs(want)))
    print(f"logits      max |diff| {diff:.3g} (largest |logit| {result['logit_scale']:.3g}); argmax "
          f"{'equal' if same_top else 'DIFFERS'}")
    if not (diff <= a.logit_tol and same_top):
        failures.append("logits")

    # Greedy generation: hybridlm's own 64 tokens against llama.cpp's, and teacher-forced on llama.cpp's: at every
    # step hybridlm's top token is llama.cpp's, or the two are a near-tie (their logit gap under hybridlm within the
    # logits' measured difference), where rounding alone decides.
    seq = [int(x) for x in re.findall(r"-?\d+", (ref / "generated-ids.txt").read_text())]
    gen = json.loads(run([hlm, "generate", "--ckpt", str(ckpt), "--prompt", prompt, "--max-tokens", "64",
                          "--temperature", "0", "--json"]))
    ours, theirs = gen["tokens"], seq[len(want_ids):]
    same = next((k for k, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
    out = work / "forced.safetensors"
    run([hlm, "logits", "--ckpt", str(ckpt), "--tokens", " ".join(map(str, seq)), "--out", str(out)])
    forced = read_safetensors(out)["logits"]
    ties, worst = [], 0.0
    for t in range(len(want_ids) - 1, len(seq) - 1):
        row, nxt = forced[t], seq[t + 1]
        gap = float(row.max() - row[nxt])
        if int(row.argmax()) != nxt:
            ties.append((t + 1 - len(want_ids), gap))
            worst = max(worst, gap)
    result.update({"greedy_tokens_equal_before_first_difference": same, "generated_tokens": len(theirs),
                   "teacher_forced_disagreements": len(ties), "largest_disagreement_gap": worst})
    print(f"generation  {same} of {len(theirs)} greedy tokens equal before the first difference; teacher-forced on "
          f"llama.cpp's tokens, {len(ties)} steps where hybridlm's top token differs, largest logit gap {worst:.3g} "
          f"(near-ties if within the logits' difference {diff:.3g})")
    if worst > max(diff, 1e-6):
        failures.append("generation")

    # llama-perplexity: tokens of the whole text (BOS first), chunks of n_ctx, each chunk's first token replaced by
    # BOS, the losses of positions n_ctx/2 .. n_ctx-1 counted.
    cmd = (ref / "commands.sh").read_text()
    m = re.search(r"llama-perplexity -m \S+ -f (\S+) -c (\d+) --chunks (\d+)", cmd)
    n_ctx, chunks = int(m.group(2)), int(m.group(3))
    ids = [int(x) for x in re.findall(r"-?\d+", (ref / "text-ids.txt").read_text())]
    final = re.search(r"Final estimate: PPL = ([0-9.]+)", (ref / "perplexity.txt").read_text() +
                      (ref / "perplexity.log").read_text())
    nll, count = 0.0, 0
    for c in range(min(chunks, len(ids) // n_ctx)):
        chunk = ids[c * n_ctx:(c + 1) * n_ctx]
        chunk[0] = want_ids[0]
        out = work / f"losses-{c}.safetensors"
        run([hlm, "logits", "--ckpt", str(ckpt), "--tokens", " ".join(map(str, chunk)), "--losses", "--out", str(out)])
        losses = read_safetensors(out)["losses"].astype(np.float64)
        part = losses[n_ctx // 2 - 1:]  # loss[t] predicts token t+1: tokens n_ctx/2 .. n_ctx-1
        nll += float(part.sum())
        count += len(part)
    ppl = math.exp(nll / count)
    result["ppl"] = ppl
    if final:
        theirs_ppl = float(final.group(1))
        ratio = ppl / theirs_ppl
        result["ppl_llama_cpp"], result["ppl_ratio"] = theirs_ppl, ratio
        print(f"perplexity  hybridlm {ppl:.4f}, llama.cpp {theirs_ppl:.4f} (ratio {ratio:.6f}; {count} tokens)")
        if abs(ratio - 1) > a.ppl_tol:
            failures.append("perplexity")
    else:
        print(f"perplexity  hybridlm {ppl:.4f}; llama-perplexity printed no final estimate")
        failures.append("perplexity")

    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    if failures:
        sys.exit(f"released_check: off: {', '.join(failures)}")
    print("released_check: all equal")


if __name__ == "__main__":
    main()
