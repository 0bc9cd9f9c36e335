//! The committed components are the reproducible builds of their sources at this commit:
//! a fresh build gives the same bytes.
//!
//! - The writer component, `host/component/dstl_guest.wasm` (embedded by
//!   `host/src/sandbox/cache.rs`, packed into the npm package), is the build of `guest/`.
//! - The rules component, `rules/component/dstl_rules.wasm` (packed into the npm package),
//!   is the build of `rules/`.
//!
//! After changing the guest, the rules, the protocol crate or the WIT, rebuild them with
//! `DSTL_UPDATE_COMPONENT=1 cargo test --release -p dstl-tests --test component`.

#[path = "../build_component.rs"]
mod build_component;

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lies in the workspace root")
        .to_path_buf()
}

#[test]
fn the_shipped_writer_component_is_the_build_of_the_sources() {
    check("dstl-guest", "dstl_guest", "host/component/dstl_guest.wasm");
}

#[test]
fn the_shipped_rules_component_is_the_build_of_the_sources() {
    check(
        "dstl-rules",
        "dstl_rules",
        "rules/component/dstl_rules.wasm",
    );
}

/// Builds `package` and compares its `artifact` with the committed `shipped` (a path from
/// the workspace root), or replaces the committed one with `DSTL_UPDATE_COMPONENT=1`.
fn check(package: &str, artifact: &str, shipped: &str) {
    let root = root();
    let shipped_path = root.join(shipped);
    // One target directory per package: the two tests run in parallel.
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{artifact}-wasm"));
    let built_path = build_component::build(&root, package, artifact, &target_dir)
        .unwrap_or_else(|e| panic!("{e}"));
    let built = std::fs::read(&built_path).unwrap();
    if std::env::var_os("DSTL_UPDATE_COMPONENT").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(shipped_path.parent().unwrap()).unwrap();
        std::fs::write(&shipped_path, &built).unwrap();
        eprintln!("updated {} ({} bytes)", shipped_path.display(), built.len());
        return;
    }
    let shipped = std::fs::read(&shipped_path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", shipped_path.display()));
    assert!(
        shipped == built,
        "{} ({} bytes) is not the build of {package} and proto/ and wit/ in this checkout ({}, {} bytes, \
         differing from byte {}): rebuild it with \
         `DSTL_UPDATE_COMPONENT=1 cargo test --release -p dstl-tests --test component`",
        shipped_path.display(),
        shipped.len(),
        built_path.display(),
        built.len(),
        shipped
            .iter()
            .zip(&built)
            .position(|(a, b)| a != b)
            .unwrap_or(shipped.len().min(built.len())),
    );
}
