#!/usr/bin/env bash
# Runs the standard workloads with dstl (durable default and dstl.dfs.local.fsync=false)
# and with Apache Flink 2.3's own writer (through its benchmark harness) one after the
# other on this machine, plus the disk baselines, and writes the results as JSON lines,
# a Markdown table and an SVG plot (bench/plot.py) into bench/results/.
#
#   FLINK_ANCHOR=/path/to/flink-anchor bench/compare.sh [workload ...]
#
# FLINK_ANCHOR is the harness directory (run.sh bench / run.sh read; it fetches Flink's
# jars itself and needs Java 17). Workloads: small fanout large small-z recovery
# (default: all). RUNS=N repeats each dstl measurement N times (default 3) and keeps the
# best; Flink runs 3 iterations in one JVM (the first is cold, the best of the others
# warm). MODES="true false" (default) are the dstl.dfs.local.fsync values measured.
# DSTL_BASELINE=/path/to/another/dstl also measures that build (e.g. the previous main)
# in the same run, as system "dstl-baseline". bench/rounds.py summarizes several result
# files (rounds) by their medians. Nothing here is part of the build or the tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
: "${FLINK_ANCHOR:?set FLINK_ANCHOR to the Flink harness directory (it has run.sh)}"
runs="${RUNS:-3}"
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(small fanout large small-z recovery)
out="$here/results"
mkdir -p "$out"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
jsonl="$out/bench-$stamp.jsonl"
cargo build --release -p dstl-cli --manifest-path "$root/Cargo.toml" >&2
dstl="${CARGO_TARGET_DIR:-$root/target}/release/dstl"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

flink_args() {
  case "$1" in
    small) echo "--writers 1 --changes 2000000 --size 100 --key-groups 128 --checkpoint-every 10000" ;;
    fanout) echo "--writers 8 --changes 2000000 --size 100 --key-groups 128 --checkpoint-every 10000" ;;
    large) echo "--writers 1 --changes 200000 --size 4096 --key-groups 128 --checkpoint-every 10000" ;;
    small-z) echo "--writers 1 --changes 2000000 --size 100 --key-groups 128 --checkpoint-every 10000 --compression" ;;
  esac
}

emit() { echo "$1" >> "$jsonl"; }

for w in "${workloads[@]}"; do
  if [ "$w" = recovery ]; then
    rm -rf "$tmp/rec"
    "$dstl" bench --workload recovery --keep "$tmp/rec" --json > "$tmp/rec.json"
    emit "{\"system\":\"dstl\",\"workload\":\"recovery\",\"result\":$(cat "$tmp/rec.json")}"
    t0=$(date +%s%N)
    (cd "$FLINK_ANCHOR" && ./run.sh read "$tmp/rec/handles.json" --format summary > "$tmp/flink-read.out" 2> "$tmp/flink-read.err")
    t1=$(date +%s%N)
    if ! diff <(awk '{print $2, $3}' "$tmp/flink-read.out") \
              <(python3 -c 'import json,sys; [print(s["expectedCount"], s["expectedTotalSha256"]) for s in json.load(open(sys.argv[1]))["snapshots"]]' "$tmp/rec/handles.json") > /dev/null; then
      echo "Flink's reader read other changes than dstl wrote" >&2; exit 1
    fi
    emit "{\"system\":\"flink\",\"workload\":\"recovery\",\"result\":{\"read_process_s\":$(awk "BEGIN{print ($t1-$t0)/1e9}")}}"
    # The same reads as one dstl process (start-up included), for a like-for-like time.
    t0=$(date +%s%N)
    "$dstl" read-list "$tmp/rec/handles.json" > "$tmp/dstl-read.out"
    t1=$(date +%s%N)
    emit "{\"system\":\"dstl\",\"workload\":\"recovery-process\",\"result\":{\"read_process_s\":$(awk "BEGIN{print ($t1-$t0)/1e9}")}}"
    continue
  fi
  echo "== $w: Flink" >&2
  # shellcheck disable=SC2046
  (cd "$FLINK_ANCHOR" && ./run.sh bench $(flink_args "$w") --iterations 3 --base "$tmp/flink") 2>&1 \
    | grep -E '^RESULT|^PROCESS' | tee "$tmp/flink.txt" >&2 || true
  n=0
  while read -r line; do
    n=$((n + 1))
    emit "{\"system\":\"flink\",\"workload\":\"$w\",\"iteration\":$n,\"result\":${line#RESULT }}"
  done < <(grep '^RESULT' "$tmp/flink.txt")
  rss=$(grep -o 'max_rss_kb=[0-9]*' "$tmp/flink.txt" | cut -d= -f2 || echo 0)
  emit "{\"system\":\"flink\",\"workload\":\"$w\",\"process\":{\"max_rss_kb\":${rss:-0}}}"
  # Flink writes without fsync: its dirty pages go to disk now, not during the next run.
  sync
  for fsync in ${MODES:-true false}; do
    for r in $(seq "$runs"); do
      # With a baseline build, the two take turns going first: neither always runs on
      # the other's leftovers (page cache, writeback, a warm CPU).
      systems=(dstl)
      if [ -n "${DSTL_BASELINE:-}" ]; then
        if [ $((r % 2)) -eq 1 ]; then systems=(dstl dstl-baseline); else systems=(dstl-baseline dstl); fi
      fi
      for system in "${systems[@]}"; do
        bin="$dstl"
        [ "$system" = dstl ] || bin="$DSTL_BASELINE"
        echo "== $w: $system fsync=$fsync run $r" >&2
        res=$("$bin" bench --workload "$w" --json --conf "dstl.dfs.local.fsync=$fsync")
        emit "{\"system\":\"$system\",\"workload\":\"$w\",\"fsync\":$fsync,\"run\":$r,\"result\":$res}"
      done
    done
  done
done
python3 "$here/plot.py" "$jsonl" "$out/bench-$stamp.svg" > "$out/bench-$stamp.md"
if [ "${MODES:-true false}" = "true false" ] && [ -z "${DSTL_BASELINE:-}" ]; then
  cp "$out/bench-$stamp.svg" "$here/latest.svg"
  cp "$out/bench-$stamp.md" "$here/latest.md"
  echo "results: $jsonl, $out/bench-$stamp.md, $out/bench-$stamp.svg (copied to bench/latest.*)" >&2
else
  echo "results: $jsonl, $out/bench-$stamp.md, $out/bench-$stamp.svg" >&2
fi
