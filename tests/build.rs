//! Builds the misbehaving test component (`tests/hostile-guest/`) for `wasm32-wasip2`
//! into `OUT_DIR`; the sandbox tests load it with
//! `include_bytes!(env!("DSTL_HOSTILE_GUEST_WASM"))`.

#[path = "build_component.rs"]
mod build_component;

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap();
    for watched in [
        "tests/hostile-guest/src",
        "tests/hostile-guest/Cargo.toml",
        "wit",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let wasm = build_component::build(
        root,
        "dstl-hostile-guest",
        "dstl_hostile_guest",
        &out_dir.join("guest-wasm"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    println!("cargo:rustc-env=DSTL_HOSTILE_GUEST_WASM={}", wasm.display());
}
