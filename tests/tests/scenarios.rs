//! Writer scenarios after Flink's writer, storage and registry tests, driven through the wasmtime
//! host against a real directory: every call crosses into the writer component.

use std::path::{Path, PathBuf};

use dstl::manifest::ManifestFile;
use dstl::{ChangelogStorage, Error, KeyGroupRange, TrapKind, WriterError, WriterOptions};
use dstl_tests::harness::{
    RANGE, break_dir, by_key_group, changes, files, open, path_strings, repair_dir, snapshot_paths,
    upload_error, writer_error,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Upload attempts so far, once every upload started has finished.
fn uploads(storage: &ChangelogStorage) -> u64 {
    storage.wait_idle();
    storage.metrics().upload_requests
}

// ---- Flink's FsStateChangelogWriterTest ----

#[test]
fn append_below_threshold_uploads_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &["dstl.dfs.preemptive-persist-threshold=1000b"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    for _ in 0..3 {
        w.append(0, &[7; 10]).unwrap();
    }
    assert_eq!(uploads(&storage), 0);
}

#[test]
fn pre_upload_at_threshold_then_persist_uploads_nothing_more() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &["dstl.dfs.preemptive-persist-threshold=1000b"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, &[1; 999]).unwrap();
    assert_eq!(uploads(&storage), 0, "999 bytes stay below the threshold");
    w.append_meta(&[2]).unwrap();
    assert_eq!(uploads(&storage), 1, "the threshold is inclusive");
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    assert_eq!(uploads(&storage), 1);
    assert_eq!(
        changes(&storage, &snapshot.remote),
        vec![(-1, vec![2]), (0, vec![1; 999])]
    );
    assert_eq!(snapshot.remote.state_size, 1000);
}

#[test]
fn persist_uploads_the_change_and_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(3, b"0123456789").unwrap();
    let future = w.persist(0, 1).unwrap();
    assert!(!future.is_immediate());
    let snapshot = future.wait().unwrap();
    assert_eq!(snapshot.remote.entries.len(), 1);
    assert_eq!(snapshot.remote.incremental_size, 10);
    assert_eq!(snapshot.remote.storage_id, "filesystem");
    assert_eq!(snapshot.remote.key_group_range, RANGE);
    assert_eq!(
        changes(&storage, &snapshot.remote),
        vec![(3, b"0123456789".to_vec())]
    );
}

#[test]
fn persist_again_after_confirm_reuses_uploads() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"abc").unwrap();
    let first = w.persist(0, 1).unwrap().wait().unwrap();
    let to = w.next_sequence_number().unwrap();
    w.confirm(0, to, 1).unwrap();
    let again = w.persist(0, 2).unwrap();
    assert!(again.is_immediate());
    let again = again.wait().unwrap();
    assert_eq!(again.remote.entries, first.remote.entries);
    assert_eq!(again.remote.incremental_size, 0);
    assert_eq!(uploads(&storage), 1);
}

#[test]
fn files_stay_available_after_pre_upload_and_truncation() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &["dstl.dfs.preemptive-persist-threshold=100b"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    // cp1
    w.append(0, &[1; 10]).unwrap();
    let to1 = w.next_sequence_number().unwrap();
    w.persist(0, 1).unwrap().wait().unwrap();
    w.confirm(0, to1, 1).unwrap();
    // materialization point
    w.append(0, &[2; 10]).unwrap();
    let materialized = w.next_sequence_number().unwrap();
    w.append(0, &[3; 10]).unwrap();
    // cp2 from the materialization point
    let to2 = w.next_sequence_number().unwrap();
    w.persist(materialized, 2).unwrap().wait().unwrap();
    w.confirm(materialized, to2, 2).unwrap();
    w.truncate(materialized).unwrap(); // cp1 subsumed
    w.append(0, &[4; 10]).unwrap();
    let to3 = w.next_sequence_number().unwrap();
    w.persist(materialized, 3).unwrap().wait().unwrap();
    w.confirm(materialized, to3, 3).unwrap();
    w.append(0, &[5; 100]).unwrap(); // pre-emptive upload
    w.truncate(to2).unwrap(); // cp2 subsumed
    let to4 = w.next_sequence_number().unwrap();
    let cp4 = w.persist(to2, 4).unwrap().wait().unwrap();
    w.confirm(to2, to4, 4).unwrap();
    storage.wait_idle();
    for path in snapshot_paths(&cp4) {
        assert!(Path::new(&path).exists(), "{path} of cp4 was deleted");
    }
    assert_eq!(
        changes(&storage, &cp4.remote),
        vec![(0, vec![4; 10]), (0, vec![5; 100])]
    );
}

#[test]
fn file_of_a_live_snapshot_survives_truncate_and_close() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &["dstl.dfs.preemptive-persist-threshold=100b"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, &[1; 10]).unwrap();
    let cp1 = w.persist(0, 1).unwrap();
    w.append(0, &[2; 100]).unwrap(); // pre-emptive upload of sqn 1
    let cp1 = cp1.wait().unwrap();
    w.truncate_and_close(1).unwrap();
    storage.wait_idle();
    let cp1_files = snapshot_paths(&cp1);
    for path in &cp1_files {
        assert!(Path::new(path).exists(), "{path} of cp1 was deleted");
    }
    // The pre-emptive upload's file holds only sqn 1, released by truncate-and-close
    // (or on arrival, if it landed after the close).
    let left = path_strings(&files(&storage.config().job_dir()));
    assert_eq!(left.len(), 1, "left: {left:?}");
    assert_eq!(left[0], cp1_files[0]);
}

#[test]
fn no_re_upload_before_completion() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"x").unwrap();
    let a = w.persist(0, 1).unwrap();
    let b = w.persist(0, 2).unwrap();
    assert_eq!(
        a.wait().unwrap().remote.entries,
        b.wait().unwrap().remote.entries
    );
    assert_eq!(uploads(&storage), 1);
}

#[test]
fn persist_newly_appended_uploads_only_new_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"old").unwrap();
    w.persist(0, 1).unwrap().wait().unwrap();
    let sqn = w.next_sequence_number().unwrap();
    w.append(1, b"new").unwrap();
    let snapshot = w.persist(sqn, 2).unwrap().wait().unwrap();
    assert_eq!(
        changes(&storage, &snapshot.remote),
        vec![(1, b"new".to_vec())]
    );
    assert_eq!(snapshot.remote.incremental_size, 3);
    assert_eq!(uploads(&storage), 2);
}

#[test]
fn persist_after_reset_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"kept").unwrap();
    w.reset(0, u64::MAX, i64::MAX).unwrap();
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    assert_eq!(
        changes(&storage, &snapshot.remote),
        vec![(0, b"kept".to_vec())]
    );
}

#[test]
fn upload_failure_fails_the_persist_and_only_the_failed_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &["dstl.dfs.upload.next-attempt-delay=10ms"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let dir = storage.config().job_dir();
    break_dir(&dir);
    w.append(0, b"lost").unwrap();
    let error = upload_error(w.persist(0, 1).unwrap().wait());
    // The store's own error, typed: the job directory is now a file.
    assert_eq!(
        error.io_error_kind(),
        Some(std::io::ErrorKind::NotADirectory),
        "{error}"
    );
    let cause = error.to_string();
    assert!(cause.contains(&*dir.to_string_lossy()), "{cause}");
    assert!(
        cause.starts_with("upload failed after 3 attempts"),
        "{cause}"
    );
    assert_eq!(storage.metrics().upload_failures, 3);
    // Persisting the failed change set again fails at once, naming it.
    let again = writer_error(w.persist(0, 2));
    assert!(
        matches!(&again, WriterError::AlreadyFailed(m) if m.to_string().starts_with("The upload for 0 has already failed previously")),
        "{again:?}"
    );
    // Change sets after the failed one persist fine once the store works again.
    repair_dir(&dir);
    let sqn = w.next_sequence_number().unwrap();
    assert_eq!(sqn, 1);
    w.append(0, b"fresh").unwrap();
    let snapshot = w.persist(sqn, 3).unwrap().wait().unwrap();
    assert_eq!(
        changes(&storage, &snapshot.remote),
        vec![(0, b"fresh".to_vec())]
    );
    assert_eq!(files(&dir).len(), 1, "a failed upload leaves no file");
}

#[test]
fn persist_of_truncated_changes_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"x").unwrap();
    let sqn = w.next_sequence_number().unwrap();
    w.truncate(sqn).unwrap();
    assert_eq!(
        writer_error(w.persist(0, 1)).to_string(),
        "Requested changes were truncated (requested: 0, truncated: 1)"
    );
}

// ---- Flink's FsStateChangelogWriterSqnTest ----

#[test]
fn sequence_numbers_advance_only_on_rollover_of_appended_changes() {
    type Step = fn(&dstl::Writer);
    let append: Step = |w| w.append(0, b"x").unwrap();
    let next: Step = |w| {
        w.next_sequence_number().unwrap();
    };
    let persist_initial: Step = |w| {
        drop(w.persist(0, 1).unwrap());
    };
    let truncate_initial: Step = |w| w.truncate(0).unwrap();
    let truncate_next: Step = |w| {
        let sqn = w.next_sequence_number().unwrap();
        w.truncate(sqn).unwrap();
    };
    // (case, steps, expected active sequence number, changes left open). The host has no
    // query that does not roll over, so the active number is probed with
    // next-sequence-number, which adds one when changes are still open.
    let cases: Vec<(&str, Vec<Step>, u64, bool)> = vec![
        ("next without append", vec![next], 0, false),
        ("next with append", vec![append, next], 1, false),
        (
            "persist initial without append",
            vec![persist_initial],
            0,
            false,
        ),
        (
            "persist initial with append",
            vec![append, persist_initial],
            1,
            false,
        ),
        ("append", vec![append], 0, true),
        ("append twice", vec![append, append], 0, true),
        (
            "truncate initial without append",
            vec![truncate_initial],
            0,
            false,
        ),
        (
            "truncate initial after append",
            vec![append, truncate_initial],
            0,
            true,
        ),
        (
            "truncate next after append",
            vec![append, truncate_next],
            1,
            false,
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &["dstl.dfs.preemptive-persist-threshold=1tb"]);
    for (name, steps, expected, open_changes) in cases {
        let w = storage.create_writer("op", RANGE).unwrap();
        assert_eq!(w.initial_sequence_number().unwrap(), 0);
        for step in steps {
            step(&w);
        }
        let probed = w.next_sequence_number().unwrap();
        assert_eq!(probed - u64::from(open_changes), expected, "{name}");
    }
}

// ---- preconditions and their messages, through the component ----

#[test]
fn preconditions_are_typed_errors_with_exact_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let w = storage
        .create_writer("op-x", KeyGroupRange { start: 0, end: 7 })
        .unwrap();
    assert_eq!(
        writer_error(w.persist(5, 1)).to_string(),
        "Requested changes were not yet appended (requested: 5, appended: 0)"
    );
    w.append(1, b"a").unwrap();
    w.next_sequence_number().unwrap();
    assert_eq!(
        writer_error(w.confirm(1, 0, 1)).to_string(),
        "Invalid confirm range: [1,0)"
    );
    assert_eq!(
        writer_error(w.confirm(0, 3, 1)).to_string(),
        "Invalid confirm range: [0,3), active sqn: 1"
    );
    assert!(
        matches!(writer_error(w.truncate(2)), WriterError::InvalidArgument(m) if m.to_string().contains("beyond the active sequence number 1"))
    );
    assert!(
        matches!(writer_error(w.append(-2, b"")), WriterError::InvalidArgument(m) if m.to_string().contains("-2"))
    );
    assert!(
        matches!(writer_error(w.append(8, b"")), WriterError::InvalidArgument(m) if m.to_string().contains("key group 8 is outside the writer's key-group range [0, 7]"))
    );
    assert!(
        matches!(writer_error(w.append_batch(&[1, 2], &[1], b"a")), WriterError::InvalidArgument(m) if m.to_string().contains("2 key groups but 1 lengths"))
    );
    assert!(
        matches!(writer_error(w.append_batch(&[1], &[5], b"a")), WriterError::InvalidArgument(m) if m.to_string().contains("5 bytes but data holds 1"))
    );
    // The error names the writer.
    let Err(e) = w.append(9, b"") else { panic!() };
    assert!(e.to_string().starts_with("writer op-x: "), "{e}");
    w.close().unwrap();
    assert!(
        matches!(writer_error(w.append(1, b"late")), WriterError::Closed(m) if m.to_string().contains("append after the writer was closed"))
    );
    assert!(matches!(
        writer_error(w.persist(1, 2)),
        WriterError::Closed(_)
    ));
    assert!(
        matches!(writer_error(w.close()), WriterError::Closed(m) if m.to_string().contains("close after the writer was closed"))
    );
    // next-sequence-number still answers after close, frozen.
    assert_eq!(w.next_sequence_number().unwrap(), 1);
}

#[test]
fn close_fails_pending_persists_and_releases_late_uploads() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let mut returned = Vec::new();
    for _ in 0..20 {
        let w = storage.create_writer("op", RANGE).unwrap();
        w.append(0, &[9; 4096]).unwrap();
        let pending = w.persist(0, 1).unwrap();
        w.close().unwrap();
        // Either the upload landed before the close (the persist succeeded, and its
        // snapshot's file stays for the checkpoint) or the close failed it; it never
        // stays pending.
        match pending.wait() {
            Ok(snapshot) => returned.push(snapshot.remote.entries[0].handle.path.clone()),
            Err(e) => assert!(
                matches!(e.writer_error(), Some(WriterError::Closed(_))),
                "{e}"
            ),
        }
    }
    storage.wait_idle();
    assert_eq!(storage.task_registry().tracked(), returned.len());
    let mut left = path_strings(&files(&storage.config().job_dir()));
    left.sort();
    returned.sort();
    assert_eq!(left, returned, "closed writers leave no unreferenced file");
}

// ---- Flink's FsStateChangelogStorageTest ----

fn write_and_read(compression: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(
        tmp.path(),
        &[&format!("dstl.dfs.compression.enabled={compression}")],
    );
    let w = storage.create_writer("op", RANGE).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut appended = Vec::new();
    for key_group in 0..6 {
        for _ in 0..20 {
            let mut value = vec![0; 405];
            rng.fill(&mut value[..]);
            w.append(key_group, &value).unwrap();
            appended.push((key_group, value));
        }
        w.next_sequence_number().unwrap();
    }
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    assert_eq!(snapshot.remote.entries.len(), 6);
    assert_eq!(
        by_key_group(changes(&storage, &snapshot.remote)),
        by_key_group(appended)
    );
    let file = std::fs::read(&snapshot.remote.entries[0].handle.path).unwrap();
    assert_eq!(file[0], u8::from(compression));
}

#[test]
fn write_and_read_plain() {
    write_and_read(false);
}

#[test]
fn write_and_read_compressed() {
    write_and_read(true);
}

#[test]
fn random_round_trips_many_writers() {
    for compression in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let storage = open(
            tmp.path(),
            &[
                &format!("dstl.dfs.compression.enabled={compression}"),
                "dstl.dfs.preemptive-persist-threshold=3kb",
            ],
        );
        std::thread::scope(|scope| {
            for writer in 0..4 {
                let storage = &storage;
                scope.spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(writer);
                    let w = storage
                        .create_writer(&format!("op-{writer}"), RANGE)
                        .unwrap();
                    let mut from = 0;
                    let mut expected: Vec<(i32, Vec<u8>)> = Vec::new();
                    for checkpoint in 1..=15 {
                        for _ in 0..rng.random_range(0..60) {
                            let len = rng.random_range(0..300);
                            let mut value = vec![0; len];
                            rng.fill(&mut value[..]);
                            if rng.random_ratio(1, 10) {
                                w.append_meta(&value).unwrap();
                                expected.push((-1, value));
                            } else {
                                let kg = rng.random_range(0..128);
                                w.append(kg, &value).unwrap();
                                expected.push((kg, value));
                            }
                            if rng.random_ratio(1, 8) {
                                w.next_sequence_number().unwrap();
                            }
                        }
                        let to = w.next_sequence_number().unwrap();
                        let snapshot = w.persist(from, checkpoint).unwrap().wait().unwrap();
                        // Per key group, the order of appends survives exactly.
                        let want = by_key_group(expected.iter().cloned());
                        let got = by_key_group(changes(storage, &snapshot.remote));
                        assert_eq!(got, want, "writer {writer} checkpoint {checkpoint}");
                        w.confirm(from, to, checkpoint).unwrap();
                        if rng.random_ratio(1, 3) {
                            w.truncate(to).unwrap();
                            from = to;
                            expected.clear();
                        }
                    }
                    w.close().unwrap();
                });
            }
        });
    }
}

// ---- registries and uploader layout ----

#[test]
fn files_go_to_base_job_dstl() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(
        tmp.path(),
        &["dstl.job-id=000000000000002a466c696e6b416e63"],
    );
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"x").unwrap();
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    let path = PathBuf::from(&snapshot.remote.entries[0].handle.path);
    let expected_dir = tmp
        .path()
        .canonicalize()
        .unwrap()
        .join("000000000000002a466c696e6b416e63/dstl");
    assert_eq!(path.parent().unwrap(), expected_dir);
    let name = path.file_name().unwrap().to_string_lossy();
    assert_eq!(name.len(), 36, "a UUID file name: {name}");
    assert!(uuid_like(&name));
}

fn uuid_like(name: &str) -> bool {
    name.bytes().enumerate().all(|(i, b)| {
        if [8, 13, 18, 23].contains(&i) {
            b == b'-'
        } else {
            b.is_ascii_hexdigit() && !b.is_ascii_uppercase()
        }
    })
}

#[test]
fn empty_file_with_and_without_compression() {
    let (plain, _) = dstl::codec::encode_file(&[], false).unwrap();
    assert_eq!(plain, vec![0]);
    let (compressed, _) = dstl::codec::encode_file(&[], true).unwrap();
    assert_eq!(
        compressed,
        vec![1, 0xff, 6, 0, 0, b's', b'N', b'a', b'P', b'p', b'Y']
    );
    assert!(dstl::codec::logical_bytes(&compressed).unwrap().is_empty());
}

#[test]
fn task_registry_discards_when_not_used() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let file = storage.config().job_dir().join("tracked");
    std::fs::write(&file, b"x").unwrap();
    let path = file.to_string_lossy().into_owned();
    let registry = storage.task_registry();
    registry.start_tracking(&path, 2);
    registry.release(&path);
    storage.wait_idle();
    assert!(file.exists());
    registry.release(&path);
    storage.wait_idle();
    assert!(!file.exists());
}

#[test]
fn registries_never_delete_outside_their_stores() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let outside = tmp.path().join("precious");
    std::fs::write(&outside, b"x").unwrap();
    let path = outside.to_string_lossy().into_owned();
    storage.task_registry().start_tracking(&path, 1);
    storage.task_registry().release(&path);
    storage.local_registry().register(1, &path, 1);
    storage.local_registry().discard_up_to(1, 2);
    storage.wait_idle();
    assert!(
        outside.exists(),
        "a path outside the stores is never deleted"
    );
}

#[test]
fn task_registry_keeps_files_that_stopped_being_tracked() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let file = storage.config().job_dir().join("confirmed");
    std::fs::write(&file, b"x").unwrap();
    let path = file.to_string_lossy().into_owned();
    let registry = storage.task_registry();
    registry.start_tracking(&path, 2);
    registry.stop_tracking(&path);
    registry.release(&path);
    registry.release(&path);
    storage.wait_idle();
    assert!(file.exists());
}

#[test]
fn local_registry_discards_below_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &["dstl.local-recovery.enabled=true"]);
    let local_dir = storage.config().local_copies_dir().canonicalize().unwrap();
    let [h1, h2, h3] = ["h1", "h2", "h3"].map(|n| {
        let p = local_dir.join(n);
        std::fs::write(&p, b"x").unwrap();
        p
    });
    let s = |p: &PathBuf| p.to_string_lossy().into_owned();
    let registry = storage.local_registry();
    registry.register(1, &s(&h1), 1);
    registry.register(1, &s(&h2), 1);
    registry.register(1, &s(&h2), 2);
    registry.register(1, &s(&h3), 2);
    assert_eq!(registry.discard_up_to(1, 2), vec![s(&h1)]);
    storage.wait_idle();
    assert!(!h1.exists() && h2.exists() && h3.exists());
    // Ownership is per writer: another writer's discard ends only its own claims, and a
    // file goes when nobody claims it any more.
    registry.register(2, &s(&h3), 5);
    assert_eq!(registry.discard_up_to(2, 3), Vec::<String>::new());
    assert_eq!(registry.discard_up_to(1, 3), vec![s(&h2), s(&h3)]);
    storage.wait_idle();
    assert!(!h2.exists() && h3.exists());
    assert_eq!(registry.owners(&s(&h3)), vec![2]);
    assert_eq!(registry.discard_up_to(2, 6), vec![s(&h3)]);
    storage.wait_idle();
    assert!(!h3.exists());
}

// ---- sandbox isolation ----

#[test]
fn a_trapping_writer_does_not_disturb_another() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let healthy = storage.create_writer("healthy", RANGE).unwrap();
    let doomed = storage
        .create_writer_with("doomed", RANGE, WriterOptions::new().memory_limit(2 << 20))
        .unwrap();
    healthy.append(1, b"before").unwrap();
    doomed.append(1, b"small is fine").unwrap();
    let pending = healthy.persist(0, 1).unwrap();
    // 4 MiB cannot be copied into a sandbox capped at 2 MiB: the guest traps.
    let trap = doomed.append(2, &vec![0; 4 << 20]).unwrap_err();
    match &trap {
        Error::Trapped {
            writer,
            kind,
            cause,
        } => {
            assert_eq!(writer, "doomed");
            assert_eq!(*kind, TrapKind::MemoryLimit, "{cause}");
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    assert!(
        trap.to_string()
            .starts_with("writer doomed failed: its sandbox trapped"),
        "{trap}"
    );
    // The trapped writer stays failed, with the same cause, and never hangs.
    assert!(matches!(doomed.append(1, b"x"), Err(Error::Trapped { .. })));
    assert!(matches!(doomed.persist(0, 1), Err(Error::Trapped { .. })));
    assert!(doomed.failure().unwrap().contains("memory"));
    // The other writer carries on.
    healthy.append(1, b"after").unwrap();
    let first = pending.wait().unwrap();
    assert_eq!(
        changes(&storage, &first.remote),
        vec![(1, b"before".to_vec())]
    );
    let to = healthy.next_sequence_number().unwrap();
    let second = healthy.persist(0, 2).unwrap().wait().unwrap();
    assert_eq!(
        changes(&storage, &second.remote),
        vec![(1, b"before".to_vec()), (1, b"after".to_vec())]
    );
    healthy.confirm(0, to, 2).unwrap();
    // And new writers still start.
    let fresh = storage.create_writer("fresh", RANGE).unwrap();
    fresh.append(0, b"ok").unwrap();
}

#[test]
fn bad_writer_arguments_are_rejected_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    for bad in ["", "a\0b", "line\nbreak"] {
        assert!(matches!(
            storage.create_writer(bad, RANGE),
            Err(Error::InvalidArgument(_))
        ));
    }
    let Err(e) = storage.create_writer("op", KeyGroupRange { start: 5, end: 1 }) else {
        panic!()
    };
    assert!(e.to_string().contains("[5, 1]"), "{e}");
}

#[test]
fn a_call_past_its_deadline_is_interrupted_and_others_carry_on() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &["dstl.dfs.preemptive-persist-threshold=1tb"]);
    let healthy = storage.create_writer("healthy", RANGE).unwrap();
    let runaway = storage
        .create_writer_with(
            "runaway",
            RANGE,
            WriterOptions::new().call_timeout(std::time::Duration::from_millis(1)),
        )
        .unwrap();
    healthy.append(1, b"steady").unwrap();
    // A batch whose processing inside the sandbox takes far longer than 1 ms.
    let n = 2_000_000;
    let key_groups = vec![3; n];
    let lengths = vec![40u32; n];
    let data = vec![7u8; n * 40];
    let error = runaway
        .append_batch(&key_groups, &lengths, &data)
        .unwrap_err();
    match &error {
        Error::Trapped {
            writer,
            kind,
            cause,
        } => {
            assert_eq!(writer, "runaway");
            assert_eq!(*kind, TrapKind::Deadline, "{cause}");
            assert!(cause.contains("deadline of 1 ms"), "{cause}");
        }
        other => panic!("expected an interrupted call, got {other:?}"),
    }
    assert!(matches!(
        runaway.next_sequence_number(),
        Err(Error::Trapped { .. })
    ));
    let snapshot = healthy.persist(0, 1).unwrap().wait().unwrap();
    assert_eq!(
        changes(&storage, &snapshot.remote),
        vec![(1, b"steady".to_vec())]
    );
}

#[test]
fn a_trapped_writer_keeps_the_files_of_returned_snapshots() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &["dstl.dfs.preemptive-persist-threshold=1kb"]);
    let w = storage
        .create_writer_with("doomed", RANGE, WriterOptions::new().memory_limit(2 << 20))
        .unwrap();
    w.append(1, b"confirmed").unwrap();
    let to = w.next_sequence_number().unwrap();
    let confirmed = w.persist(0, 1).unwrap().wait().unwrap();
    w.confirm(0, to, 1).unwrap();
    w.append(1, b"uploaded, returned, never confirmed").unwrap();
    let returned = w.persist(to, 2).unwrap().wait().unwrap();
    // A pre-emptive upload that no snapshot names yet.
    w.append(1, &[7; 2048]).unwrap();
    storage.wait_idle();
    let all = files(&storage.config().job_dir());
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(matches!(
        w.append(2, &vec![0; 4 << 20]),
        Err(Error::Trapped {
            kind: TrapKind::MemoryLimit,
            ..
        })
    ));
    storage.wait_idle();
    // The confirmed checkpoint's file belongs to it; the returned snapshot's file may
    // belong to a checkpoint the coordinator completed already, so it stays (tracked, for
    // `dstl gc` once no manifest names it); only the pre-emptive upload is released.
    let mut kept: Vec<String> = [&confirmed, &returned]
        .iter()
        .map(|s| s.remote.entries[0].handle.path.clone())
        .collect();
    kept.sort();
    let left = path_strings(&files(&storage.config().job_dir()));
    assert_eq!(left, kept);
    assert_eq!(
        storage
            .task_registry()
            .count(&returned.remote.entries[0].handle.path),
        Some(1)
    );
    for snapshot in [&confirmed, &returned] {
        assert_eq!(changes(&storage, &snapshot.remote).len(), 1);
    }
}

/// An append racing `close` lands before it or is refused: it is never accepted after the
/// writer closed, only to be dropped without a word (the closed flag and the guest's close
/// change under one lock).
#[test]
fn an_append_racing_close_is_never_accepted_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    for round in 0..200 {
        let w = storage.create_writer("op", RANGE).unwrap();
        let error = std::thread::scope(|s| {
            let appender = s.spawn(|| {
                loop {
                    if let Err(e) = w.append(1, b"x") {
                        return e;
                    }
                }
            });
            std::thread::sleep(std::time::Duration::from_micros(round % 50));
            w.close().unwrap();
            appender.join().unwrap()
        });
        assert!(
            matches!(error.writer_error(), Some(WriterError::Closed(m)) if m.to_string().contains("append after the writer was closed")),
            "{error}"
        );
        // Nothing accepted after the close is waiting to be handed over (and refused).
        assert_eq!(
            w.next_sequence_number()
                .unwrap_or_else(|e| panic!("round {round}: {e}")),
            w.next_sequence_number().unwrap()
        );
    }
}

// ---- orphan collection during a live job ----

/// A writer keeps uploaded change sets for its next snapshot: while no checkpoint
/// completes, their files are named by no manifest and grow older than any grace
/// period. The open storage's lease keeps `dstl gc` from deleting them, so the next
/// acknowledged checkpoint reads back.
#[test]
fn gc_during_a_live_job_keeps_what_the_next_checkpoint_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open(tmp.path(), &[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let (first, _) = dstl_tests::harness::checkpoint(&w, 0, 1, b"one").unwrap();
    dstl::manifest::Manifest::from_snapshot(&first)
        .store(&manifests.join("op.json"))
        .unwrap();
    // Checkpoint 2 is aborted: its change set stays with the writer, in no manifest.
    w.append(2, b"two").unwrap();
    let to = w.next_sequence_number().unwrap();
    w.persist(0, 2).unwrap().wait().unwrap();
    w.reset(0, to, 2).unwrap();
    storage.wait_idle();
    let grace = std::time::Duration::from_millis(500);
    std::thread::sleep(grace * 2);
    let live = dstl::gc::live(&manifests).unwrap();
    let listing = dstl::gc::stored_files(storage.config(), &live.jobs).unwrap();
    assert_eq!(listing.leases.len(), 1, "the open storage's lease");
    let report = dstl::gc::classify(&listing, &live, grace, std::time::SystemTime::now()).unwrap();
    assert!(report.orphans.is_empty(), "{:?}", report.orphans);
    assert_eq!(report.leased, 1);
    dstl::gc::delete(storage.config(), &report).unwrap();
    let (third, _) = dstl_tests::harness::checkpoint(&w, 0, 3, b"three").unwrap();
    assert_eq!(
        dstl_tests::harness::payloads(&storage, &third.remote),
        vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]
    );
    // Closed, the storage holds nothing: its lease is gone, and what no manifest names
    // is an orphan again.
    let config = storage.config().clone();
    drop(w);
    storage.close();
    let listing = dstl::gc::stored_files(&config, &live.jobs).unwrap();
    assert!(listing.leases.is_empty());
}
