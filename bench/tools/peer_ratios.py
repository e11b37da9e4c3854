#!/usr/bin/env python3
"""The per-preset summary of bench/compare_peer.sh's rounds: hybridlm's tokens/s over each peer's, paired per round.

Usage: peer_ratios.py <results prefix> <rounds> <preset>...
Reads <prefix>-r<round>-<preset>-{hybridlm,peer,peer2-sdpa,peer2-explicit}.json and <prefix>-r<round>-gemm-peak.json
(Google Benchmark JSON of BM_Matmul; the round's GEMM peak is its best median). A file that is missing (a peer
skipped or failed) leaves its column empty. Where any round has <...>-hybridlm-bf16.json (compare_peer.sh BF16=1),
the table gains a column: hybridlm's bf16 tokens/s over its fp32 tokens/s of the same round. Prints a Markdown
table: median (min-max) over rounds of each ratio.
"""
import json
import os
import statistics
import sys


def load(path):
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"peer_ratios: cannot read {path}: {e}", file=sys.stderr)
        return None


def tokens_per_s(j):
    if j is None:
        return None
    return j["train_tokens_per_s"] if "train_tokens_per_s" in j else j["results"][0]["train_tokens_per_s"]


def rss_mb(j):
    if j is None:
        return None
    return j.get("peak_rss_mb") if "train_tokens_per_s" in j else j["results"][0].get("max_rss_mb_so_far")


def gemm_peak(j):
    """The best median GFLOP/s among the BM_Matmul shapes of a Google Benchmark JSON file (which writes the counter
    in FLOP/s)."""
    if j is None:
        return None
    rates = [b["GFLOP/s"] / 1e9 for b in j.get("benchmarks", [])
             if b.get("aggregate_name") == "median" and "GFLOP/s" in b]
    return max(rates) if rates else None


def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    prefix, rounds, presets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    peaks = [gemm_peak(load(f"{prefix}-r{r}-gemm-peak.json")) for r in range(1, rounds + 1)]
    with_bf16 = any(os.path.exists(f"{prefix}-r{r}-{p}-hybridlm-bf16.json")
                    for r in range(1, rounds + 1) for p in presets)
    print(f"\nGEMM peak per round (GFLOP/s): {', '.join('-' if p is None else f'{p:.0f}' for p in peaks)}")
    print(f"\n| preset | hybridlm tok/s | vs torch 2.x eager | vs torch 1.13 | % of GEMM peak | "
          f"peak RSS MB: hybridlm / torch 1.13 |" + (" bf16 / fp32 |" if with_bf16 else ""))
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" if with_bf16 else ""))
    for p in presets:
        ours, r2, r1, share, rss, bf16 = [], [], [], [], [], []
        for r in range(1, rounds + 1):
            base = f"{prefix}-r{r}-{p}"
            h = load(f"{base}-hybridlm.json")
            t = tokens_per_s(h)
            if t is None:
                continue
            ours.append(t)
            peer2 = [tokens_per_s(load(f"{base}-peer2-{a}.json")) for a in ("sdpa", "explicit")]
            peer2 = [x for x in peer2 if x]
            if peer2:
                r2.append(t / max(peer2))
            peer1 = load(f"{base}-peer.json")
            if tokens_per_s(peer1):
                r1.append(t / tokens_per_s(peer1))
            if peaks[r - 1]:
                share.append(100.0 * h["train_gflops"] / peaks[r - 1])
            rss.append((rss_mb(h), rss_mb(peer1)))
            t_bf16 = tokens_per_s(load(f"{base}-hybridlm-bf16.json"))
            if t_bf16:
                bf16.append(t_bf16 / t)
        rss_text = "-"
        if rss:
            ours_rss = max(x for x, _ in rss)
            theirs = [y for _, y in rss if y]
            rss_text = f"{ours_rss:.0f} / {max(theirs):.0f}" if theirs else f"{ours_rss:.0f} / -"
        print(f"| `{p}` | {spread(ours, '{:.0f}')} | {spread(r2, '{:.2f}x')} | {spread(r1, '{:.2f}x')} | "
              f"{spread(share, '{:.1f}%')} | {rss_text} |" + (f" {spread(bf16, '{:.2f}x')} |" if with_bf16 else ""))
    print(f"\nmedian (min-max) over {rounds} round(s); each ratio pairs runs of the same round.")


if __name__ == "__main__":
    main()
