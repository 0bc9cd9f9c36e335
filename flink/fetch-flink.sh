#!/usr/bin/env bash
# Fetches Apache Flink 2.3.0's jars, which the plugin compiles against and the tests run
# on. There is no Maven Central here: the jars come from the PyPI wheel
# apache-flink-libraries==2.3.0 (pyflink/lib/*.jar: flink-dist with every runtime
# dependency, RocksDB and the changelog state backend included, and log4j).
#
# Prints the directory holding the jars: ${DSTL_FLINK_CACHE:-~/.cache/dstl-flink}/lib.
# Idempotent; DSTL_FLINK_WHEEL=/path/to.whl skips the download.
set -euo pipefail

version=2.3.0
cache="${DSTL_FLINK_CACHE:-$HOME/.cache/dstl-flink}"
lib="$cache/lib"
if [[ -s "$lib/flink-dist-$version.jar" ]]; then
  echo "$lib"
  exit 0
fi
mkdir -p "$cache/wheel" "$lib"
wheel="${DSTL_FLINK_WHEEL:-}"
if [[ -z "$wheel" ]]; then
  wheel="$(ls "$cache"/wheel/apache_flink_libraries-$version-*.whl 2>/dev/null | head -n1 || true)"
fi
if [[ -z "$wheel" ]]; then
  echo "downloading apache-flink-libraries==$version from PyPI (about 330 MB) into $cache/wheel" >&2
  python3 -m pip download --quiet --no-deps -d "$cache/wheel" "apache-flink-libraries==$version" >&2
  wheel="$(ls "$cache"/wheel/apache_flink_libraries-$version-*.whl | head -n1)"
fi
# Extract next to the cache first: an interrupted run never leaves half a jar behind.
tmp="$(mktemp -d "$cache/extract.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
python3 - "$wheel" "$tmp" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in z.namelist():
        if n.startswith("pyflink/lib/") and n.endswith(".jar"):
            z.extract(n, sys.argv[2])
PY
mv -f "$tmp"/pyflink/lib/*.jar "$lib"/
echo "$lib"
