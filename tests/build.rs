//! Builds the misbehaving test component (`tests/hostile-guest/`) for `wasm32-wasip2`;
//! the sandbox tests load it with `include_bytes!(env!("DSTL_HOSTILE_GUEST_WASM"))`.

#[path = "../host/build_component.rs"]
mod build_component;

fn main() {
    let wasm = build_component::build(
        "dstl-hostile-guest",
        "dstl_hostile_guest",
        &["tests/hostile-guest/src", "tests/hostile-guest/Cargo.toml"],
    );
    println!("cargo:rustc-env=DSTL_HOSTILE_GUEST_WASM={}", wasm.display());
}
