#!/usr/bin/env bash
# Integration tests of dstl's Flink plugin against real Flink 2.3.0 jobs: MiniClusters in this
# JVM, and a JobManager and TaskManagers in JVMs of their own (see
# flink/src/test/java/io/dstl/flink/it). Needs the plugin jar that flink/build.sh builds.
#
#   flink/test.sh                        all tests, with dstl and Flink's filesystem changelog
#   DSTL_FLINK_TEST_STORAGES=dstl flink/test.sh        only dstl
#   flink/test.sh --select-class io.dstl.flink.it.RescaleTest   (any JUnit console selector)
#
# DSTL_FLINK_TEST_LOG_LEVEL=INFO logs more of Flink (default WARN). The logs of the multi-process
# cluster end up in ${CARGO_TARGET_DIR:-target}/flink/test-logs. Exits non-zero if any test fails.
set -euo pipefail

cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
case "$target" in
  /*) ;;
  *) target="$PWD/$target" ;;
esac
plugin="$target/flink/dstl-flink.jar"
classes="$target/flink/test-classes"
junit=/usr/share/java/junit-platform-console-standalone.jar

lib="$(flink/fetch-flink.sh)"
if [[ ! -s "$plugin" ]]; then
  echo "flink/test.sh: the plugin jar $plugin is missing; build it first with flink/build.sh" >&2
  exit 1
fi
if [[ ! -s "$junit" ]]; then
  echo "flink/test.sh: $junit is missing (Debian package junit5)" >&2
  exit 1
fi

cp="$lib/flink-dist-2.3.0.jar"
for j in log4j-api log4j-core log4j-slf4j-impl log4j-1.2-api; do
  cp="$cp:$(ls "$lib"/$j-2.*.jar | head -n1)"
done

# A second native library with fault injection (the cargo feature `test-hooks`) for the tests
# that need a writer to fail inside the host; the plugin's own library has none. Built after
# the plugin jar took its copy of the library, and kept under a name of its own.
hooks="$target/flink/libdstl_flink_test_hooks.so"
echo "building the test-hooks library (cargo build --release -p dstl-flink --features test-hooks)" >&2
cargo build --release -p dstl-flink --features test-hooks >&2
cp "$target/release/libdstl_flink.so" "$hooks"

rm -rf "$classes"
mkdir -p "$classes"
javac -encoding UTF-8 -Xlint:all -Xlint:-serial -Xlint:-processing -d "$classes" \
  -cp "$cp:$junit:$plugin" flink/src/test/java/io/dstl/flink/*.java flink/src/test/java/io/dstl/flink/it/*.java
# Recursively: META-INF/services registers the tests' metric reporter factory.
cp -R flink/src/test/resources/. "$classes"/

# What Flink's scripts pass to a Java 17 JVM (env.java.opts.all in Flink's default config.yaml).
opens=(
  --add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED
  --add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED
  --add-opens=java.base/java.lang=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED
  --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens=java.base/java.text=ALL-UNNAMED
  --add-opens=java.base/java.time=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED
)

logs="$target/flink/test-logs"
rm -rf "$logs"
selectors=("$@")
if [[ ${#selectors[@]} -eq 0 ]]; then
  selectors=(--select-package io.dstl.flink.it)
fi

# Everything on the JVM's own classpath (not the launcher's --class-path), so that Flink and the
# tests share the application class loader as in a Flink process. The plugin jar is on it too,
# because a MiniCluster never loads plugins/; the multi-process test installs it in plugins/dstl/
# of its cluster instead. The launcher exits non-zero if a test fails or none was found.
exec java -Xmx2g "${opens[@]}" \
  -Ddstl.flink.lib="$lib" \
  -Ddstl.flink.plugin.jar="$plugin" \
  -Ddstl.flink.test.hooks.library="$hooks" \
  -Ddstl.it.log-dir="$logs" \
  -cp "$classes:$cp:$plugin:$junit" \
  org.junit.platform.console.ConsoleLauncher \
  --disable-banner --disable-ansi-colors --details=tree --fail-if-no-tests \
  --include-engine junit-jupiter \
  --include-classname '.*Test' \
  "${selectors[@]}"
