//! The writer component that ships in the `dstl` crate (`host/component/dstl_guest.wasm`,
//! embedded by `host/src/sandbox/cache.rs`, packed into the npm package) is the
//! reproducible build of `guest/` and `proto/` at this commit: a fresh build from source
//! gives the same bytes.
//!
//! After changing the guest, the protocol crate or the WIT, rebuild it with
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
fn the_shipped_component_is_the_build_of_the_sources() {
    let root = root();
    let shipped_path = root.join("host/component/dstl_guest.wasm");
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("guest-wasm");
    let built_path = build_component::build(&root, "dstl-guest", "dstl_guest", &target_dir)
        .unwrap_or_else(|e| panic!("{e}"));
    let built = std::fs::read(&built_path).unwrap();
    if std::env::var_os("DSTL_UPDATE_COMPONENT").is_some_and(|v| v == "1") {
        std::fs::write(&shipped_path, &built).unwrap();
        eprintln!("updated {} ({} bytes)", shipped_path.display(), built.len());
        return;
    }
    let shipped = std::fs::read(&shipped_path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", shipped_path.display()));
    assert!(
        shipped == built,
        "{} ({} bytes) is not the build of guest/, proto/ and wit/ in this checkout ({}, {} bytes, \
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
