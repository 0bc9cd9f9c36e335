//! The examples in `host/examples/` run as a user would run them, and do what they say.
//!
//! `cargo test` builds the examples of the package along with its tests (into
//! `<target>/<profile>/examples/`, beside the `deps/` folder of this test binary), so
//! these tests run the binaries it built. A test run that builds only this target
//! (`cargo test --test examples`) does not build them: `cargo build --examples` (with the
//! same profile) first.

// Shared with the tests crate; this binary uses only part of it.
#[allow(dead_code)]
#[path = "../../tests/src/seaweed.rs"]
mod seaweed;

use std::path::PathBuf;
use std::process::{Command, Output};

/// The built example `name`.
fn example(name: &str) -> Command {
    let test_binary = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test_binary
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lies in <target>/<profile>/deps");
    let path: PathBuf = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "example {name} not built at {}: `cargo test` builds the examples; after \
         `cargo test --test examples` alone, run `cargo build --examples` (same profile) first",
        path.display()
    );
    let mut command = Command::new(path);
    command.env_remove("RUST_LOG");
    command
}

/// Runs `command`, which must succeed; returns its stdout.
fn succeeds(name: &str, command: &mut Command) -> String {
    let out: Output = command.output().expect("the example starts");
    assert!(
        out.status.success(),
        "example {name} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

#[test]
fn operator_loop_restores_its_live_state_from_the_last_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let out = succeeds("operator_loop", example("operator_loop").arg(tmp.path()));
    assert!(
        out.contains("restored") && out.contains("identical to the live state"),
        "{out}"
    );
    assert!(
        out.contains("checkpoint 10: materialized at sequence number"),
        "{out}"
    );
    // The files are where it was told to put them.
    assert!(
        walk(tmp.path())
            .iter()
            .any(|p| p.to_string_lossy().contains("/dstl/")),
        "no changelog file under {}",
        tmp.path().display()
    );
}

#[test]
fn async_operators_wait_on_availability_and_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let out = succeeds(
        "async_operators",
        example("async_operators").arg(tmp.path()),
    );
    for op in 0..4 {
        assert!(
            out.contains(&format!("op-{op}: 20 checkpoints, waited for availability")),
            "{out}"
        );
    }
    assert!(out.contains("last checkpoint holds 1000 changes"), "{out}");
    assert!(out.contains(" 0 bytes in flight at the end"), "{out}");
}

#[test]
#[cfg(feature = "s3")]
fn s3_example_takes_its_credentials_from_the_environment() {
    let server = seaweed::Seaweed::start("example");
    let settings = server.settings();
    let url = format!("s3://{}/examples", server.bucket);
    let out = succeeds(
        "s3",
        example("s3")
            .arg(&url)
            .env("AWS_ENDPOINT_URL", settings.endpoint().unwrap())
            .env("AWS_REGION", settings.region().unwrap())
            .env("AWS_ACCESS_KEY_ID", settings.access_key_id().unwrap())
            .env("AWS_SECRET_ACCESS_KEY", seaweed::SECRET_KEY),
    );
    assert!(
        out.contains("the last checkpoint holds 1000 changes"),
        "{out}"
    );
    assert!(
        out.contains(&format!("s3://{}/examples/", server.bucket)),
        "{out}"
    );

    // Without credentials in the environment the store refuses the writes: the example
    // fails rather than pretending.
    let out = example("s3")
        .arg(&url)
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "nobody")
        .env("AWS_SECRET_ACCESS_KEY", "wrong")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // And without a URL it says how to call it.
    let out = example("s3").env_remove("DSTL_S3_URL").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: s3 s3://bucket/prefix"));
}

#[test]
fn recover_restores_a_writer_from_its_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let out = succeeds("recover", example("recover").arg(tmp.path()));
    assert!(
        out.contains("second life: restored 40 keys from checkpoint 1"),
        "{out}"
    );
    assert!(
        out.contains("the restored 500 changes + 300 new ones) reads back as the live state"),
        "{out}"
    );
    // The manifest it wrote reads back on its own too.
    let manifest = tmp.path().join("sensors.json");
    let out = succeeds(
        "recover --manifest",
        example("recover").arg("--manifest").arg(&manifest),
    );
    assert!(
        out.contains("writer sensors, checkpoint 1, 500 changes"),
        "{out}"
    );
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}
