#!/bin/bash
# usage: ab.sh N workload fsync bin...
n=$1; w=$2; f=$3; shift 3
for i in $(seq $n); do for b in "$@"; do
  sync; sleep 0.5
  v=$($b bench --workload $w --json --conf dstl.dfs.local.fsync=$f 2>/dev/null | python3 -c 'import json,sys;d=json.load(sys.stdin);print(d["payload_mb_per_s"], d["baseline_buffered_mb_per_s"])')
  echo "$(basename $b) $v"
done; done | python3 -c '
import sys,statistics as s,collections
d=collections.defaultdict(list); bl=collections.defaultdict(list)
for l in sys.stdin:
  b,v,x=l.split(); d[b].append(float(v)); bl[b].append(float(x))
for b,v in d.items(): print(b, "median %.0f"%s.median(v), "min %.0f max %.0f"%(min(v),max(v)), len(v), "baseline-buffered median %.0f min %.0f"%(s.median(bl[b]),min(bl[b])))
'
