#!/usr/bin/env bash
# Builds dstl's Flink plugin: one jar with the Java classes, the native library
# (linux-x86_64; the dstl host with the writer component compiled in) and the service
# registrations. Writes ${CARGO_TARGET_DIR:-target}/flink/dstl-flink.jar and its Maven POM
# (io.dstl:dstl-flink) beside it as dstl-flink.pom. Needs Java 17 and a stable Rust
# toolchain, not the wasm32-wasip2 target: the writer component ships prebuilt in the dstl
# crate (host/component/dstl_guest.wasm).
#
# Install: copy the jar into Flink's plugins/dstl/ (or put it on the classpath of a local
# environment) and set `state.changelog.storage: dstl`. See README.md, "Using dstl in Flink".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
out="$target/flink"

command -v javac >/dev/null || { echo "flink/build.sh: javac (Java 17) is required" >&2; exit 1; }

echo "building the native library (cargo build --release -p dstl-flink)" >&2
cargo build --release -p dstl-flink >&2
so="$target/release/libdstl_flink.so"

lib="$("$root/flink/fetch-flink.sh")"
classes="$out/classes"
rm -rf "$classes"
mkdir -p "$classes/io/dstl/flink/native/linux-x86_64"
javac --release 17 -nowarn -encoding UTF-8 -d "$classes" \
  -cp "$lib/flink-dist-2.3.0.jar:$lib/log4j-api-2.25.3.jar" \
  $(find "$root/flink/src/main/java" -name '*.java')
cp -r "$root/flink/src/main/resources/." "$classes/"
# Line tables are for debugging the build tree; the jar carries the library without them.
objcopy --strip-debug "$so" "$classes/io/dstl/flink/native/linux-x86_64/libdstl_flink.so"

# The Maven coordinate (io.dstl:dstl-flink at the workspace's version), in the jar where
# Maven puts it and beside the jar, for teams that deploy the plugin to a repository.
version="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
license="$(sed -n 's/^license *= *"\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
maven="$classes/META-INF/maven/io.dstl/dstl-flink"
mkdir -p "$maven"
sed -e "s/@VERSION@/$version/" -e "s/@LICENSE@/$license/" "$root/flink/pom.xml" > "$maven/pom.xml"
printf 'groupId=io.dstl\nartifactId=dstl-flink\nversion=%s\n' "$version" > "$maven/pom.properties"

tmp="$out/.dstl-flink.jar.$$"
jar --create --file "$tmp" -C "$classes" .
mv -f "$tmp" "$out/dstl-flink.jar"
cp "$maven/pom.xml" "$out/dstl-flink.pom"
echo "$out/dstl-flink.jar"
