//! Crash consistency: `dstl run --manifests` killed with SIGKILL at arbitrary moments.
//! Every manifest present afterwards must read back exactly the changes it claims, and
//! no partially written changelog file may be visible.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use dstl::manifest::{Manifest, ManifestFile};
use dstl_cli::workload::{Workload, expected_changes};

fn workload() -> Workload {
    Workload {
        writers: 2,
        changes: 2_000_000,
        change_size: 100,
        key_groups: 128,
        checkpoint_every: 2000,
        seed: 7,
        manifests: None,
        delete_subsumed: true,
        max_pending_checkpoints: None,
    }
}

fn per_key_group(changes: impl IntoIterator<Item = (i32, Vec<u8>)>) -> BTreeMap<i32, Vec<Vec<u8>>> {
    let mut map: BTreeMap<i32, Vec<Vec<u8>>> = BTreeMap::new();
    for (key_group, value) in changes {
        map.entry(key_group).or_default().push(value);
    }
    map
}

/// Every visible file under `dir/<job>/dstl` is a complete changelog file.
fn check_files_whole(dir: &Path) -> usize {
    let mut checked = 0;
    let Ok(jobs) = std::fs::read_dir(dir) else {
        return 0;
    };
    for job in jobs {
        let Ok(files) = std::fs::read_dir(job.unwrap().path().join("dstl")) else {
            continue;
        };
        for file in files {
            let path = file.unwrap().path();
            if path.file_name().unwrap().to_string_lossy().starts_with('.') {
                continue; // staging file of an interrupted write: never referenced
            }
            let bytes = std::fs::read(&path).unwrap();
            let logical = dstl::codec::logical_bytes(&bytes)
                .unwrap_or_else(|e| panic!("{} is not a whole file: {e}", path.display()));
            let mut offset = 0u64;
            while offset < logical.len() as u64 {
                let mut reader = dstl::codec::ChangeSetReader::new(&logical, offset).unwrap();
                while reader
                    .next_change()
                    .unwrap_or_else(|e| panic!("{} is cut short at {offset}: {e}", path.display()))
                    .is_some()
                {}
                offset = reader.position();
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn killed_runs_leave_only_whole_files_and_exact_manifests() {
    let load = workload();
    let mut manifests_checked = 0;
    for (round, delay_ms) in [40u64, 120, 250, 400, 650, 900].into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_dstl"))
            .current_dir(tmp.path())
            .args([
                "run",
                "--dir",
                "d",
                "--manifests",
                "m",
                "--json",
                "--writers",
                "2",
            ])
            .args(["--changes", &load.changes.to_string()])
            .args(["--checkpoint-every", &load.checkpoint_every.to_string()])
            .args(["--seed", &load.seed.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        check_files_whole(&tmp.path().join("d"));
        let Ok(entries) = std::fs::read_dir(tmp.path().join("m")) else {
            continue; // killed before the first checkpoint
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "json") {
                continue; // a manifest being rewritten when the process died
            }
            let manifest = Manifest::load(&path).unwrap();
            let writer: usize = manifest.writer.as_deref().unwrap()["op-".len()..]
                .parse()
                .unwrap();
            let [from, to] = manifest.changes.expect("dstl run records the change range");
            let read =
                dstl::reader::read_handle(&manifest.remote_handle(), &dstl::FileSource::new(None))
                    .unwrap_or_else(|e| {
                        panic!("round {round}: {} does not read back: {e}", path.display())
                    });
            assert_eq!(
                per_key_group(read.into_iter().map(|c| (c.key_group, c.value))),
                per_key_group(expected_changes(&load, writer, from, to)),
                "round {round}: {} reads back other changes than it claims",
                path.display()
            );
            manifests_checked += 1;
        }
    }
    assert!(
        manifests_checked > 0,
        "no run lived long enough to write a manifest"
    );
}
