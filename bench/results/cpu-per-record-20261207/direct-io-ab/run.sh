#!/usr/bin/env bash
# Interleaved A/B of the dstl storage with and without O_DIRECT, one round each per step.
set -u
out="${1:?output directory}"
mkdir -p $out
for i in 1 2 3; do
  for mode in true false; do
    bench/flink-job.sh --rounds 1 --duration 30 --storages dstl --json $out/$mode-$i.json -- --conf state.changelog.dstl.dfs.local.direct-io=$mode > $out/$mode-$i.log 2>&1
  done
done

