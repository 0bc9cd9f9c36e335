//! Where `dstl run` leaves its data (README.md, "CLI"): removed after verification unless
//! kept, and then only what the run created; a full disk as one error; SIGINT and
//! SIGTERM as a clean stop. Through the real binary on real file systems.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;
use support::{describe, s};

/// `dstl args` in `cwd`, with `TMPDIR` set to `tmp`: where a run that is not kept goes.
fn dstl(cwd: &Path, tmp: &Path, args: &[&str]) -> Output {
    support::command(cwd)
        .args(args)
        .env("TMPDIR", tmp)
        .output()
        .expect("the dstl binary starts")
}

fn ok(cwd: &Path, tmp: &Path, args: &[&str]) -> String {
    support::succeeded(args, &dstl(cwd, tmp, args))
}

/// Every path below `dir` (files and directories), relative to it.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            out.insert(path.strip_prefix(dir).unwrap().to_path_buf());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    out
}

/// A small run: 2 writers, 20000 changes.
const SMALL: [&str; 6] = [
    "--writers",
    "2",
    "--changes",
    "20000",
    "--checkpoint-every",
    "1000",
];

fn args<'a>(head: &[&'a str], tail: &[&'a str]) -> Vec<&'a str> {
    head.iter().chain(&SMALL).chain(tail).copied().collect()
}

fn parse_json(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// A fresh directory holding two empty ones, `cwd` and `tmp`: a run's working directory
/// and its `TMPDIR`.
fn cwd_and_tmp() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let (cwd, tmp) = (root.path().join("cwd"), root.path().join("tmp"));
    std::fs::create_dir(&cwd).unwrap();
    std::fs::create_dir(&tmp).unwrap();
    (root, cwd, tmp)
}

/// The README's main job, `dstl run` with no options, leaves nothing behind: its data
/// went to a directory of its own under the temporary directory, removed after
/// verification, and the summary says so.
#[test]
fn a_run_that_is_not_kept_removes_its_temporary_directory() {
    let (_root, cwd, tmp) = cwd_and_tmp();
    let tmp_real = std::fs::canonicalize(&tmp).unwrap();

    let out = ok(&cwd, &tmp, &["run"]);
    let first = out.lines().next().unwrap_or_default();
    let into = first
        .split(" into ")
        .nth(1)
        .unwrap_or_else(|| panic!("the first line names the directory: {out}"));
    assert!(
        Path::new(into).starts_with(tmp_real.join("")) && into.contains("/dstl-run-"),
        "written under $TMPDIR/dstl-run-*: {out}"
    );
    assert!(out.contains("verified        yes"), "{out}");
    assert!(
        out.contains("data            removed after verification (--keep keeps it)"),
        "{out}"
    );
    assert_eq!(
        tree(&tmp),
        BTreeSet::new(),
        "the temporary directory is gone"
    );
    assert_eq!(
        tree(&cwd),
        BTreeSet::new(),
        "nothing in the working directory"
    );

    let summary = parse_json(&ok(&cwd, &tmp, &args(&["run", "--json"], &[])));
    assert_eq!(summary["verified"], true, "{summary}");
    assert_eq!(summary["kept"], false, "{summary}");
    assert!(summary["files"].as_u64().unwrap() > 0, "{summary}");
    let dir = summary["dir"].as_str().unwrap();
    assert!(Path::new(dir).starts_with(&tmp_real), "{summary}");
    assert!(!Path::new(dir).exists(), "{summary}");
    assert_eq!(tree(&tmp), BTreeSet::new());
    assert_eq!(tree(&cwd), BTreeSet::new());
}

/// `--keep` keeps the data in ./dstl-data (`<job-id>/dstl/<file>`) and names the
/// directory: in the summary, and as `dir` (absolute) under `--json`.
#[test]
fn keep_keeps_the_data_in_dstl_data_and_names_the_directory() {
    let (_root, cwd, tmp) = cwd_and_tmp();
    let data = std::fs::canonicalize(&cwd).unwrap().join("dstl-data");

    let out = ok(&cwd, &tmp, &args(&["run", "--keep"], &[]));
    let kept = out
        .lines()
        .find_map(|l| l.strip_prefix("  data            kept in "))
        .unwrap_or_else(|| panic!("a `data  kept in DIR` line: {out}"));
    let kept = Path::new(kept);
    assert!(kept.starts_with(&data) && kept.ends_with("dstl"), "{out}");
    assert!(std::fs::read_dir(kept).unwrap().count() > 0, "{out}");
    for path in tree(&data) {
        if data.join(&path).is_file() {
            // <job-id>/dstl/<file>
            let parts: Vec<_> = path.components().collect();
            assert_eq!(parts.len(), 3, "{}", path.display());
            assert_eq!(parts[1].as_os_str(), "dstl", "{}", path.display());
        }
    }

    let summary = parse_json(&ok(&cwd, &tmp, &args(&["run", "--keep", "--json"], &[])));
    assert_eq!(summary["kept"], true, "{summary}");
    let dir = Path::new(summary["dir"].as_str().unwrap());
    assert!(dir.is_absolute() && dir.starts_with(&data), "{summary}");
    let files = std::fs::read_dir(dir).unwrap().count() as u64;
    assert!(files > 0, "{summary}");
    assert_eq!(tree(&tmp), BTreeSet::new(), "nothing in $TMPDIR");
}

/// With `--dir` and no `--keep`, the run removes only what it created: its job
/// directory, its local copies, and directories of the path that did not exist; a
/// user's files and other jobs' directories beside them stay.
#[test]
fn an_explicit_dir_loses_only_what_the_run_created() {
    let (root, cwd, tmp) = cwd_and_tmp();
    let base = root.path().join("base");
    std::fs::create_dir_all(base.join("1".repeat(32)).join("dstl")).unwrap();
    std::fs::create_dir_all(base.join("local").join("jid_other")).unwrap();
    std::fs::write(base.join("precious.txt"), b"mine").unwrap();
    std::fs::write(
        base.join("1".repeat(32))
            .join("dstl")
            .join("00000000-0000-0000-0000-000000000000"),
        b"\x00",
    )
    .unwrap();
    std::fs::write(base.join("local").join("keep.txt"), b"mine too").unwrap();
    let before = tree(&base);

    let local = ["--conf", "dstl.local-recovery.enabled=true", "--json"];
    let summary = parse_json(&ok(&cwd, &tmp, &args(&["run", "--dir", s(&base)], &local)));
    assert_eq!(summary["verified"], true, "{summary}");
    assert_eq!(summary["kept"], false, "{summary}");
    let dir = Path::new(summary["dir"].as_str().unwrap());
    assert!(
        dir.starts_with(std::fs::canonicalize(&base).unwrap()),
        "{summary}"
    );
    assert_eq!(tree(&base), before, "{summary}");

    // Directories of the path that did not exist are the run's too.
    let deeper = base.join("new").join("deeper");
    ok(&cwd, &tmp, &args(&["run", "--dir", s(&deeper)], &local));
    assert!(!base.join("new").exists());
    assert_eq!(tree(&base), before);
    assert_eq!(tree(&cwd), BTreeSet::new());
    assert_eq!(tree(&tmp), BTreeSet::new());
}

/// A job directory that exists already (an explicit `dstl.job-id`) is not the run's to
/// remove: without --keep the run refuses, naming it, and touches nothing; with --keep
/// it adds to it.
#[test]
fn a_run_that_is_not_kept_refuses_an_existing_job_directory() {
    let root = tempfile::tempdir().unwrap();
    let tmp = root.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let base = root.path().join("base");
    let job = "a".repeat(32);
    let old = base
        .join(&job)
        .join("dstl")
        .join("00000000-0000-0000-0000-000000000000");
    std::fs::create_dir_all(old.parent().unwrap()).unwrap();
    std::fs::write(&old, b"\x00").unwrap();
    let before = tree(&base);
    let job_conf = format!("dstl.job-id={job}");
    let run = args(&["run", "--dir", s(&base)], &["--conf", &job_conf]);
    let out = dstl(root.path(), &tmp, &run);
    assert!(!out.status.success(), "{}", describe(&run, &out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{} already exists", base.join(&job).display()))
            && stderr.contains("--keep"),
        "{stderr}"
    );
    assert_eq!(tree(&base), before);

    let kept = args(
        &["run", "--dir", s(&base), "--keep", "--json"],
        &["--conf", &job_conf],
    );
    let summary = parse_json(&ok(root.path(), &tmp, &kept));
    assert_eq!(summary["kept"], true, "{summary}");
    assert!(old.exists());
    assert!(tree(&base).len() > before.len(), "the run added its files");
}

/// What a `dstl run` on a file system of its own did.
struct FileSystemRun {
    /// Its `--dir`, `data` on the file system.
    data: PathBuf,
    out: Output,
    /// What was left on the file system when it ended (relative paths, one per line).
    left: String,
    /// The command, its outputs and what was left, for failure messages.
    report: String,
}

/// Runs `dstl run --dir <mount>/data args` where `<mount>` is a file system of type `fs`
/// mounted with `options`, in a mount namespace of its own (see [`on_file_system`]).
fn run_on_file_system(fs: &str, options: &str, args: &[&str]) -> FileSystemRun {
    let root = tempfile::tempdir().unwrap();
    let mount = root.path().join(fs);
    let data = mount.join("data");
    let run = [&["run", "--dir", s(&data)], args].concat();
    let (out, left) = on_file_system(&mount, fs, options, &run);
    let report = format!("{}\nleft on the {fs}:\n{left}", describe(&run, &out));
    FileSystemRun {
        data,
        out,
        left,
        report,
    }
}

/// Runs `dstl args` in a mount namespace of its own where `mount` is a file system of
/// type `fs` mounted with `options`; returns its output and what was left on it when it
/// ended (relative paths, one per line).
fn on_file_system(mount: &Path, fs: &str, options: &str, args: &[&str]) -> (Output, String) {
    std::fs::create_dir_all(mount).unwrap();
    let listing = mount.with_extension("left");
    // The mount lives and dies with the namespace: nothing to unmount, even if the test
    // fails. Root needs only a mount namespace; anyone else maps to root in a user
    // namespace first.
    // SAFETY: geteuid has no preconditions.
    let namespaces: &[&str] = if unsafe { libc::geteuid() } == 0 {
        &["--mount"]
    } else {
        &["--user", "--map-root-user", "--mount"]
    };
    let script = r#"mount -t "$1" -o "$2" "$1" "$3" || exit 99
        mount="$3" listing="$4"; shift 4
        cd "$mount" && "$@"; status=$?
        find . -mindepth 1 > "$listing" || exit 98; exit $status"#;
    let out = Command::new("unshare")
        .args(namespaces)
        .args(["sh", "-c", script, "sh", fs, options, s(mount), s(&listing)])
        .arg(env!("CARGO_BIN_EXE_dstl"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("unshare (util-linux) starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() != Some(99) && !stderr.contains("unshare:"),
        "this test mounts a {fs} in a namespace of its own, which needs root or unprivileged user namespaces: {stderr}"
    );
    assert_ne!(
        out.status.code(),
        Some(98),
        "cannot list the {fs}: {stderr}"
    );
    let left = std::fs::read_to_string(&listing)
        .unwrap_or_else(|e| panic!("no listing of the {fs} at {}: {e}", listing.display()));
    (out, left)
}

/// A file system that creates a file opened with `O_DIRECT` and then refuses the flag
/// with `EINVAL` (ramfs; tmpfs before Linux 6.6, as on RHEL 8 and 9): large fsync'd
/// uploads, which are written directly elsewhere, go through the page cache, the first
/// one included. Without retries, a first upload that failed would fail the run.
#[test]
fn a_file_system_that_refuses_o_direct_takes_large_uploads_through_the_page_cache() {
    // Checkpoints of 1,000 changes of 1,000 bytes per writer: every file is past the
    // 256 KiB from which uploads are written directly.
    let FileSystemRun {
        out, left, report, ..
    } = run_on_file_system(
        "ramfs",
        "mode=0755",
        &[
            "--writers",
            "2",
            "--changes",
            "8000",
            "--change-size",
            "1000",
            "--checkpoint-every",
            "1000",
            "--json",
            "--conf",
            "dstl.dfs.upload.retry-policy=none",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{report}");
    let summary = parse_json(std::str::from_utf8(&out.stdout).unwrap());
    assert_eq!(summary["verified"], true, "{report}");
    assert!(summary["checkpoints"].as_u64().unwrap() >= 8, "{report}");
    assert_eq!(left.trim(), "", "the run removed its data: {report}");
}

/// A full disk: the run stops at the first failed upload with one error that says "no
/// space left on device" and names the directory, after at most a warning or two (not one
/// per change set and batch), and removes what it wrote, freeing the space.
#[test]
fn a_full_disk_stops_the_run_with_one_error_naming_the_directory() {
    // Long enough that a run carrying on after the first failure would still be going;
    // and checkpoints of 10 MB, so that the files the run keeps (each writer's last
    // checkpoint) cannot fit in 8 MB however soon it deletes subsumed ones.
    let started = Instant::now();
    let FileSystemRun {
        data,
        out,
        left,
        report,
    } = run_on_file_system(
        "tmpfs",
        "size=8m",
        &[
            "--duration",
            "60s",
            "--writers",
            "4",
            "--checkpoint-every",
            "100000",
        ],
    );
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(took < Duration::from_secs(30), "took {took:?}: {report}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {report}");
    let error = errors[0];
    assert!(
        error.starts_with(&format!(
            "error: no space left on device in {}/",
            data.display()
        )),
        "{report}"
    );
    assert!(
        error.contains("(os error 28)") && error.ends_with("the run's data was removed"),
        "{report}"
    );
    let warnings = stderr.lines().filter(|l| l.contains(" WARN ")).count();
    assert_eq!(warnings, 1, "one warning: {report}");
    assert_eq!(stderr.lines().count(), 2, "{report}");
    assert_eq!(left.trim(), "", "nothing left on the tmpfs: {report}");
    assert!(out.stdout.is_empty(), "{report}");
}

/// A running `dstl run` in the background, its stderr captured.
struct Running {
    child: std::process::Child,
}

impl Running {
    fn start(cwd: &Path, args: &[&str]) -> Self {
        let child = support::command(cwd)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the dstl binary starts");
        Self { child }
    }

    /// Waits (at most 60 s) until `ready` holds.
    fn wait_for(&mut self, what: &str, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready() {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("dstl run ended ({status}) before {what}");
            }
            assert!(Instant::now() < deadline, "no {what} within 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal`, then waits for the process to end, which it must do within 10 s,
    /// with exit status `code` and no panic; returns its stderr.
    fn stop(mut self, signal: i32, code: i32) -> String {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill has no memory-safety preconditions; the child is ours, not reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let sent = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if sent.elapsed() > Duration::from_secs(15) {
                let _ = self.child.kill();
                panic!("dstl run did not end within 15 s of signal {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = sent.elapsed();
        let mut stderr = String::new();
        use std::io::Read;
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(code), "{stderr}");
        assert!(took < Duration::from_secs(10), "took {took:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A run of 2 writers stopped by a signal long before its 10 minutes are up.
const LONG: [&str; 4] = ["--duration", "10 min", "--writers", "2"];

/// Whether some `<base>/<job>/dstl` holds a changelog file (not a staging file).
fn has_written(base: &Path) -> bool {
    std::fs::read_dir(base).into_iter().flatten().any(|job| {
        std::fs::read_dir(job.unwrap().path().join("dstl"))
            .into_iter()
            .flatten()
            .any(|f| !f.unwrap().file_name().to_string_lossy().starts_with('.'))
    })
}

/// SIGINT stops a run that is not kept: it ends within seconds with status 130, says
/// so, and the directory it created is gone.
#[test]
fn sigint_stops_the_run_and_removes_its_data() {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("d");
    let mut run = Running::start(
        root.path(),
        &[&["run", "--dir", s(&base)][..], &LONG].concat(),
    );
    run.wait_for("a changelog file", || has_written(&base));
    let stderr = run.stop(libc::SIGINT, 130);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: interrupted by SIGINT after ")
            && last.contains("the storage closed, releasing its lease")
            && last.ends_with("the run's data was removed"),
        "{stderr}"
    );
    assert!(!base.exists(), "{stderr}");
}

/// SIGTERM stops a run that keeps its data (--manifests): status 143; the lease is
/// released; the data stays where the message says; every manifest left reads back.
#[test]
fn sigterm_stops_a_kept_run_leaving_readable_manifests_and_no_lease() {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("d");
    let manifests = root.path().join("m");
    let mut run = Running::start(
        root.path(),
        &[
            &["run", "--dir", s(&base), "--manifests", s(&manifests)][..],
            &LONG,
            &["--checkpoint-every", "2000"],
        ]
        .concat(),
    );
    run.wait_for("both manifests", || {
        manifests.join("op-0.json").is_file() && manifests.join("op-1.json").is_file()
    });
    let stderr = run.stop(libc::SIGTERM, 143);
    let jobs: Vec<PathBuf> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job = &jobs[0];
    let last = stderr.lines().last().unwrap_or_default();
    let files = std::fs::canonicalize(job.join("dstl")).unwrap();
    assert!(
        last.starts_with("error: interrupted by SIGTERM after ")
            && last.contains(&format!("the data stays in {}", files.display())),
        "{stderr}"
    );
    let leases: Vec<_> = std::fs::read_dir(job.join("leases"))
        .map(|rd| rd.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert!(leases.is_empty(), "lease left: {leases:?}");
    for writer in ["op-0", "op-1"] {
        let manifest = manifests.join(format!("{writer}.json"));
        let out = dstl(
            root.path(),
            root.path(),
            &["read", s(&manifest), "--digest"],
        );
        assert!(out.status.success(), "{}", describe(&["read"], &out));
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("changes="),
            "{out:?}"
        );
    }
}
