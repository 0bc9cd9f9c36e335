//! What the CLI's test binaries share: the real `dstl` binary as a command, and what a
//! run of it did, for failure messages. Each binary uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// The `dstl` binary, to run in `cwd`, with no `RUST_LOG` from the test's environment.
pub fn command(cwd: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dstl"));
    command.current_dir(cwd).env_remove("RUST_LOG");
    command
}

/// `dstl args`, its exit status and both outputs, for a failure message.
pub fn describe(args: &[&str], out: &Output) -> String {
    format!(
        "dstl {}\nexit: {}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The stdout of `dstl args`, which must have succeeded.
pub fn succeeded(args: &[&str], out: &Output) -> String {
    assert!(out.status.success(), "{}", describe(args, out));
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

/// A path as an argument.
pub fn s(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}
