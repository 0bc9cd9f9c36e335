//! Builds a component crate of this workspace for `wasm32-wasip2` with a nested cargo,
//! reproducibly: the same sources and toolchain give the same bytes wherever the
//! checkout and the cargo home lie. Shared by `tests/build.rs` (the hostile test
//! component) and `tests/tests/component.rs` (which checks that the committed writer
//! component, `host/component/dstl_guest.wasm`, is the build of the sources).
//!
//! - The nested build gets a target dir of its own (sharing the outer one would wait on
//!   the outer build's lock); callers pass one under `OUT_DIR` or the tests' temp dir.
//! - Host-only flags (`RUSTFLAGS`, wrappers) are removed so they do not leak into wasm.
//! - Paths that would end up in panic messages are remapped: the workspace root to
//!   `/dstl`, the cargo home to `/cargo` (the standard library's are `/rustc/<hash>`
//!   already).
//! - A missing wasm target is reported with the command that adds it; nothing here runs
//!   rustup.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The target every component is built for.
pub const TARGET: &str = "wasm32-wasip2";

/// Builds package `package` of the workspace at `root` with the `guest` profile into
/// `target_dir` and returns the path of `<artifact>.wasm`, or why it could not.
pub fn build(
    root: &Path,
    package: &str,
    artifact: &str,
    target_dir: &Path,
) -> Result<PathBuf, String> {
    check_target()?;
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "--locked", "-p", package, "--profile", "guest"])
        .args(["--target", TARGET])
        .arg("--target-dir")
        .arg(target_dir);
    for var in [
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
    let flags = [
        format!("--remap-path-prefix={}=/dstl", root.display()),
        format!("--remap-path-prefix={}=/cargo", cargo_home().display()),
    ];
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
    let output = cmd
        .output()
        .map_err(|e| format!("failed to run cargo for the component {package}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "building the component {package} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let wasm = target_dir
        .join(TARGET)
        .join("guest")
        .join(format!("{artifact}.wasm"));
    if !wasm.exists() {
        return Err(format!(
            "the build of {package} produced no {}",
            wasm.display()
        ));
    }
    Ok(wasm)
}

/// `$CARGO_HOME`, else `~/.cargo` (where cargo keeps the sources of dependencies).
fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"))
}

/// Fails with the command to run when the toolchain lacks the wasm target (new machines
/// have only the host target, and `RUSTUP_AUTO_INSTALL=0` keeps rustup from adding the
/// one `rust-toolchain.toml` names).
fn check_target() -> Result<(), String> {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("failed to run {rustc} --print sysroot: {e}"))?;
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
    if Path::new(&sysroot)
        .join("lib/rustlib")
        .join(TARGET)
        .exists()
    {
        return Ok(());
    }
    Err(format!(
        "the Rust target {TARGET} is not installed (components are built for it): \
         run `rustup target add {TARGET}`"
    ))
}
