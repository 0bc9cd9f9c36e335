//! Builds the guest component (`guest/`) for `wasm32-wasip2` with a nested cargo, so a
//! plain `cargo build` / `cargo test` at the root always embeds the current guest.
//!
//! - The nested build uses its own target dir (`<target>/guest-wasm`): sharing the outer
//!   one would wait on the outer build's lock.
//! - Host-only flags (`RUSTFLAGS`, wrappers) are removed so they do not leak into wasm.
//! - New machines lack the wasm target and `RUSTUP_AUTO_INSTALL=0` keeps rustup from
//!   adding it, so it is added here when missing.
//! - `DSTL_GUEST_WASM` points at a prebuilt component instead (offline or packaged builds).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

fn main() {
    println!("cargo:rerun-if-env-changed=DSTL_GUEST_WASM");
    if let Ok(prebuilt) = env::var("DSTL_GUEST_WASM") {
        println!("cargo:rerun-if-changed={prebuilt}");
        println!("cargo:rustc-env=DSTL_GUEST_WASM_PATH={prebuilt}");
        return;
    }
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    for watched in ["guest/src", "guest/Cargo.toml", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    // OUT_DIR = <target>/<profile>/build/<pkg>-<hash>/out: four levels up is <target>.
    let target_dir = out_dir.ancestors().nth(4).unwrap().join("guest-wasm");
    ensure_target();
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--locked",
            "-p",
            "dstl-guest",
            "--profile",
            "guest",
            "--target",
            TARGET,
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_MAKEFLAGS",
        "CARGO_PROFILE_RELEASE_DEBUG",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd
        .output()
        .expect("failed to run cargo for the guest component");
    if !output.status.success() {
        panic!(
            "building the guest component failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let wasm = target_dir
        .join(TARGET)
        .join("guest")
        .join("dstl_guest.wasm");
    assert!(wasm.exists(), "guest build produced no {}", wasm.display());
    println!("cargo:rustc-env=DSTL_GUEST_WASM_PATH={}", wasm.display());
}

/// Adds the wasm target through rustup when the toolchain lacks it.
fn ensure_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(sysroot) = sysroot
        && Path::new(&sysroot)
            .join("lib/rustlib")
            .join(TARGET)
            .exists()
    {
        return;
    }
    println!(
        "cargo:warning=adding the {TARGET} target with rustup (needed for the guest component)"
    );
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!(
            "the {TARGET} target is missing and `rustup target add {TARGET}` failed ({other:?}); \
             install it by hand or set DSTL_GUEST_WASM to a prebuilt component"
        ),
    }
}
