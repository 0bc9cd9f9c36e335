//! Local recovery (Flink's local-file scenarios) through the wasmtime host:
//! every upload leaves a local copy, snapshots carry a local handle, and the local
//! registry deletes copies as checkpoints are confirmed or aborted — without Flink's holes
//! (ARCHITECTURE.md, F5, F6, F7, F14).

use std::path::Path;

use dstl::{ChangelogStorage, SnapshotResult, Writer};
use dstl_tests::harness::{
    RANGE, checkpoint, files, in_temp_dir, local_paths, persist, persist_confirmed, remote_paths,
};
use tempfile::TempDir;

/// A storage over `dir` (the harness's) with local recovery on, then `conf`.
fn open(dir: &Path, conf: &[&str]) -> ChangelogStorage {
    dstl_tests::harness::open(
        dir,
        &[&["dstl.local-recovery.enabled=true"][..], conf].concat(),
    )
}

/// [`open`] over a fresh temporary directory, which must outlive the storage.
fn open_temp(conf: &[&str]) -> (TempDir, ChangelogStorage) {
    in_temp_dir(|dir| open(dir, conf))
}

fn exists(path: impl AsRef<Path>) -> bool {
    path.as_ref().exists()
}

#[test]
fn local_copies_mirror_the_remote_files() {
    let (tmp, storage) = open_temp(&["dstl.job-id=000000000000002a466c696e6b416e63"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(4, b"local").unwrap();
    let (snapshot, _) = persist(&w, 0, 1);
    let local = local_paths(&snapshot);
    let remote = remote_paths(&snapshot);
    assert_eq!(
        Path::new(&local[0]).file_name(),
        Path::new(&remote[0]).file_name(),
        "same file name"
    );
    assert!(
        Path::new(&local[0]).starts_with(
            tmp.path()
                .join("local/jid_000000000000002a466c696e6b416e63/taskowned")
        )
    );
    assert_eq!(
        std::fs::read(&local[0]).unwrap(),
        std::fs::read(&remote[0]).unwrap()
    );
    let local_handle = snapshot.local.clone().unwrap();
    assert_eq!(local_handle.incremental_size, 0);
    assert_eq!(local_handle.state_size, snapshot.remote.state_size);
    let changes = storage.read(&local_handle).unwrap();
    assert_eq!(changes[0].value, b"local");
}

/// Flink's testLocalFileDiscard.
#[test]
fn confirming_a_later_checkpoint_discards_older_local_copies() {
    let (_tmp, storage) = open_temp(&["dstl.dfs.preemptive-persist-threshold=100b"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    checkpoint(&w, 0, 1, &[1; 10]).unwrap();
    w.append(0, &[2; 100]).unwrap(); // pre-emptive upload
    w.append(0, &[3; 10]).unwrap();
    let (cp2, _) = persist_confirmed(&w, 0, 2);
    storage.wait_idle();
    let cp2_local = local_paths(&cp2);
    assert!(cp2_local.iter().all(exists));
    let materialized = w.next_sequence_number().unwrap();
    let (cp3, _) = checkpoint(&w, materialized, 3, &[4; 10]).unwrap();
    storage.wait_idle();
    for file in &cp2_local {
        assert!(!exists(file), "{file} of cp2 should be discarded");
    }
    assert!(local_paths(&cp3).iter().all(exists));
    // Later snapshots of the older change sets no longer claim local copies.
    let (again, _) = persist(&w, 0, 4);
    assert!(again.local.is_none());
}

/// Flink's testLocalFileAfterMaterialize: local files are registered at persist time.
#[test]
fn local_copies_of_a_persisted_checkpoint_survive_materialization() {
    let (_tmp, storage) = open_temp(&[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    checkpoint(&w, 0, 1, b"a").unwrap();
    let (_, to2) = checkpoint(&w, 0, 2, b"b").unwrap();
    w.append(0, b"c").unwrap();
    let (cp3, to3) = persist(&w, 0, 3);
    w.truncate(to2).unwrap(); // materialization of everything cp2 held
    w.confirm(0, to3, 3).unwrap();
    storage.wait_idle();
    for file in remote_paths(&cp3).iter().chain(&local_paths(&cp3)) {
        assert!(exists(file), "{file} of cp3 was deleted");
    }
}

/// Flink's testLocalFileAbort, with the fix of F5: after an abort no later snapshot
/// points at a deleted local copy.
#[test]
fn aborting_a_checkpoint_discards_its_local_copies_and_nothing_points_at_them() {
    let (_tmp, storage) = open_temp(&["dstl.dfs.preemptive-persist-threshold=200b"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    checkpoint(&w, 0, 1, b"1").unwrap();
    w.append(0, &[2; 200]).unwrap(); // pre-emptive upload
    w.append(0, b"3").unwrap();
    let (cp2, to2) = persist(&w, 0, 2);
    w.reset(0, to2, 2).unwrap();
    storage.wait_idle();
    for file in local_paths(&cp2) {
        assert!(!exists(&file), "{file} of aborted cp2 survived");
    }
    let (cp3, _) = checkpoint(&w, 0, 3, b"4").unwrap();
    storage.wait_idle();
    // cp3 reuses change sets whose local copies are gone: it is remote-only rather than
    // pointing at deleted files.
    assert!(cp3.local.is_none());
    assert_eq!(storage.read(&cp3.remote).unwrap().len(), 4);
    let (cp4, _) = persist_confirmed(&w, to2, 4);
    storage.wait_idle();
    assert!(local_paths(&cp4).iter().all(exists));
}

/// F5: a checkpoint that only waits on an upload started for an earlier checkpoint
/// registers the files under its own id, so confirming it keeps them.
#[test]
fn a_checkpoint_waiting_on_an_earlier_upload_owns_its_local_copies() {
    let (_tmp, storage) = open_temp(&["dstl.dfs.batch.persist-delay=100ms"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"shared").unwrap();
    let to = w.next_sequence_number().unwrap();
    let first = w.persist(0, 1).unwrap();
    let second = w.persist(0, 2).unwrap(); // waits on the same in-flight upload
    let (first, second) = (first.wait().unwrap(), second.wait().unwrap());
    assert_eq!(local_paths(&first), local_paths(&second));
    w.confirm(0, to, 2).unwrap();
    storage.wait_idle();
    assert!(local_paths(&second).iter().all(exists));
    assert_eq!(
        storage.local_registry().last_used(&local_paths(&second)[0]),
        Some(2)
    );
}

/// F6: a local-disk failure degrades to a remote-only result instead of failing.
#[test]
fn a_failing_local_disk_degrades_to_remote_only() {
    let (_tmp, storage) = open_temp(&[]);
    let local_dir = storage.config().local_copies_dir();
    std::fs::remove_dir_all(&local_dir).unwrap();
    std::fs::write(&local_dir, b"not a directory").unwrap();
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"remote only").unwrap();
    let (snapshot, _) = persist(&w, 0, 1);
    assert!(snapshot.local.is_none());
    assert_eq!(
        storage.read(&snapshot.remote).unwrap()[0].value,
        b"remote only"
    );
    assert_eq!(storage.metrics().upload_failures, 0);
}

#[test]
fn truncation_releases_local_copies_with_the_remote_files() {
    let (_tmp, storage) = open_temp(&[]);
    let local_dir = storage.config().local_copies_dir();
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"gone").unwrap();
    let (snapshot, to) = persist(&w, 0, 1); // never confirmed
    w.truncate(to).unwrap();
    storage.wait_idle();
    assert!(remote_paths(&snapshot).iter().all(|f| !exists(f)));
    assert!(files(&local_dir).is_empty());
}

/// Writers `a` and `b` of `storage` (whose batches wait long enough to gather both) that
/// have each appended one change (`a1`, `b1`) and persisted it as checkpoint 1, into one
/// file: each writer, its snapshot and the sequence number its checkpoint ends at.
fn two_writers_in_one_file(storage: &ChangelogStorage) -> [(Writer, SnapshotResult, u64); 2] {
    let a = storage.create_writer("a", RANGE).unwrap();
    let b = storage.create_writer("b", RANGE).unwrap();
    a.append(0, b"a1").unwrap();
    b.append(0, b"b1").unwrap();
    let a_to = a.next_sequence_number().unwrap();
    let b_to = b.next_sequence_number().unwrap();
    let (pa, pb) = (a.persist(0, 1).unwrap(), b.persist(0, 1).unwrap());
    let (a1, b1) = (pa.wait().unwrap(), pb.wait().unwrap());
    assert_eq!(local_paths(&a1), local_paths(&b1), "one batch, one file");
    [(a, a1, a_to), (b, b1, b_to)]
}

/// Local copies are owned per writer: a file holding change sets of two writers stays
/// while either still claims it. Writer A confirming a later checkpoint ends A's claim
/// only; B's confirmed checkpoint keeps its local copy until B moves on too.
#[test]
fn one_writers_confirm_keeps_local_copies_another_writer_still_needs() {
    let (_tmp, storage) = open_temp(&["dstl.dfs.batch.persist-delay=200ms"]);
    let [(a, _, a_to), (b, b1, b_to)] = two_writers_in_one_file(&storage);
    a.confirm(0, a_to, 1).unwrap();
    b.confirm(0, b_to, 1).unwrap();
    let shared = local_paths(&b1)[0].clone();
    // A checkpoints again and confirms: its claim on the shared copy ends.
    checkpoint(&a, a_to, 2, b"a2").unwrap();
    storage.wait_idle();
    assert!(
        exists(&shared),
        "b's confirmed checkpoint 1 still needs its local copy"
    );
    let path = shared.clone();
    assert_eq!(storage.local_registry().owners(&path), vec![b.id()]);
    let local = b1.local.clone().unwrap();
    assert_eq!(storage.read(&local).unwrap()[0].value, b"b1");
    // B moves on as well: nobody claims the copy, so it goes.
    checkpoint(&b, b_to, 2, b"b2").unwrap();
    storage.wait_idle();
    assert!(!exists(&shared));
    assert!(storage.local_registry().owners(&path).is_empty());
}

/// An abort (reset) by one writer discards only that writer's local copies.
#[test]
fn one_writers_reset_keeps_another_writers_local_copies() {
    let (_tmp, storage) = open_temp(&["dstl.dfs.batch.persist-delay=200ms"]);
    let [(a, _, _), (b, b1, _)] = two_writers_in_one_file(&storage);
    a.reset(0, 1, 1).unwrap();
    storage.wait_idle();
    let shared = local_paths(&b1)[0].clone();
    assert!(exists(&shared), "b's snapshot still names its local copy");
    b.append(0, b"b2").unwrap();
    let (b2, _) = persist(&b, 0, 2);
    assert_eq!(local_paths(&b2)[0], shared, "b still uses the copy");
    assert_eq!(storage.read(b2.local.as_ref().unwrap()).unwrap().len(), 2);
}

/// A confirm that reaches a closed writer still discards its older local copies (Flink
/// has no closed check there).
#[test]
fn confirm_after_close_discards_local_copies() {
    let (_tmp, storage) = open_temp(&[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let (first, to) = checkpoint(&w, 0, 1, b"one").unwrap();
    w.append(0, b"two").unwrap();
    let (second, to2) = persist(&w, to, 2);
    w.close().unwrap();
    storage.wait_idle();
    for snapshot in [&first, &second] {
        assert!(exists(&local_paths(snapshot)[0]));
    }
    w.confirm(to, to2, 2).unwrap();
    storage.wait_idle();
    assert!(
        !exists(&local_paths(&first)[0]),
        "below checkpoint 2: discarded"
    );
    assert!(exists(&local_paths(&second)[0]));
    w.confirm(to, to2, 3).unwrap();
    storage.wait_idle();
    assert!(!exists(&local_paths(&second)[0]));
    // The remote files of the returned snapshots stay for the coordinator.
    assert!(exists(&remote_paths(&second)[0]));
}
