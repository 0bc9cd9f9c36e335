#!/usr/bin/env python3
"""Summarizes several bench/compare.sh result files (one per round) as a Markdown table:
per workload and fsync mode, the median over the rounds (with min–max) of dstl's appends/s
as a multiple of Flink warm in the same round, the persist p99 of both, dstl's written
MB/s against the same run's fsync'd and O_DIRECT sequential-write baselines, and, when the
rounds measured a DSTL_BASELINE build, dstl over that build. Within a round each system's
best run counts (as in plot.py). Standard library only.

    bench/rounds.py bench/results/bench-A.jsonl bench/results/bench-B.jsonl ...
"""
import json
import statistics
import sys
from collections import defaultdict


def load(path):
    flink = defaultdict(list)
    dstl = defaultdict(list)
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            w, system = row["workload"], row["system"]
            if w.startswith("recovery"):
                continue
            if system == "flink" and "result" in row:
                flink[w].append(row["result"])
            elif system in ("dstl", "dstl-baseline"):
                dstl[(system, w, row["fsync"])].append(row["result"])
    return flink, dstl


def best(results):
    return max(results, key=lambda r: r["appends_per_s"]) if results else None


def spread(values, fmt):
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt(med)
    return f"{fmt(med)} ({fmt(min(values))}–{fmt(max(values))})"


def main():
    rounds = [load(p) for p in sys.argv[1:]]
    keys = sorted({(w, fsync) for _, d in rounds for (s, w, fsync) in d if s == "dstl"},
                  key=lambda k: (["small", "fanout", "large", "small-z"].index(k[0]) if k[0] in ["small", "fanout", "large", "small-z"] else 9, not k[1]))
    print(f"{len(rounds)} rounds; each cell: median over the rounds (min–max); ratios are taken within a round.\n")
    print("| workload | fsync | Flink warm | Flink p99 | dstl | dstl / Flink warm | dstl p99 | dstl MB/s | / fsync'd baseline | / O_DIRECT baseline | dstl / previous build |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for w, fsync in keys:
        cols = defaultdict(list)
        for flink, dstl in rounds:
            iters = flink.get(w, [])
            warm = best(iters[1:]) or best(iters)
            mine = best(dstl.get(("dstl", w, fsync), []))
            prev = best(dstl.get(("dstl-baseline", w, fsync), []))
            if not mine:
                continue
            cols["dstl"].append(mine["appends_per_s"] / 1e6)
            cols["p99"].append(mine["persist_p99_ms"])
            mbs = mine.get("written_mb_per_s", 0)
            cols["mbs"].append(mbs)
            if mine.get("baseline_disk_mb_per_s"):
                cols["vs_fsync"].append(mbs / mine["baseline_disk_mb_per_s"])
            if mine.get("baseline_direct_mb_per_s"):
                cols["vs_direct"].append(mbs / mine["baseline_direct_mb_per_s"])
            if warm:
                cols["flink"].append(warm["appends_per_s"] / 1e6)
                cols["flink_p99"].append(warm["persist_p99_ms"])
                cols["ratio"].append(mine["appends_per_s"] / warm["appends_per_s"])
            if prev:
                cols["vs_prev"].append(mine["appends_per_s"] / prev["appends_per_s"])
        m = lambda v: f"{v:.2f} M/s"
        x = lambda v: f"{v:.2f}x"
        ms = lambda v: f"{v:.0f} ms"
        mb = lambda v: f"{v:.0f}"
        print(f"| {w} | {str(fsync).lower()} | {spread(cols['flink'], m)} | {spread(cols['flink_p99'], ms)} | "
              f"{spread(cols['dstl'], m)} | {spread(cols['ratio'], x)} | {spread(cols['p99'], ms)} | "
              f"{spread(cols['mbs'], mb)} | {spread(cols['vs_fsync'], x)} | {spread(cols['vs_direct'], x)} | "
              f"{spread(cols['vs_prev'], x)} |")


if __name__ == "__main__":
    main()
