//! The syscall order that makes an acknowledged checkpoint durable, checked under
//! `strace` on a real `dstl run`, for both ways a local file is written: large fsync'd
//! files past the page cache (`O_DIRECT`), small ones through it.
//!
//! For every changelog file a final manifest names (a manifest is written only after its
//! checkpoint's persist completed), the trace must show, in this order:
//! 1. every write to the file's staging name, and the cut to its length;
//! 2. an `fdatasync` or `fsync` of that staging file;
//! 3. the `renameat2(.., RENAME_NOREPLACE)` (or `link`) of the staging name to the file;
//! 4. an `fsync` of the file's directory;
//! 5. the `rename` that put the manifest in place.
//!
//! Each step completes before the next one starts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One system call of the trace: where its entry and its exit were printed.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    args: String,
    result: String,
    entry: usize,
    exit: usize,
}

/// Parses `strace -f -y` output: lines `PID name(args) = result`, or a call split over
/// `PID name(args <unfinished ...>` and `PID <... name resumed>rest) = result`.
fn parse(trace: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut open: HashMap<String, (String, String, usize)> = HashMap::new();
    for (index, line) in trace.lines().enumerate() {
        let Some((pid, rest)) = line.split_once(' ') else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(resumed) = rest.strip_prefix("<... ") {
            let Some((name, tail)) = resumed.split_once(" resumed>") else {
                continue;
            };
            if let Some((call_name, args, entry)) = open.remove(pid)
                && call_name == name
            {
                let (more, result) = split_result(tail);
                calls.push(Call {
                    name: call_name,
                    args: format!("{args}{more}"),
                    result,
                    entry,
                    exit: index,
                });
            }
            continue;
        }
        let Some((name, tail)) = rest.split_once('(') else {
            continue;
        };
        if let Some(args) = tail.strip_suffix(" <unfinished ...>") {
            open.insert(pid.to_string(), (name.to_string(), args.to_string(), index));
            continue;
        }
        let (args, result) = split_result(tail);
        calls.push(Call {
            name: name.to_string(),
            args,
            result,
            entry: index,
            exit: index,
        });
    }
    calls
}

/// `args)   = result` (strace pads before the `=`) into its two halves.
fn split_result(tail: &str) -> (String, String) {
    match tail.rsplit_once(" = ") {
        Some((args, result)) => {
            let args = args.trim_end();
            let args = args.strip_suffix(')').unwrap_or(args);
            (args.to_string(), result.trim().to_string())
        }
        None => (tail.to_string(), String::new()),
    }
}

/// The path `strace -y` prints for the descriptor that starts `args` (`7</a/b>`).
fn fd_path(args: &str) -> Option<&str> {
    let start = args.find('<')? + 1;
    let end = args[start..].find('>')? + start;
    Some(&args[start..end])
}

/// The quoted strings of `args`, in order.
fn quoted(args: &str) -> Vec<&str> {
    args.split('"').skip(1).step_by(2).collect()
}

fn succeeded(call: &Call) -> bool {
    call.result == "0" || call.result.starts_with(|c: char| c.is_ascii_digit())
}

/// Runs `dstl run ARGS` under strace, keeping its data and manifests; returns the trace's
/// calls and the final manifests.
fn traced_run(dir: &Path, args: &[&str]) -> (Vec<Call>, Vec<PathBuf>) {
    let trace = dir.join("trace");
    let manifests = dir.join("manifests");
    let data = dir.join("data");
    let status = Command::new("strace")
        .args(["-f", "-y", "-qq", "-s", "0"])
        .args([
            "-e",
            "trace=openat,write,writev,pwrite64,ftruncate,fdatasync,fsync,renameat2,renameat,rename,link",
        ])
        .arg("-o")
        .arg(&trace)
        .arg(env!("CARGO_BIN_EXE_dstl"))
        .arg("run")
        .arg("--dir")
        .arg(&data)
        .arg("--manifests")
        .arg(&manifests)
        .args(args)
        .env_remove("RUST_LOG")
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run strace (the durability test needs it: `apt-get install strace`): {e}")
        });
    assert!(status.success(), "dstl run under strace: {status}");
    let text = std::fs::read_to_string(&trace).unwrap();
    let mut finals: Vec<PathBuf> = std::fs::read_dir(&manifests)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    finals.sort();
    assert!(!finals.is_empty(), "the run wrote manifests");
    (parse(&text), finals)
}

/// Checks the order for every file the final manifests name; returns how many staging
/// files were opened with `O_DIRECT`, and how many files were checked.
fn check_order(calls: &[Call], manifests: &[PathBuf]) -> (usize, usize) {
    let mut direct = 0;
    let mut checked = 0;
    for manifest in manifests {
        let text = std::fs::read_to_string(manifest).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let manifest_path = manifest.to_str().unwrap();
        let placed = calls
            .iter()
            .filter(|c| matches!(c.name.as_str(), "rename" | "renameat" | "renameat2"))
            .filter(|c| succeeded(c))
            .filter(|c| quoted(&c.args).get(1) == Some(&manifest_path))
            .max_by_key(|c| c.exit)
            .unwrap_or_else(|| panic!("no rename put {manifest_path} in place"));
        for entry in json["entries"].as_array().unwrap() {
            let file = entry["path"].as_str().unwrap();
            let file_dir = Path::new(file).parent().unwrap().to_str().unwrap();
            // 3. The publishing rename (or link) of a staging name to the file.
            let publish = calls
                .iter()
                .filter(|c| matches!(c.name.as_str(), "renameat2" | "link") && succeeded(c))
                .find(|c| quoted(&c.args).get(1) == Some(&file))
                .unwrap_or_else(|| panic!("{file} was never published by a rename"));
            let staging = quoted(&publish.args)[0];
            assert!(
                Path::new(staging).parent() == Path::new(file).parent(),
                "{staging} is staged beside {file}"
            );
            if publish.name == "renameat2" {
                assert!(
                    publish.args.contains("RENAME_NOREPLACE"),
                    "{file}: {publish:?}"
                );
            }
            let opened = calls
                .iter()
                .find(|c| c.name == "openat" && quoted(&c.args).first() == Some(&staging))
                .unwrap_or_else(|| panic!("{staging} was never opened"));
            assert!(opened.args.contains("O_EXCL"), "{opened:?}");
            if opened.args.contains("O_DIRECT") {
                direct += 1;
            }
            let on_staging = |c: &&Call| fd_path(&c.args) == Some(staging);
            // 1. Writes and the cut to length, all done before ...
            let last_write = calls
                .iter()
                .filter(|c| {
                    matches!(
                        c.name.as_str(),
                        "write" | "writev" | "pwrite64" | "ftruncate"
                    )
                })
                .filter(on_staging)
                .map(|c| c.exit)
                .max()
                .unwrap_or_else(|| panic!("no write to {staging}"));
            // 2. ... the file's sync, which is done before the rename starts.
            let synced = calls
                .iter()
                .filter(|c| matches!(c.name.as_str(), "fdatasync" | "fsync") && succeeded(c))
                .filter(on_staging)
                .find(|c| c.entry > last_write && c.exit < publish.entry)
                .unwrap_or_else(|| {
                    panic!("{staging} was not synced between its last write and its rename")
                });
            // 4. A sync of the directory after the rename, done before the manifest's
            //    rename starts (5.).
            calls
                .iter()
                .filter(|c| c.name == "fsync" && succeeded(c))
                .filter(|c| fd_path(&c.args) == Some(file_dir))
                .find(|c| c.entry > publish.exit && c.exit < placed.entry)
                .unwrap_or_else(|| {
                    panic!(
                        "{file_dir} was not synced between the rename of {file} and the manifest {manifest_path} (file synced at line {})",
                        synced.exit
                    )
                });
            checked += 1;
        }
    }
    (direct, checked)
}

/// Runs 2 writers appending `changes` changes of `change_size` bytes, checkpointing every
/// `checkpoint_every` appends, with `extra` arguments, under strace, and checks the order
/// for every file its manifests name; returns how many of those files were written with
/// `O_DIRECT`, and how many were checked (at least one).
fn check_run(
    changes: &str,
    change_size: &str,
    checkpoint_every: &str,
    extra: &[&str],
) -> (usize, usize) {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--writers",
        "2",
        "--changes",
        changes,
        "--change-size",
        change_size,
        "--checkpoint-every",
        checkpoint_every,
    ];
    args.extend(extra);
    let (calls, manifests) = traced_run(tmp.path(), &args);
    let (direct, checked) = check_order(&calls, &manifests);
    assert!(checked > 0);
    (direct, checked)
}

#[test]
fn large_files_are_written_past_the_page_cache_and_synced_before_they_count() {
    // 4 KiB changes, 500 per checkpoint and writer: files of about 2 MB and more.
    let (direct, checked) = check_run("8000", "4096", "500", &[]);
    assert_eq!(
        direct, checked,
        "every large file was written with O_DIRECT (this file system refuses it?)"
    );
}

#[test]
fn small_files_go_through_the_page_cache_and_are_synced_before_they_count() {
    // 100-byte changes, 100 per checkpoint and writer, each uploaded alone: files of about
    // 10 KB.
    let (direct, _) = check_run(
        "2000",
        "100",
        "100",
        &["--conf", "dstl.dfs.batch.persist-delay=0"],
    );
    assert_eq!(direct, 0, "small files are written through the page cache");
}
