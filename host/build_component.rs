//! Builds a component crate of this workspace for `wasm32-wasip2` with a nested cargo;
//! shared by the build scripts of `host/` (the writer) and `tests/` (a test component).
//!
//! - The nested build uses its own target dir (`<target>/guest-wasm`): sharing the outer
//!   one would wait on the outer build's lock.
//! - Host-only flags (`RUSTFLAGS`, wrappers) are removed so they do not leak into wasm.
//! - New machines lack the wasm target and `RUSTUP_AUTO_INSTALL=0` keeps rustup from
//!   adding it, so it is added here when missing.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

/// Builds package `package` (whose sources are `watched`, relative to the workspace
/// root) with the `guest` profile and returns the path of `<artifact>.wasm`.
pub fn build(package: &str, artifact: &str, watched: &[&str]) -> PathBuf {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    for path in watched.iter().chain(&["wit", "Cargo.lock"]) {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
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
            package,
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
        .unwrap_or_else(|e| panic!("failed to run cargo for the component {package}: {e}"));
    if !output.status.success() {
        panic!(
            "building the component {package} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let wasm = target_dir
        .join(TARGET)
        .join("guest")
        .join(format!("{artifact}.wasm"));
    assert!(
        wasm.exists(),
        "the build of {package} produced no {}",
        wasm.display()
    );
    wasm
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
        "cargo:warning=adding the {TARGET} target with rustup (needed for the writer component)"
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
