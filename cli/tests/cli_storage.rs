//! The CLI with object stores, configuration files and orphan collection.

// Shared with the tests crate; this binary uses only part of it.
#[allow(dead_code)]
#[path = "../../tests/src/seaweed.rs"]
mod seaweed;

mod support;

use std::path::Path;
use std::process::{Command, Output};

fn dstl(dir: &Path, args: &[&str]) -> Output {
    support::command(dir).args(args).output().unwrap()
}

/// `dstl args` in `dir`, with `--conf` arguments that point it at `server`.
fn dstl_s3(dir: &Path, server: &seaweed::Seaweed, args: &[&str]) -> Output {
    let conf: Vec<String> = server
        .conf()
        .into_iter()
        .flat_map(|c| ["--conf".to_string(), c])
        .collect();
    let mut args = args.to_vec();
    args.extend(conf.iter().map(String::as_str));
    dstl(dir, &args)
}

/// `dstl run` of 2 writers and 20000 changes in `dir` against the store at `url` on
/// `server`, with `extra` arguments.
fn run_s3(dir: &Path, server: &seaweed::Seaweed, url: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "--store",
        url,
        "--writers",
        "2",
        "--changes",
        "20000",
    ];
    args.extend(extra);
    dstl_s3(dir, server, &args)
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "dstl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The stderr of a `dstl` that must have failed.
fn failure(output: &Output) -> String {
    assert!(!output.status.success(), "dstl succeeded: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `dstl gc --manifests MANIFESTS EXTRA --delete --grace 0s` in `dir`: deletes what it
/// judges unreferenced, however young.
fn gc_delete_now(dir: &Path, manifests: &str, extra: &[&str]) -> Output {
    let mut args = vec!["gc", "--manifests", manifests];
    args.extend(extra);
    args.extend(["--delete", "--grace", "0s"]);
    dstl(dir, &args)
}

/// Sets the modification time of `file` two hours back: older than gc's default grace
/// period.
fn backdate(file: &Path) {
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    std::fs::File::options()
        .write(true)
        .open(file)
        .unwrap()
        .set_modified(old)
        .unwrap();
}

#[test]
fn run_and_read_against_an_s3_store() {
    let server = seaweed::Seaweed::start("clirun");
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("s3://{}/jobs", server.bucket);
    let out = run_s3(tmp.path(), &server, &url, &["--manifests", "m", "--json"]);
    let summary: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(summary["verified"], true);
    assert!(
        summary["dir"]
            .as_str()
            .unwrap()
            .starts_with("s3://clirun/jobs/")
    );
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("m/op-0.json")).unwrap())
            .unwrap();
    assert!(
        manifest["entries"][0]["path"]
            .as_str()
            .unwrap()
            .starts_with("s3://clirun/jobs/")
    );
    let digest = stdout(&dstl_s3(
        tmp.path(),
        &server,
        &["read", "m/op-0.json", "--digest"],
    ));
    assert!(digest.starts_with("changes=10000 sha256="), "{digest}");
}

/// A run against an object store that is not kept deletes the job's objects after
/// verification; one that is kept leaves them; and a run that is not kept refuses a job
/// whose prefix holds objects already (they are not the run's to delete).
#[test]
fn a_run_that_is_not_kept_removes_its_objects() {
    use dstl::Store;
    let server = seaweed::Seaweed::start("clidel");
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("s3://{}/jobs", server.bucket);
    let objects = || {
        dstl::S3Store::open(&server.settings(), &server.bucket, "jobs", "")
            .unwrap()
            .list()
            .unwrap()
    };
    let run = |extra: &[&str]| run_s3(tmp.path(), &server, &url, extra);
    let summary: serde_json::Value =
        serde_json::from_str(stdout(&run(&["--json"])).trim()).unwrap();
    assert_eq!(summary["verified"], true, "{summary}");
    assert_eq!(summary["kept"], false, "{summary}");
    assert!(summary["files"].as_u64().unwrap() > 0, "{summary}");
    assert!(
        summary["dir"]
            .as_str()
            .unwrap()
            .starts_with("s3://clidel/jobs/"),
        "{summary}"
    );
    assert_eq!(
        objects(),
        [],
        "every object of the run deleted, its lease too"
    );
    assert!(!tmp.path().join("dstl-data").exists());

    let job = "b".repeat(32);
    let job_conf = format!("dstl.job-id={job}");
    let human = stdout(&run(&["--keep", "--conf", &job_conf]));
    assert!(
        human.contains(&format!(
            "data            kept in s3://clidel/jobs/{job}/dstl"
        )),
        "{human}"
    );
    let kept = objects();
    assert!(!kept.is_empty());
    let stderr = failure(&run(&["--conf", &job_conf]));
    assert!(
        stderr.contains(&format!("s3://clidel/jobs/{job} already holds"))
            && stderr.contains("--keep"),
        "{stderr}"
    );
    assert_eq!(objects(), kept, "nothing deleted");
}

#[test]
fn a_bad_configuration_file_is_rejected_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("dstl.toml"),
        "[dstl.dfs]\nupload.timeout = \"soon\"\n",
    )
    .unwrap();
    let out = dstl(tmp.path(), &["run", "--config", "dstl.toml", "--json"]);
    let stderr = failure(&out);
    assert!(stderr.contains("dstl.toml"), "{stderr}");
    assert!(
        stderr.contains("`dstl.dfs.upload.timeout`")
            && stderr.contains("a duration of at most 1 d, such as"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    assert!(!tmp.path().join("dstl-data").exists(), "nothing is written");
    // A good file applies, and --conf overrides it.
    std::fs::write(
        tmp.path().join("dstl.toml"),
        "\"dstl.dfs.upload.timeout\" = \"3 s\"\n[dstl.dfs]\ncompression.enabled = true\n",
    )
    .unwrap();
    let text = stdout(&dstl(
        tmp.path(),
        &[
            "config",
            "--config",
            "dstl.toml",
            "--conf",
            "dstl.dfs.compression.enabled=false",
        ],
    ));
    assert!(
        text.contains("dstl.dfs.upload.timeout = \"3000 ms\""),
        "{text}"
    );
    assert!(
        text.contains("dstl.dfs.compression.enabled = \"false\""),
        "{text}"
    );
    // Store URLs that would escape are refused by name.
    let out = dstl(tmp.path(), &["run", "--store", "s3://bucket/../../etc"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"..\""),
        "{out:?}"
    );
}

#[test]
fn gc_lists_and_deletes_only_old_unreferenced_files() {
    let tmp = tempfile::tempdir().unwrap();
    stdout(&dstl(
        tmp.path(),
        &[
            "run",
            "--writers",
            "2",
            "--changes",
            "4000",
            "--checkpoint-every",
            "1000",
            "--manifests",
            "m",
            "--json",
        ],
    ));
    let job = std::fs::read_dir(tmp.path().join("dstl-data"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let dir = job.join("dstl");
    // Leftovers of a crash: an uploaded file never referenced, and a staging file.
    let orphan = dir.join("00000000-0000-0000-0000-000000000000");
    let staging = dir.join(".11111111-1111-1111-1111-111111111111.7.tmp");
    for f in [&orphan, &staging] {
        std::fs::write(f, b"\x00").unwrap();
        backdate(f);
    }
    let before: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let listed = stdout(&dstl(tmp.path(), &["gc", "--manifests", "m"]));
    assert!(listed.contains(&orphan.display().to_string()), "{listed}");
    assert!(listed.contains(&staging.display().to_string()), "{listed}");
    assert!(listed.contains("2 orphans"), "{listed}");
    assert!(listed.contains("nothing deleted"), "{listed}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), before.len());
    // Files younger than the grace period are left alone, referenced or not.
    let young = stdout(&dstl(
        tmp.path(),
        &["gc", "--manifests", "m", "--grace", "3h"],
    ));
    assert!(young.contains("0 orphans"), "{young}");
    let deleted = stdout(&dstl(tmp.path(), &["gc", "--manifests", "m", "--delete"]));
    assert!(deleted.contains("deleted 2"), "{deleted}");
    assert!(!orphan.exists() && !staging.exists());
    // Everything the manifests reference still reads.
    for writer in ["op-0", "op-1"] {
        let digest = stdout(&dstl(
            tmp.path(),
            &["read", &format!("m/{writer}.json"), "--digest"],
        ));
        assert!(digest.starts_with("changes=2000 "), "{digest}");
    }
    // A broken manifest stops collection instead of deleting with half the picture.
    std::fs::write(tmp.path().join("m/broken.json"), b"{").unwrap();
    let stderr = failure(&dstl(tmp.path(), &["gc", "--manifests", "m", "--delete"]));
    assert!(stderr.contains("broken.json"), "{stderr}");
}

/// Runs `dstl run` for job `job` into `./dstl-data`, its manifests into `manifests`.
fn run_job(dir: &Path, job: &str, manifests: &str) {
    stdout(&dstl(
        dir,
        &[
            "run",
            "--writers",
            "2",
            "--changes",
            "6000",
            "--checkpoint-every",
            "1000",
            "--manifests",
            manifests,
            "--conf",
            &format!("dstl.job-id={job}"),
            "--conf",
            "dstl.local-recovery.enabled=true",
            "--json",
        ],
    ));
}

fn files_of(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| rd.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

/// Two jobs share a base directory (the usual `<base>/<job-id>/dstl` layout): collecting
/// either one, with no grace period, never touches the other's files.
#[test]
fn gc_of_one_job_leaves_another_job_in_the_same_base_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let jobs = [("a".repeat(32), "ma"), ("b".repeat(32), "mb")];
    for (job, manifests) in &jobs {
        run_job(tmp.path(), job, manifests);
    }
    let base = tmp.path().join("dstl-data");
    let both_digests = || [digests(tmp.path(), "ma"), digests(tmp.path(), "mb")];
    let before = both_digests();
    for (n, (job, manifests)) in jobs.iter().enumerate() {
        let (other, _) = &jobs[1 - n];
        let other_dir = base.join(other).join("dstl");
        let other_local_dir = base.join("local").join(format!("jid_{other}/taskowned"));
        let other_files = files_of(&other_dir);
        let other_local = files_of(&other_local_dir);
        assert!(!other_files.is_empty() && !other_local.is_empty());
        let out = stdout(&gc_delete_now(tmp.path(), manifests, &[]));
        assert!(out.contains(&format!("jobs collected: {job}")), "{out}");
        assert!(
            out.contains("jobs skipped") && out.contains(other.as_str()),
            "{out}"
        );
        assert_eq!(files_of(&other_dir), other_files, "{out}");
        assert_eq!(files_of(&other_local_dir), other_local);
        // Every manifest of both jobs still reads back the same.
        assert_eq!(both_digests(), before);
    }
}

/// A manifest directory with no manifest would make every file look unreferenced: gc
/// refuses instead of deleting everything past the grace period.
#[test]
fn gc_refuses_an_empty_manifest_directory() {
    let tmp = tempfile::tempdir().unwrap();
    run_job(tmp.path(), &"c".repeat(32), "m");
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    let dir = tmp
        .path()
        .join("dstl-data")
        .join("c".repeat(32))
        .join("dstl");
    let before = files_of(&dir);
    let stderr = failure(&gc_delete_now(tmp.path(), "empty", &[]));
    assert!(stderr.contains("holds no manifest"), "{stderr}");
    assert_eq!(files_of(&dir), before);
    // A job named explicitly must be a job id.
    let stderr = failure(&dstl(
        tmp.path(),
        &["gc", "--manifests", "m", "--job", "../etc"],
    ));
    assert!(stderr.contains("invalid job id `../etc`"), "{stderr}");
}

/// Manifests of a job that wrote elsewhere than `--dir`: gc says so instead of quietly
/// treating everything under `--dir` as unreferenced.
#[test]
fn gc_warns_when_no_manifest_path_lies_under_the_dir() {
    let tmp = tempfile::tempdir().unwrap();
    run_job(tmp.path(), &"d".repeat(32), "m");
    std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
    let out = dstl(
        tmp.path(),
        &["gc", "--manifests", "m", "--dir", "elsewhere"],
    );
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: no file the manifests in m name lies under elsewhere"),
        "{stderr}"
    );
    // Against the base the job wrote to, no warning.
    let out = dstl(tmp.path(), &["gc", "--manifests", "m"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{out:?}"
    );
}

/// The digests of both writers' manifests in `manifests`.
fn digests(dir: &Path, manifests: &str) -> Vec<String> {
    ["op-0", "op-1"]
        .iter()
        .map(|w| {
            stdout(&dstl(
                dir,
                &["read", &format!("{manifests}/{w}.json"), "--digest"],
            ))
        })
        .collect()
}

/// gc recognizes a file by what it is, not how its path is spelled: after the base moved
/// and a symlink took its old place, the manifests' paths lead to the listed files
/// through the link, and gc deletes none of them.
#[test]
fn gc_through_a_symlinked_base_keeps_every_manifest_readable() {
    let tmp = tempfile::tempdir().unwrap();
    run_job(tmp.path(), &"d".repeat(32), "m");
    let before = digests(tmp.path(), "m");
    std::fs::rename(tmp.path().join("dstl-data"), tmp.path().join("moved")).unwrap();
    std::os::unix::fs::symlink("moved", tmp.path().join("dstl-data")).unwrap();
    assert_eq!(digests(tmp.path(), "m"), before);
    let dir = tmp.path().join("moved").join("d".repeat(32)).join("dstl");
    let files = files_of(&dir);
    let out = stdout(&gc_delete_now(tmp.path(), "m", &[]));
    assert!(out.contains("0 orphans"), "{out}");
    assert_eq!(files_of(&dir), files);
    assert_eq!(digests(tmp.path(), "m"), before);
}

/// A manifest that names the job's files under another base (here a copy of the base)
/// makes gc refuse, saying so, instead of judging the listed files unused.
#[test]
fn gc_refuses_manifests_written_for_another_base() {
    let tmp = tempfile::tempdir().unwrap();
    let job = "e".repeat(32);
    run_job(tmp.path(), &job, "m");
    let copy = tmp.path().join("copy");
    let status = Command::new("cp")
        .args(["-a", "dstl-data", "copy"])
        .current_dir(tmp.path())
        .status()
        .unwrap();
    assert!(status.success());
    let dir = copy.join(&job).join("dstl");
    let files = files_of(&dir);
    let stderr = failure(&gc_delete_now(tmp.path(), "m", &["--dir", "copy"]));
    assert!(stderr.contains("another base"), "{stderr}");
    assert_eq!(files_of(&dir), files);
}

/// gc stays inside the base: a job's `dstl/` that is a symlink to a directory elsewhere,
/// and symlinked files, are reported as skipped and never followed.
#[test]
fn gc_does_not_follow_symlinks_out_of_the_base() {
    let tmp = tempfile::tempdir().unwrap();
    let job = "f".repeat(32);
    run_job(tmp.path(), &job, "m");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let precious = elsewhere.join("00000000-0000-0000-0000-000000000001");
    std::fs::write(&precious, b"not dstl's").unwrap();
    backdate(&precious);
    let other_job = tmp.path().join("dstl-data").join("1".repeat(32));
    std::fs::create_dir(&other_job).unwrap();
    std::os::unix::fs::symlink(&elsewhere, other_job.join("dstl")).unwrap();
    let dir = tmp.path().join("dstl-data").join(&job).join("dstl");
    let link = dir.join("00000000-0000-0000-0000-000000000002");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    let out = stdout(&gc_delete_now(tmp.path(), "m", &["--job", &"1".repeat(32)]));
    assert!(out.contains("skipped symbolic link"), "{out}");
    assert!(out.contains(&link.display().to_string()), "{out}");
    assert!(precious.exists(), "{out}");
    assert!(std::fs::symlink_metadata(&link).is_ok(), "{out}");
    assert_eq!(digests(tmp.path(), "m").len(), 2);
}
