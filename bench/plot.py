#!/usr/bin/env python3
"""Turns a bench/compare.sh results file (JSON lines) into a Markdown table (stdout) and
an SVG bar chart of dstl against Flink per workload (ratios to Flink warm, measured in the
same run). Standard library only."""
import json
import sys
from collections import defaultdict

WORKLOADS = ["small", "fanout", "large", "small-z"]


def load(path):
    flink = defaultdict(list)
    flink_rss = {}
    dstl = defaultdict(list)
    recovery = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            w, system = row["workload"], row["system"]
            if w.startswith("recovery"):
                recovery[(system, w)] = row["result"]
            elif system == "flink" and "result" in row:
                flink[w].append(row["result"])
            elif system == "flink":
                flink_rss[w] = row["process"]["max_rss_kb"] / 1024
            elif system == "dstl":
                dstl[(w, row["fsync"])].append(row["result"])
    return flink, flink_rss, dstl, recovery


def best(results, key="appends_per_s"):
    return max(results, key=lambda r: r[key]) if results else None


def main():
    src, svg_path = sys.argv[1], sys.argv[2]
    flink, flink_rss, dstl, recovery = load(src)
    rows = []
    print(f"Results of `{src.split('/')[-1]}` (ratios are dstl / Flink warm, same run).\n")
    print("| workload | Flink cold | Flink warm (p99) | dstl durable (p99) | ratio | dstl fsync=false (p99) | ratio | disk baseline fsync'd / buffered | dstl MB/s over same-mode baseline, durable / fsync=false | dstl RSS / Flink RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in WORKLOADS:
        iters = flink.get(w, [])
        if not iters:
            continue
        cold = iters[0]
        warm = best(iters[1:]) or cold
        durable = best(dstl.get((w, True), []))
        fast = best(dstl.get((w, False), []))
        if not durable or not fast:
            continue
        fw = warm["appends_per_s"]
        def cell(r):
            return f"{r['appends_per_s'] / 1e6:.2f} M/s ({r['persist_p99_ms']:.0f} ms)"
        base = f"{durable.get('baseline_disk_mb_per_s', 0):.0f} / {fast.get('baseline_buffered_mb_per_s', 0):.0f} MB/s"
        rss = f"{durable['peak_rss_mb']:.0f} / {flink_rss.get(w, 0):.0f} MB"
        disk = f"{durable.get('disk_ratio', 0):.2f} / {fast.get('disk_ratio', 0):.2f}"
        print(f"| {w} | {cold['appends_per_s'] / 1e6:.2f} M/s | {fw / 1e6:.2f} M/s ({warm['persist_p99_ms']:.0f} ms) | "
              f"{cell(durable)} | {durable['appends_per_s'] / fw:.2f}x | {cell(fast)} | {fast['appends_per_s'] / fw:.2f}x | {base} | {disk} | {rss} |")
        rows.append((w, durable["appends_per_s"] / fw, fast["appends_per_s"] / fw))
    rec = recovery.get(("dstl", "recovery"))
    flink_read = recovery.get(("flink", "recovery"))
    dstl_proc = recovery.get(("dstl", "recovery-process"))
    if rec and flink_read:
        fr = flink_read["read_process_s"]
        print()
        print("| recovery | Flink `run.sh read` (process) | dstl `read-list` (process) | ratio | dstl in-process, cache / no cache |")
        print("| --- | --- | --- | --- | --- |")
        dp = dstl_proc["read_process_s"] if dstl_proc else float("nan")
        print(f"| {rec['snapshots']} snapshots, {rec['pairs']} pairs, {rec['files']} files | {fr:.2f} s | {dp:.2f} s | {fr / dp:.1f}x | {rec['read_s']:.2f} s / {rec['read_uncached_s']:.2f} s |")
        rows.append(("recovery", fr / dp, None))
    write_svg(svg_path, rows)


def write_svg(path, rows):
    width, height, left, bottom, top = 640, 320, 60, 40, 30
    plot_h = height - bottom - top
    top_ratio = max([2.0] + [r for _, a, b in rows for r in (a, b) if r]) * 1.1
    group_w = (width - left - 20) / max(1, len(rows))
    bar_w = group_w / 4
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
             f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">dstl throughput as a multiple of Flink 2.3 (warm), same run</text>']
    def y(v):
        return top + plot_h - v / top_ratio * plot_h
    for tick in range(0, int(top_ratio) + 1):
        parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick}x</text>')
    parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#c00" stroke-dasharray="4 3"/>')
    for i, (name, durable, fast) in enumerate(rows):
        x0 = left + i * group_w + bar_w / 2
        for j, (value, colour, label) in enumerate([(durable, "#4472c4", "durable"), (fast, "#70ad47", "fsync=false")]):
            if value is None:
                continue
            x = x0 + j * bar_w * 1.2
            parts.append(f'<rect x="{x:.1f}" y="{y(value):.1f}" width="{bar_w:.1f}" height="{y(0) - y(value):.1f}" fill="{colour}"><title>{name} {label}: {value:.2f}x</title></rect>')
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{y(value) - 3:.1f}" text-anchor="middle">{value:.1f}</text>')
        parts.append(f'<text x="{x0 + bar_w:.1f}" y="{height - bottom + 16}" text-anchor="middle">{name}</text>')
    parts.append(f'<rect x="{width - 200}" y="{top}" width="10" height="10" fill="#4472c4"/><text x="{width - 185}" y="{top + 9}">dstl durable (recovery: read)</text>')
    parts.append(f'<rect x="{width - 200}" y="{top + 16}" width="10" height="10" fill="#70ad47"/><text x="{width - 185}" y="{top + 25}">dstl fsync=false</text>')
    parts.append(f'<text x="{width - 200}" y="{top + 41}" fill="#c00">- - Flink = 1x</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
