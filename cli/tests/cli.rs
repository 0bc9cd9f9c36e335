//! The `dstl` command line, run as a separate process (README.md, "CLI"): `run`,
//! `read`, `inspect` and `config`, their outputs and their errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

mod support;
use support::{describe, s};

/// The files Apache Flink 2.3.0 wrote, kept in the repository (`tests/golden/`).
const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden");

fn golden_dir() -> PathBuf {
    let dir = PathBuf::from(GOLDEN);
    assert!(
        dir.join("README.md").is_file(),
        "golden files not found at {}: the checkout is incomplete",
        dir.display()
    );
    dir
}

fn dstl(cwd: &Path, args: &[&str]) -> Output {
    support::command(cwd)
        .args(args)
        .output()
        .expect("the dstl binary starts")
}

/// Runs `dstl args` and returns its stdout, failing the test if it fails.
fn ok(cwd: &Path, args: &[&str]) -> String {
    support::succeeded(args, &dstl(cwd, args))
}

/// Runs `dstl args`, which must fail; returns its stderr.
fn fails(cwd: &Path, args: &[&str]) -> (String, String) {
    let out = dstl(cwd, args);
    assert!(
        !out.status.success(),
        "expected a failure\n{}",
        describe(args, &out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.trim().is_empty(), "{}", describe(args, &out));
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

fn unhex(text: &str) -> Vec<u8> {
    assert!(text.len().is_multiple_of(2), "odd hex length: {text:?}");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses `dstl read` output, checking every line is `KEYGROUP<TAB>HEX` in lowercase.
fn parse_read(stdout: &str) -> Vec<(i32, Vec<u8>)> {
    stdout
        .lines()
        .map(|line| {
            let (key_group, value) = line
                .split_once('\t')
                .unwrap_or_else(|| panic!("not KEYGROUP<TAB>HEX: {line:?}"));
            assert!(
                value
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "not lowercase hex: {line:?}"
            );
            (key_group.parse().expect("key group"), unhex(value))
        })
        .collect()
}

/// The digest `dstl read --digest` prints (and the golden files record): per change, 4-byte BE key group, 4-byte BE value
/// length, value.
fn digest(changes: &[(i32, Vec<u8>)]) -> String {
    let mut hasher = Sha256::new();
    for (key_group, value) in changes {
        hasher.update(key_group.to_be_bytes());
        hasher.update((value.len() as u32).to_be_bytes());
        hasher.update(value);
    }
    hex(&hasher.finalize())
}

/// Parses `changes=N sha256=H` (the only line).
fn parse_digest(stdout: &str) -> (usize, String) {
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stdout:?}");
    let (n, h) = lines[0]
        .strip_prefix("changes=")
        .and_then(|rest| rest.split_once(" sha256="))
        .unwrap_or_else(|| panic!("not `changes=N sha256=H`: {stdout:?}"));
    assert_eq!(h.len(), 64, "{stdout:?}");
    (n.parse().expect("N"), h.to_string())
}

fn load_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("invalid JSON {}: {e}", path.display()))
}

/// Every regular file below `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    out
}

const SUMMARY_FIELDS: [&str; 13] = [
    "writers",
    "changes",
    "payload_bytes",
    "checkpoints",
    "files",
    "bytes_written",
    "wall_s",
    "appends_per_s",
    "payload_mb_per_s",
    "persist_p50_ms",
    "persist_p99_ms",
    "peak_rss_mb",
    "verified",
];

/// Parses stdout of `dstl run --json`: exactly one JSON object and nothing else.
fn parse_summary(stdout: &str) -> Value {
    let values: Vec<Value> = serde_json::Deserializer::from_str(stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}"));
    assert_eq!(values.len(), 1, "exactly one JSON value: {stdout:?}");
    let summary = values.into_iter().next().unwrap();
    assert!(summary.is_object(), "{summary}");
    for field in SUMMARY_FIELDS {
        assert!(
            summary.get(field).is_some(),
            "summary lacks `{field}`: {summary}"
        );
    }
    assert!(summary["metrics"].is_object(), "metrics object: {summary}");
    summary
}

fn number(summary: &Value, field: &str) -> f64 {
    summary[field]
        .as_f64()
        .unwrap_or_else(|| panic!("`{field}` is not a number: {summary}"))
}

fn count(summary: &Value, field: &str) -> u64 {
    summary[field]
        .as_u64()
        .unwrap_or_else(|| panic!("`{field}` is not a whole number: {summary}"))
}

/// Checks one manifest against contract 3 and returns its entries as (path, file_size,
/// offset, size).
fn check_manifest(path: &Path, data_dir: &Path) -> Vec<(PathBuf, u64, u64, u64)> {
    let manifest = load_json(path);
    assert_eq!(manifest["storage_id"], "filesystem", "{manifest}");
    assert_eq!(manifest["key_group_range"], json!({"start": 0, "end": 127}));
    assert!(
        manifest.get("local").is_none_or(Value::is_null),
        "no local copies without local recovery: {manifest}"
    );
    let entries: Vec<(PathBuf, u64, u64, u64)> = manifest["entries"]
        .as_array()
        .expect("entries array")
        .iter()
        .map(|e| {
            (
                PathBuf::from(e["path"].as_str().expect("path")),
                e["file_size"].as_u64().expect("file_size"),
                e["offset"].as_u64().expect("offset"),
                e["size"].as_u64().expect("size"),
            )
        })
        .collect();
    assert!(!entries.is_empty(), "{manifest}");
    let data_dir = std::fs::canonicalize(data_dir).unwrap();
    for (file, file_size, offset, _) in &entries {
        assert!(file.is_absolute(), "absolute path: {}", file.display());
        assert!(
            file.starts_with(&data_dir),
            "{} under --dir",
            file.display()
        );
        assert!(file.is_file(), "{} exists", file.display());
        assert!(offset < file_size, "{manifest}");
    }
    let sizes: u64 = entries.iter().map(|e| e.3).sum();
    assert_eq!(manifest["state_size"].as_u64(), Some(sizes), "{manifest}");
    entries
}

/// `dstl run --json` with 3 writers, then reads every writer's manifest back.
/// Every change a run's last checkpoints hold, by writer and change index (the first 8
/// bytes of every value).
type ReadBack = std::collections::BTreeMap<(String, u64), (i32, Vec<u8>)>;

/// `dstl run --json` of 3 writers, 30000 changes, a checkpoint every 2000, data in
/// `data` and manifests in `manifests`.
fn three_writers<'a>(data: &'a Path, manifests: &'a Path) -> Vec<&'a str> {
    vec![
        "run",
        "--dir",
        s(data),
        "--writers",
        "3",
        "--changes",
        "30000",
        "--checkpoint-every",
        "2000",
        "--manifests",
        s(manifests),
        "--json",
    ]
}

fn run_and_read(compression: bool) -> ReadBack {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let manifests = tmp.path().join("manifests");
    let mut args = three_writers(&data, &manifests);
    if compression {
        args.push("--compression");
    }
    let summary = parse_summary(&ok(tmp.path(), &args));
    assert_eq!(summary["verified"], json!(true), "{summary}");
    // --manifests keeps the data, and `dir` says where: absolute, under --dir.
    assert_eq!(summary["kept"], json!(true), "{summary}");
    let dir = PathBuf::from(summary["dir"].as_str().expect("dir"));
    assert!(
        dir.is_absolute() && dir.starts_with(std::fs::canonicalize(&data).unwrap()),
        "{summary}"
    );
    assert!(dir.is_dir(), "{summary}");
    assert_eq!(count(&summary, "writers"), 3);
    assert_eq!(count(&summary, "changes"), 30_000);
    assert_eq!(count(&summary, "payload_bytes"), 30_000 * 100);
    assert_eq!(
        count(&summary, "checkpoints"),
        3 * 5,
        "10000 appends each, every 2000"
    );
    assert!(count(&summary, "files") >= 1, "{summary}");
    for field in ["wall_s", "appends_per_s", "payload_mb_per_s", "peak_rss_mb"] {
        assert!(number(&summary, field) > 0.0, "{field}: {summary}");
    }
    assert!(number(&summary, "persist_p50_ms") >= 0.0);
    assert!(number(&summary, "persist_p50_ms") <= number(&summary, "persist_p99_ms"));

    // What is on disk was written by this run.
    let on_disk = files_under(&data);
    assert!(!on_disk.is_empty());
    let disk_bytes: u64 = on_disk
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert!(
        disk_bytes <= count(&summary, "bytes_written"),
        "{disk_bytes} bytes on disk, {summary}"
    );
    if !compression {
        assert!(count(&summary, "bytes_written") >= disk_bytes.max(1));
    }
    for file in &on_disk {
        let first = std::fs::read(file).unwrap()[0];
        assert_eq!(first, u8::from(compression), "{} flag byte", file.display());
    }

    let mut names: Vec<String> = std::fs::read_dir(&manifests)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["op-0.json", "op-1.json", "op-2.json"],
        "no temp files left"
    );

    let mut read_back = ReadBack::new();
    let mut named = std::collections::BTreeSet::new();
    for name in &names {
        let manifest = manifests.join(name);
        let entries = check_manifest(&manifest, &data);
        named.extend(entries.iter().map(|e| e.0.clone()));
        let plain = ok(tmp.path(), &["read", s(&manifest)]);
        let changes = parse_read(&plain);
        // The last checkpoint holds the appends since the last confirmed one, which was
        // still persisting or not depending on timing: the manifest says which.
        let range = load_json(&manifest)["changes"].clone();
        let (first, end) = (range[0].as_u64().unwrap(), range[1].as_u64().unwrap());
        assert_eq!(
            end, 10_000,
            "{name}: the last checkpoint ends with the last append"
        );
        assert_eq!(changes.len() as u64, end - first, "{name}");
        let mut indexes: Vec<u64> = changes
            .iter()
            .map(|(_, v)| u64::from_be_bytes(v[..8].try_into().unwrap()))
            .collect();
        indexes.sort();
        assert_eq!(indexes, (first..end).collect::<Vec<_>>(), "{name}");
        for (key_group, value) in &changes {
            assert!(
                (0..128).contains(key_group),
                "{name}: key group {key_group}"
            );
            assert_eq!(value.len(), 100, "{name}: change size");
        }
        let payload: u64 = entries.iter().map(|e| e.3).sum();
        assert_eq!(
            payload,
            changes.len() as u64 * 100,
            "{name}: entry sizes are payload bytes"
        );

        let out = ok(tmp.path(), &["read", "--digest", s(&manifest)]);
        let (n, h) = parse_digest(&out);
        assert_eq!(n, plain.lines().count(), "{name}");
        assert_eq!(h, digest(&changes), "{name}: digest definition");
        for (key_group, value) in changes {
            let index = u64::from_be_bytes(value[..8].try_into().unwrap());
            read_back.insert((name.clone(), index), (key_group, value));
        }
    }
    // The run deleted the files of subsumed checkpoints as it went: what is left is what
    // the last checkpoints name, and the rest is counted.
    let on_disk: std::collections::BTreeSet<PathBuf> = on_disk
        .iter()
        .map(|f| std::fs::canonicalize(f).unwrap())
        .collect();
    assert_eq!(on_disk, named, "{summary}");
    assert_eq!(
        count(&summary, "deleted_files"),
        count(&summary, "files") - on_disk.len() as u64,
        "{summary}"
    );
    read_back
}

#[test]
fn run_json_manifests_and_read() {
    run_and_read(false);
}

#[test]
fn run_json_compressed_reads_the_same_changes() {
    let compressed = run_and_read(true);
    let plain = run_and_read(false);
    // Same seed, same workload: a change has the same key group and bytes either way.
    let mut common = 0;
    for (key, change) in &compressed {
        if let Some(other) = plain.get(key) {
            assert_eq!(change, other, "{key:?}");
            common += 1;
        }
    }
    assert!(common > 0, "both last checkpoints hold the final appends");
}

#[test]
fn same_seed_same_changes_other_seed_other_changes() {
    let digest_of = |seed: &str| {
        let tmp = tempfile::tempdir().unwrap();
        let manifests = tmp.path().join("m");
        ok(
            tmp.path(),
            &[
                "run",
                "--dir",
                s(&tmp.path().join("d")),
                "--writers",
                "1",
                "--changes",
                "3000",
                "--checkpoint-every",
                "1000",
                "--seed",
                seed,
                "--manifests",
                s(&manifests),
                "--json",
            ],
        );
        ok(
            tmp.path(),
            &["read", "--digest", s(&manifests.join("op-0.json"))],
        )
    };
    assert_eq!(digest_of("7"), digest_of("7"));
    assert_ne!(digest_of("7"), digest_of("8"));
}

/// Parses `read-list` output: `NAME<TAB>CHANGES<TAB>SHA256` per line.
fn parse_read_list(stdout: &str) -> Vec<(String, usize, String)> {
    stdout
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 3, "not NAME<TAB>CHANGES<TAB>SHA256: {line:?}");
            assert_eq!(fields[2].len(), 64, "{line:?}");
            (
                fields[0].to_string(),
                fields[1].parse().expect("CHANGES"),
                fields[2].to_string(),
            )
        })
        .collect()
}

/// `dstl read-list` takes dstl's manifests (files, or a directory as `dstl run
/// --manifests` writes it) as well as handle lists, in any mix, and prints for each
/// snapshot what `dstl read --digest` prints for it.
#[test]
fn read_list_takes_manifests_directories_and_handle_lists_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let manifests = tmp.path().join("m");
    ok(
        tmp.path(),
        &three_writers(&tmp.path().join("data"), &manifests),
    );
    let digests: Vec<(String, usize, String)> = (0..3)
        .map(|i| {
            let name = format!("op-{i}");
            let manifest = manifests.join(format!("{name}.json"));
            let (n, h) = parse_digest(&ok(tmp.path(), &["read", "--digest", s(&manifest)]));
            (name, n, h)
        })
        .collect();
    assert!(digests.iter().all(|(_, n, _)| *n > 0), "{digests:?}");

    let two = ok(tmp.path(), &["read-list", "m/op-2.json", "m/op-0.json"]);
    assert_eq!(
        parse_read_list(&two),
        [digests[2].clone(), digests[0].clone()],
        "in argument order"
    );

    // A directory: its *.json files by name; a manifest being rewritten (`.json.tmp`) is
    // not one of them.
    std::fs::write(manifests.join("op-9.json.tmp"), b"{").unwrap();
    let all = ok(tmp.path(), &["read-list", "m"]);
    assert_eq!(parse_read_list(&all), digests);

    // A manifest without `writer` is named by its file; a handle list in the Flink
    // harness's format of the same snapshot reads the same.
    let mut manifest = load_json(&manifests.join("op-1.json"));
    manifest.as_object_mut().unwrap().remove("writer");
    std::fs::create_dir(tmp.path().join("other")).unwrap();
    std::fs::write(tmp.path().join("other/renamed.json"), manifest.to_string()).unwrap();
    let handles: Vec<Value> = manifest["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| json!({"path": e["path"], "offset": e["offset"], "fileSize": e["file_size"]}))
        .collect();
    let list = json!({"snapshots": [{"name": "from-list", "keyGroupRange": [0, 127], "handles": handles}]});
    std::fs::write(tmp.path().join("handles.json"), list.to_string()).unwrap();
    let mixed = ok(
        tmp.path(),
        &[
            "read-list",
            "other/renamed.json",
            "handles.json",
            "m/op-1.json",
        ],
    );
    let (_, n, h) = digests[1].clone();
    assert_eq!(
        parse_read_list(&mixed),
        [
            ("renamed".to_string(), n, h.clone()),
            ("from-list".to_string(), n, h.clone()),
            ("op-1".to_string(), n, h),
        ]
    );
}

/// A file `read-list` cannot take is named, with what it is not.
#[test]
fn read_list_names_a_file_that_is_neither_format() {
    let tmp = tempfile::tempdir().unwrap();
    let neither = "is neither a handle list (a JSON object with `snapshots`) nor a dstl manifest (a JSON object with `entries`)";
    std::fs::write(tmp.path().join("notes.txt"), "hello").unwrap();
    let (_, stderr) = fails(tmp.path(), &["read-list", "notes.txt"]);
    assert!(
        stderr.contains(&format!("notes.txt {neither}: it is not JSON")),
        "{stderr}"
    );
    std::fs::write(tmp.path().join("other.json"), r#"{"foo": 1}"#).unwrap();
    let (_, stderr) = fails(tmp.path(), &["read-list", "other.json"]);
    assert!(
        stderr.contains(&format!("other.json {neither}")),
        "{stderr}"
    );
    std::fs::write(tmp.path().join("bad.json"), r#"{"entries": 5}"#).unwrap();
    let (_, stderr) = fails(tmp.path(), &["read-list", "bad.json"]);
    assert!(stderr.contains("invalid manifest bad.json: "), "{stderr}");
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    let (_, stderr) = fails(tmp.path(), &["read-list", "empty"]);
    assert!(
        stderr.contains("empty holds no manifest or handle list (no *.json file)"),
        "{stderr}"
    );
    let (_, stderr) = fails(tmp.path(), &["read-list", "missing.json"]);
    assert!(stderr.contains("cannot read missing.json: "), "{stderr}");
    // Nothing printed for a list that fails part-way: the good file comes first here.
    std::fs::write(tmp.path().join("good.json"), r#"{"snapshots": []}"#).unwrap();
    let (stdout, _) = fails(tmp.path(), &["read-list", "good.json", "bad.json"]);
    assert_eq!(stdout, "");
    fails(tmp.path(), &["read-list"]);
}

/// One line `change set #I at offset O: B bytes, G groups, C changes, P payload bytes`.
fn change_set_lines(out: &str) -> Vec<(u64, u64, u64, u64)> {
    out.lines()
        .filter(|l| l.starts_with("change set #"))
        .map(|l| {
            let words: Vec<&str> = l.split([' ', ':', ',']).filter(|w| !w.is_empty()).collect();
            // change set #I at offset O B bytes G groups C changes P payload bytes
            let n = |i: usize| words[i].parse::<u64>().unwrap_or_else(|_| panic!("{l}"));
            (n(5), n(6), n(10), n(12))
        })
        .collect()
}

#[test]
fn inspect_a_file_a_manifest_refers_to() {
    for compression in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let manifests = tmp.path().join("m");
        let mut args = vec![
            "run",
            "--dir",
            "d",
            "--writers",
            "1",
            "--changes",
            "5000",
            "--checkpoint-every",
            "1000",
            "--manifests",
            "m",
            "--json",
        ];
        if compression {
            args.push("--compression");
        }
        ok(tmp.path(), &args);
        let entries = check_manifest(&manifests.join("op-0.json"), &tmp.path().join("d"));
        let (file, file_size, _, _) = &entries[0];
        let out = ok(tmp.path(), &["inspect", s(file)]);
        let compression_line = out
            .lines()
            .find(|l| l.starts_with("compression"))
            .unwrap_or_else(|| panic!("no compression line: {out}"));
        if compression {
            assert!(compression_line.contains("snappy"), "{out}");
        } else {
            assert!(compression_line.contains("none"), "{out}");
        }
        assert!(
            out.lines().any(|l| l.starts_with("logical bytes")
                && l.split_whitespace().last() == Some(&file_size.to_string())),
            "logical bytes {file_size}: {out}"
        );
        let on_disk = std::fs::metadata(file).unwrap().len();
        assert!(
            out.lines().any(|l| l.starts_with("bytes on disk")
                && l.split_whitespace().last() == Some(&on_disk.to_string())),
            "bytes on disk {on_disk}: {out}"
        );
        let sets = change_set_lines(&out);
        assert!(!sets.is_empty(), "{out}");
        // The change sets tile the logical stream.
        let mut next = 0;
        for &(offset, bytes, _, _) in &sets {
            assert_eq!(offset, next, "{out}");
            next = offset + bytes;
        }
        assert_eq!(next, *file_size, "{out}");
        // Every entry of the manifest in this file is one of them, with its payload size.
        for (path, _, offset, size) in entries.iter().filter(|e| &e.0 == file) {
            let set = sets
                .iter()
                .find(|c| c.0 == *offset)
                .unwrap_or_else(|| panic!("{} @{offset} not listed: {out}", path.display()));
            assert_eq!(set.3, *size, "payload bytes @{offset}: {out}");
        }
    }
}

#[test]
fn inspect_golden_file_with_values() {
    let golden = golden_dir().join("plain");
    let manifest = load_json(&golden.join("manifest.json"));
    let snapshot = golden_snapshot(&manifest, "w0-cp1");
    let handle = &snapshot["handles"][0];
    let file = golden.join(handle["path"].as_str().unwrap());
    let offset = handle["offset"].as_u64().unwrap();
    let out = ok(&golden, &["inspect", "--values", s(&file)]);
    assert!(out.contains("none"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("logical bytes")
            && l.split_whitespace().last()
                == Some(&handle["fileSize"].as_u64().unwrap().to_string())),
        "{out}"
    );
    // The values printed under the change set at `offset` are w0-cp1's expected changes.
    let mut in_set = false;
    let mut values = Vec::new();
    for line in out.lines() {
        if line.starts_with("change set #") {
            in_set = line.contains(&format!(" at offset {offset}:"));
        } else if in_set && line.starts_with("      ") && line.contains('\t') {
            values.push(line.trim_start().to_string());
        }
    }
    let expected = std::fs::read_to_string(golden.join("snapshots/w0-cp1.expected")).unwrap();
    assert_eq!(values, expected.lines().collect::<Vec<_>>(), "{out}");
}

/// `dstl inspect` of the file `name` in `dir`, holding `bytes` (`None`: there is no such
/// file), fails naming the file.
fn inspect_fails_naming_the_file(dir: &Path, name: &str, bytes: Option<&[u8]>) {
    let file = dir.join(name);
    if let Some(bytes) = bytes {
        std::fs::write(&file, bytes).unwrap();
    }
    let (_, stderr) = fails(dir, &["inspect", s(&file)]);
    assert!(
        stderr.contains(s(&file)),
        "{name}: stderr names the file: {stderr}"
    );
}

#[test]
fn inspect_garbage_fails_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, Option<&[u8]>); 4] = [
        ("text", Some(b"this is not a changelog file\n")),
        ("empty", Some(b"")),
        ("bad-snappy", Some(b"\x01not a snappy stream at all")),
        ("missing", None),
    ];
    for (name, bytes) in cases {
        inspect_fails_naming_the_file(tmp.path(), name, bytes);
    }
}

#[test]
fn inspect_corrupt_change_set_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    // Flag 0 (plain), then a negative group count, then a truncated one.
    for (name, bytes) in [
        ("negative-groups", &b"\x00\xff\xff\xff\xff"[..]),
        ("truncated", &b"\x00\x00\x00\x00\x01\x00\x00"[..]),
    ] {
        inspect_fails_naming_the_file(tmp.path(), name, Some(bytes));
    }
}

/// The snapshot called `name` in a golden set's `manifest.json`.
fn golden_snapshot<'a>(golden: &'a Value, name: &str) -> &'a Value {
    golden["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("{name} in the golden manifest"))
}

/// A contract-3 manifest for a golden snapshot, with absolute paths into `golden/`.
fn golden_manifest(set_dir: &Path, snapshot: &Value) -> Value {
    let range = snapshot["keyGroupRange"].as_array().unwrap();
    let entries: Vec<Value> = snapshot["handles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            json!({
                "path": s(&set_dir.join(h["path"].as_str().unwrap())),
                "file_size": h["fileSize"],
                "offset": h["offset"],
                "size": 0,
            })
        })
        .collect();
    json!({
        "storage_id": "filesystem",
        "key_group_range": {"start": range[0], "end": range[1]},
        "state_size": 0,
        "incremental_size": 0,
        "entries": entries,
        "local": null,
        "an_unknown_field": "readers ignore it",
    })
}

/// Writes the manifest of a golden snapshot of the set in `set_dir` to `manifest`, and
/// checks that `dstl read --digest` reads back the count and digest the golden files
/// record (`what` names the snapshot in failures); returns the digest.
fn read_golden_digest(set_dir: &Path, snapshot: &Value, manifest: &Path, what: &str) -> String {
    std::fs::write(manifest, golden_manifest(set_dir, snapshot).to_string()).unwrap();
    let cwd = manifest.parent().unwrap();
    let (n, h) = parse_digest(&ok(cwd, &["read", "--digest", s(manifest)]));
    assert_eq!(
        n as u64,
        snapshot["expectedCount"].as_u64().unwrap(),
        "{what}"
    );
    assert_eq!(
        h,
        snapshot["expectedTotalSha256"].as_str().unwrap(),
        "{what}"
    );
    h
}

#[test]
fn read_golden_plain_w0_cp2() {
    let set_dir = golden_dir().join("plain");
    let golden = load_json(&set_dir.join("manifest.json"));
    let snapshot = golden_snapshot(&golden, "w0-cp2");
    let tmp = tempfile::tempdir().unwrap();
    let manifest = tmp.path().join("w0-cp2.json");
    read_golden_digest(&set_dir, snapshot, &manifest, "plain w0-cp2");
}

#[test]
fn read_every_golden_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for set in ["plain", "snappy", "snappy-large"] {
        let set_dir = golden_dir().join(set);
        let golden = load_json(&set_dir.join("manifest.json"));
        for snapshot in golden["snapshots"].as_array().unwrap() {
            let name = snapshot["name"].as_str().unwrap();
            let manifest = tmp.path().join(format!("{set}-{name}.json"));
            let h = read_golden_digest(&set_dir, snapshot, &manifest, &format!("{set} {name}"));
            let out = ok(tmp.path(), &["read", s(&manifest)]);
            assert_eq!(digest(&parse_read(&out)), h, "{set} {name}");
            if golden["expectedFormat"] == "hex" {
                let expected = std::fs::read_to_string(
                    set_dir.join(snapshot["expectedFile"].as_str().unwrap()),
                )
                .unwrap();
                assert_eq!(out, expected, "{set} {name}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 18);
}

#[test]
fn bad_configuration_is_rejected_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    for (conf, key) in [
        ("dstl.dfs.nope=1", "dstl.dfs.nope"),
        ("dstl.dfs.upload.timeout=soon", "dstl.dfs.upload.timeout"),
        (
            "dstl.dfs.upload.num-threads=0",
            "dstl.dfs.upload.num-threads",
        ),
        (
            "dstl.dfs.compression.enabled=maybe",
            "dstl.dfs.compression.enabled",
        ),
        ("justakey", "justakey"),
    ] {
        let args = ["run", "--dir", s(&data), "--json", "--conf", conf];
        let (stdout, stderr) = fails(tmp.path(), &args);
        assert!(stderr.contains(key), "{conf}: names `{key}`: {stderr}");
        assert!(
            stdout.is_empty(),
            "{conf}: nothing on stdout under --json: {stdout}"
        );
        assert!(!data.exists(), "{conf}: nothing created");
        let (_, stderr) = fails(tmp.path(), &["config", "--conf", conf]);
        assert!(
            stderr.contains(key),
            "config {conf}: names `{key}`: {stderr}"
        );
    }
    // A relation between keys.
    let (_, stderr) = fails(
        tmp.path(),
        &[
            "config",
            "--conf",
            "dstl.dfs.batch.persist-size-threshold=200mb",
        ],
    );
    assert!(
        stderr.contains("dstl.dfs.batch.persist-size-threshold"),
        "{stderr}"
    );
}

#[test]
fn bad_workload_is_rejected_naming_the_option() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    for (option, value) in [
        ("--writers", "0"),
        ("--key-groups", "0"),
        ("--checkpoint-every", "0"),
        ("--max-pending-checkpoints", "0"),
    ] {
        let args = ["run", "--dir", s(&data), "--json", option, value];
        let (stdout, stderr) = fails(tmp.path(), &args);
        assert!(stderr.contains(option), "{option} {value}: {stderr}");
        assert!(stdout.is_empty(), "{option} {value}: {stdout}");
        assert!(!data.exists(), "{option} {value}: nothing created");
    }
}

#[test]
fn read_errors_name_the_path() {
    let tmp = tempfile::tempdir().unwrap();

    let missing = tmp.path().join("no-such-manifest.json");
    let (stdout, stderr) = fails(tmp.path(), &["read", s(&missing)]);
    assert!(stderr.contains(s(&missing)), "{stderr}");
    assert!(stdout.is_empty());
    // The cause is printed once, not once per error of the chain that carries it.
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
    let (_, stderr) = fails(tmp.path(), &["read", "--digest", s(&missing)]);
    assert!(stderr.contains(s(&missing)), "{stderr}");

    let invalid = tmp.path().join("invalid.json");
    std::fs::write(&invalid, "{ not json").unwrap();
    let (_, stderr) = fails(tmp.path(), &["read", s(&invalid)]);
    assert!(stderr.contains(s(&invalid)), "{stderr}");

    // A manifest whose changelog file is gone names that file.
    let gone = tmp.path().join("gone");
    let manifest = tmp.path().join("gone.json");
    let value = json!({
        "storage_id": "filesystem",
        "key_group_range": {"start": 0, "end": 7},
        "state_size": 0,
        "incremental_size": 0,
        "entries": [{"path": s(&gone), "file_size": 10, "offset": 0, "size": 0}],
        "local": null,
    });
    std::fs::write(&manifest, value.to_string()).unwrap();
    let (stdout, stderr) = fails(tmp.path(), &["read", s(&manifest)]);
    assert!(stderr.contains(s(&gone)), "{stderr}");
    assert!(stdout.is_empty());

    // No local handle to read.
    let (_, stderr) = fails(tmp.path(), &["read", "--local", s(&manifest)]);
    assert!(stderr.contains(s(&manifest)), "{stderr}");
}

#[test]
fn config_prints_effective_values() {
    let tmp = tempfile::tempdir().unwrap();
    for key in [
        "dstl.dfs.upload.timeout",
        "state.changelog.dstl.dfs.upload.timeout",
    ] {
        let conf = format!("{key}=2s");
        let out = ok(tmp.path(), &["config", "--conf", &conf]);
        assert!(
            out.lines()
                .any(|l| l == "dstl.dfs.upload.timeout = \"2000 ms\""),
            "{conf}: {out}"
        );
    }
    // Defaults are Flink's.
    let out = ok(tmp.path(), &["config"]);
    for line in [
        "dstl.dfs.upload.timeout = \"1000 ms\"",
        "dstl.dfs.batch.persist-delay = \"10 ms\"",
        "dstl.dfs.compression.enabled = \"false\"",
    ] {
        assert!(out.lines().any(|l| l == line), "{line}: {out}");
    }
}

/// What `dstl config` prints, `--config` reads back to the same configuration.
#[test]
fn config_output_reads_back_as_a_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let first = ok(
        tmp.path(),
        &[
            "config",
            "--conf",
            "dstl.dfs.upload.timeout=2s",
            "--conf",
            "dstl.local-recovery.dir=copies dir",
            "--conf",
            "dstl.s3.region=eu-west-1",
        ],
    );
    std::fs::write(tmp.path().join("effective.toml"), &first).unwrap();
    let second = ok(tmp.path(), &["config", "--config", "effective.toml"]);
    assert_eq!(first, second);
    assert!(first.contains("dstl.s3.region = \"eu-west-1\""), "{first}");
    assert!(first.contains("# dstl.s3.endpoint: unset"), "{first}");
}

/// Writers waiting on the in-flight limit for longer than their call deadline carry on:
/// time blocked in the host is not guest time (the command of the report that found it,
/// with a tenth of the changes).
#[test]
fn back_pressure_longer_than_the_call_deadline_does_not_trap_writers() {
    let tmp = tempfile::tempdir().unwrap();
    let out = ok(
        tmp.path(),
        &[
            "run",
            "--writers",
            "4",
            "--changes",
            "40000",
            "--change-size",
            "1000",
            "--checkpoint-every",
            "1000",
            "--conf",
            "dstl.dfs.upload.max-in-flight=256kb",
            "--conf",
            "dstl.dfs.batch.persist-size-threshold=128kb",
            "--conf",
            "dstl.writer.call-timeout=5ms",
            "--conf",
            "dstl.dfs.batch.persist-delay=50ms",
            "--json",
        ],
    );
    let summary = parse_summary(&out);
    assert_eq!(summary["verified"], Value::Bool(true), "{out}");
    assert_eq!(count(&summary, "changes"), 40_000);
}

/// Log lines are plain text when stderr is not a terminal (a file, a pipe, a collector).
#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dstl"))
        .current_dir(tmp.path())
        .args(["run", "--writers", "1", "--changes", "100", "--json"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&["run"], &out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("DEBUG"),
        "debug lines were logged: {stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "no ANSI escapes: {stderr:?}");
}
