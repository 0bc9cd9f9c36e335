//! Builds the writer component (`guest/`) for `wasm32-wasip2`, so a plain `cargo build`
//! or `cargo test` at the root always embeds the current guest (see `build_component.rs`).
//! `DSTL_GUEST_WASM` points at a prebuilt component instead (offline or packaged builds).

#[path = "build_component.rs"]
mod build_component;

fn main() {
    println!("cargo:rerun-if-env-changed=DSTL_GUEST_WASM");
    if let Ok(prebuilt) = std::env::var("DSTL_GUEST_WASM") {
        println!("cargo:rerun-if-changed={prebuilt}");
        println!("cargo:rustc-env=DSTL_GUEST_WASM_PATH={prebuilt}");
        return;
    }
    let wasm = build_component::build(
        "dstl-guest",
        "dstl_guest",
        &[
            "guest/src",
            "guest/Cargo.toml",
            "proto/src",
            "proto/Cargo.toml",
        ],
    );
    println!("cargo:rustc-env=DSTL_GUEST_WASM_PATH={}", wasm.display());
}
