#!/usr/bin/env bash
# The crates as a user gets them: packages every crate meant for publication
# (dstl-proto, dstl-guest, dstl, dstl-cli) with `cargo package`, unpacks the .crate
# files, and outside this tree
#   - builds and runs the example of the dstl crate's README (host/README.md) in a new
#     project that depends on the packaged dstl (and nothing of this checkout),
#   - builds the dstl binary from the packaged dstl-cli and runs a short job with it,
#   - builds the writer component from the packaged dstl-guest for wasm32-wasip2.
# Everything resolves through a [patch] to the unpacked packages, so a file missing from
# a package fails here. Run after `cargo test --release --workspace`: the dependencies
# it compiled are reused (same target directory, same profile).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
crates=(dstl-proto dstl-guest dstl dstl-cli)

step() { echo "== $*" >&2; }

step "cargo package ${crates[*]}"
# Packages are built below from their unpacked sources, which is the verification;
# `--no-verify` keeps cargo from building each one in debug a second time.
cargo package --locked --no-verify --allow-dirty $(printf -- '-p %s ' "${crates[@]}") >&2

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/crates" "$work/.cargo"
patch=""
for crate in "${crates[@]}"; do
  file="$target/package/$crate-$version.crate"
  [ -f "$file" ] || { echo "test-packages: $file was not written" >&2; exit 1; }
  tar -xzf "$file" -C "$work/crates"
  patch+="$crate = { path = \"$work/crates/$crate-$version\" }"$'\n'
done
for must in dstl-$version/component/dstl_guest.wasm dstl-$version/wit/dstl.wit dstl-guest-$version/wit/dstl.wit; do
  [ -f "$work/crates/$must" ] || { echo "test-packages: the package lacks $must" >&2; exit 1; }
done
if grep -rl '\.\./' "$work/crates"/*/Cargo.toml >/dev/null 2>&1; then
  echo "test-packages: a packaged manifest points outside its package:" >&2
  grep -rn '\.\./' "$work/crates"/*/Cargo.toml >&2
  exit 1
fi
# Resolve the published names to the unpacked packages, and build with the workspace's
# release profile so the dependencies compiled by the test run are reused.
cat >"$work/.cargo/config.toml" <<EOF
[patch.crates-io]
$patch
[profile.release]
debug = "line-tables-only"
[profile.release.package."*"]
debug = false
EOF

step "a new project depending on the packaged dstl runs the README's example"
app="$work/app"
mkdir -p "$app/src"
cat >"$app/Cargo.toml" <<EOF
[package]
name = "dstl-example"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
dstl = "$version"
EOF
# The first rust block of the crate's README is the example.
awk '/^```rust$/ {on = 1; next} /^```$/ && on {exit} on {print}' host/README.md >"$app/src/main.rs"
[ -s "$app/src/main.rs" ] || { echo "test-packages: no rust block in host/README.md" >&2; exit 1; }
cp Cargo.lock "$app/Cargo.lock"
(cd "$app" && CARGO_TARGET_DIR="$target" cargo build --release --quiet) >&2
out="$("$target/release/dstl-example")"
expected=$'-1 schema v1\n5 count=1\n1 abc\n2 defg'
if [ "$out" != "$expected" ]; then
  echo "test-packages: the example printed" >&2
  echo "$out" >&2
  echo "instead of" >&2
  echo "$expected" >&2
  exit 1
fi
echo "$out"

step "the dstl binary from the packaged dstl-cli runs a job"
cli="$work/crates/dstl-cli-$version"
cp Cargo.lock "$cli/Cargo.lock"
(cd "$cli" && CARGO_TARGET_DIR="$target" cargo build --release --quiet) >&2
"$target/release/dstl" --version
summary="$("$target/release/dstl" run --dir "$work/data" --writers 2 --changes 20000 --json)"
case "$summary" in
  *'"verified":true'*) echo "dstl run from the packaged CLI: verified" ;;
  *) echo "test-packages: dstl run did not verify: $summary" >&2; exit 1 ;;
esac

step "the writer component builds from the packaged dstl-guest"
guest="$work/crates/dstl-guest-$version"
cp Cargo.lock "$guest/Cargo.lock"
(cd "$guest" && CARGO_TARGET_DIR="$work/guest-target" cargo build --release --quiet --target wasm32-wasip2) >&2
wasm="$work/guest-target/wasm32-wasip2/release/dstl_guest.wasm"
# A component (not a core module): magic, then version 0x0d 0x00 and layer 0x01 0x00.
if [ "$(head -c 8 "$wasm" | od -An -tx1 | tr -d ' \n')" != "0061736d0d000100" ]; then
  echo "test-packages: $wasm is not a WebAssembly component" >&2
  exit 1
fi
echo "dstl-guest from its package: a component of $(wc -c <"$wasm") bytes"
echo "test-packages: every package builds and runs outside the tree"
