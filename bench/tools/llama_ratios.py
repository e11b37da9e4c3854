#!/usr/bin/env python3
"""The summary of bench/compare_llama.sh's rounds: hybridlm's tokens/s over llama.cpp's, paired per round.

Usage: llama_ratios.py <results prefix> <rounds> "<model> ..." <test>...
       llama_ratios.py --line <base> "<model> <test>"    (one test of one round, as it finishes)
Reads <prefix>-r<round>-<model>-<test>-{hybridlm,llama-f32,llama-bf16}.json, each with a .rss beside it (peak RSS
in KiB, /usr/bin/time -v), where <test> is pp<N> (prefill of N tokens) or tg<M>-d<D> (M decode steps at depth D;
written tg<M>@d<D> on the command line). hybridlm's file is `hybridlm bench --ckpt ... --json`, llama.cpp's
`llama-bench -o json`. A missing file (a failed or skipped run) leaves its cells empty. Prints a Markdown table:
median (min-max) over rounds of each tokens/s and of each ratio, and the median peak RSS of each.
"""
import sys

from peer_ratios import load, spread  # the same file reading and median (range) cells as compare_peer.sh's table


def tokens_per_s(j, decode):
    """hybridlm's median, or llama-bench's mean over its repetitions, of the one test in the file."""
    if j is None:
        return None
    if isinstance(j, dict):
        v = j.get("decode_tokens_per_s" if decode else "prefill_tokens_per_s")
        return v if v else None
    return j[0]["avg_ts"] if j else None


def rss_mb(base):
    try:
        with open(base + ".rss") as f:
            return int(f.read().strip()) / 1024.0
    except (OSError, ValueError):
        return None


WHO = ("hybridlm", "llama-f32", "llama-bf16")


def measure(base, decode):
    """tokens/s and peak RSS (MiB) of each of WHO for one test of one round."""
    return {w: (tokens_per_s(load(f"{base}-{w}.json"), decode), rss_mb(f"{base}-{w}")) for w in WHO}


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_tps(v):
    return "-" if v is None else f"{v:.1f}"


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--line":
        base, label = sys.argv[2], sys.argv[3]
        m = measure(base, label.split()[-1].startswith("tg"))
        cells = [f"{w} {fmt_tps(m[w][0])} tok/s, {fmt_tps(m[w][1])} MiB" for w in WHO]
        print(f"{label:24s} " + " | ".join(cells))
        return
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    prefix, rounds, models, tests = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
    print("\n| model | test | hybridlm tok/s | llama.cpp F32 tok/s | llama.cpp BF16 tok/s | hybridlm / F32 | "
          "hybridlm / BF16 | peak RSS MiB: hybridlm / F32 / BF16 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for model in models:
        for test in tests:
            decode = test.startswith("tg")
            per_round = [measure(f"{prefix}-r{r}-{model}-{test.replace('@', '-')}", decode)
                         for r in range(1, rounds + 1)]
            tps = {w: [m[w][0] for m in per_round] for w in WHO}
            rss = {w: [m[w][1] for m in per_round] for w in WHO}
            vs_f32 = [ratio(m["hybridlm"][0], m["llama-f32"][0]) for m in per_round]
            vs_bf16 = [ratio(m["hybridlm"][0], m["llama-bf16"][0]) for m in per_round]
            rss_cell = " / ".join(spread(rss[w], "{:.0f}").split(" ")[0] for w in WHO)
            print(f"| {model} | {test} | {spread(tps['hybridlm'], '{:.1f}')} | {spread(tps['llama-f32'], '{:.1f}')} | "
                  f"{spread(tps['llama-bf16'], '{:.1f}')} | {spread(vs_f32, '{:.2f}x')} | "
                  f"{spread(vs_bf16, '{:.2f}x')} | {rss_cell} |")


if __name__ == "__main__":
    main()
