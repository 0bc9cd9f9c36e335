//! Writer tests beyond the shared scenarios (`tests/scenarios/*.json`, which both hosts run
//! through `shared_scenarios.rs` and `js/test/scenarios.test.mjs`), driven through the
//! wasmtime host against a real directory: what that format cannot express (a real
//! store's typed failure, reference counts, races), random round trips, the registries
//! and `dstl gc` during a live job.

use std::path::PathBuf;

use dstl::manifest::ManifestFile;
use dstl::{ChangelogStorage, Error, TrapKind, WriterError, WriterOptions};
use dstl_tests::harness::{
    RANGE, break_dir, by_key_group, changes, files, open_temp, path_strings, payloads, upload_error,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---- additions to shared scenarios, each named ----

// Adds over upload-failure-fails-only-the-failed-changes: a real store's typed I/O error, its path.
#[test]
fn upload_failure_of_the_directory_store_is_typed_and_names_the_path() {
    let (_tmp, storage) = open_temp(&["dstl.dfs.upload.next-attempt-delay=10ms"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let dir = storage.config().job_dir();
    break_dir(&dir);
    w.append(0, b"lost").unwrap();
    let error = upload_error(w.persist(0, 1).unwrap().wait());
    // The job directory is now a file.
    assert_eq!(
        error.io_error_kind(),
        Some(std::io::ErrorKind::NotADirectory),
        "{error}"
    );
    assert!(
        error.to_string().contains(&*dir.to_string_lossy()),
        "{error}"
    );
}

// Adds over close-fails-pending-persists-and-releases-late-uploads: unforced close/upload races.
#[test]
fn close_fails_pending_persists_and_releases_late_uploads() {
    let (_tmp, storage) = open_temp(&[]);
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

// Adds over a-trapped-writer-keeps-files-of-returned-snapshots: the file's reference count is 1.
#[test]
fn a_trapped_writer_keeps_the_files_of_returned_snapshots() {
    let (_tmp, storage) = open_temp(&[]);
    let w = storage
        .create_writer_with("doomed", RANGE, WriterOptions::new().memory_limit(2 << 20))
        .unwrap();
    w.append(1, b"returned").unwrap();
    let returned = w.persist(0, 1).unwrap().wait().unwrap();
    assert!(matches!(
        w.append(2, &vec![0; 4 << 20]),
        Err(Error::Trapped {
            kind: TrapKind::MemoryLimit,
            ..
        })
    ));
    storage.wait_idle();
    let path = &returned.remote.entries[0].handle.path;
    assert_eq!(storage.task_registry().count(path), Some(1));
}

// ---- Flink's FsStateChangelogStorageTest ----

#[test]
fn random_round_trips_many_writers() {
    for compression in [false, true] {
        let (_tmp, storage) = open_temp(&[
            &format!("dstl.dfs.compression.enabled={compression}"),
            "dstl.dfs.preemptive-persist-threshold=3kb",
        ]);
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
    let (tmp, storage) = open_temp(&["dstl.job-id=000000000000002a466c696e6b416e63"]);
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

/// A file `name` written in `storage`'s job directory that its task registry tracks for
/// two holders: the file, and its path as handles spell it.
fn tracked_twice(storage: &ChangelogStorage, name: &str) -> (PathBuf, String) {
    let file = storage.config().job_dir().join(name);
    std::fs::write(&file, b"x").unwrap();
    let path = file.to_string_lossy().into_owned();
    storage.task_registry().start_tracking(&path, 2);
    (file, path)
}

#[test]
fn task_registry_discards_when_not_used() {
    let (_tmp, storage) = open_temp(&[]);
    let (file, path) = tracked_twice(&storage, "tracked");
    storage.task_registry().release(&path);
    storage.wait_idle();
    assert!(file.exists());
    storage.task_registry().release(&path);
    storage.wait_idle();
    assert!(!file.exists());
}

#[test]
fn registries_never_delete_outside_their_stores() {
    let (tmp, storage) = open_temp(&[]);
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
    let (_tmp, storage) = open_temp(&[]);
    let (file, path) = tracked_twice(&storage, "confirmed");
    let registry = storage.task_registry();
    registry.stop_tracking(&path);
    registry.release(&path);
    registry.release(&path);
    storage.wait_idle();
    assert!(file.exists());
}

#[test]
fn local_registry_discards_below_checkpoint() {
    let (_tmp, storage) = open_temp(&["dstl.local-recovery.enabled=true"]);
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

// ---- races with close ----

/// An append racing `close` lands before it or is refused: it is never accepted after the
/// writer closed, only to be dropped without a word (the closed flag and the guest's close
/// change under one lock).
#[test]
fn an_append_racing_close_is_never_accepted_after_it() {
    let (_tmp, storage) = open_temp(&[]);
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
    let (tmp, storage) = open_temp(&[]);
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

/// A persist takes the appends buffered before it along, in the same call into the
/// sandbox: one call whether the host buffered them or the caller packed them itself (the
/// Flink plugin's path), and the snapshot holds them.
#[test]
fn a_persist_is_one_call_into_the_sandbox_with_the_buffered_appends() {
    let (_tmp, storage) = open_temp(&["dstl.dfs.batch.persist-delay=0"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    for i in 0..100u8 {
        w.append(0, &[i; 8]).unwrap();
    }
    // Two calls each: the persist, and the delivery of its upload's outcome, which
    // completes it.
    let before = w.guest_calls();
    let first = w.persist(0, 1).unwrap().wait().unwrap();
    assert_eq!(w.guest_calls() - before, 2, "calls of a persist");
    let from = w.next_sequence_number().unwrap();
    let before = w.guest_calls();
    let second = w
        .append_batch_and_persist(&[0, 1, 1], &[1, 2, 3], b"abbccc", from, 2)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(w.guest_calls() - before, 2, "calls of a packed persist");
    assert_eq!(changes(&storage, &first.remote).len(), 100);
    assert_eq!(
        changes(&storage, &second.remote),
        [
            (0, b"a".to_vec()),
            (1, b"bb".to_vec()),
            (1, b"ccc".to_vec())
        ]
    );
}

// ---- blocks lent to uploads (ARCHITECTURE.md, "What a persist crosses") ----

/// A value of `len` bytes that names `i`.
fn numbered(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

/// The host writes a persist's blocks from where they lie in the writer's sandbox, while
/// they wait in their batch: the writer appending on (into whatever memory it is free to
/// reuse) must not change what lands in the file.
#[test]
fn blocks_lent_to_an_upload_stay_as_they_were_while_the_writer_moves_on() {
    let (_tmp, storage) = open_temp(&["dstl.dfs.batch.persist-delay=300ms"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    // Large values are lent in pieces of their own; small ones in the block's headers.
    let appended: Vec<(i32, Vec<u8>)> = (0..64u32)
        .map(|i| {
            (
                (i % 4) as i32,
                numbered(i, if i % 2 == 0 { 5000 } else { 100 }),
            )
        })
        .collect();
    for (key_group, value) in &appended {
        w.append(*key_group, value).unwrap();
    }
    let pending = w.persist(0, 1).unwrap();
    for _ in 0..8 {
        for i in 0..64 {
            w.append(i % 4, &vec![0xEE; if i % 2 == 0 { 5000 } else { 100 }])
                .unwrap();
        }
        w.next_sequence_number().unwrap();
    }
    let snapshot = pending.wait().unwrap();
    assert_eq!(
        by_key_group(changes(&storage, &snapshot.remote)),
        by_key_group(appended)
    );
}

/// A writer dropped while its blocks wait in a batch with another writer's: the file is
/// written from its sandbox's memory all the same (the sandbox lives on until then), and
/// the other writer's change sets read back.
#[test]
fn a_writer_dropped_with_lent_blocks_on_their_way_leaves_the_file_whole() {
    let (_tmp, storage) = open_temp(&["dstl.dfs.batch.persist-delay=300ms"]);
    let gone = storage.create_writer("gone", RANGE).unwrap();
    let stays = storage.create_writer("stays", RANGE).unwrap();
    for i in 0..16 {
        gone.append(0, &numbered(i, 3000)).unwrap();
        stays.append(1, &numbered(i + 100, 3000)).unwrap();
    }
    let lost = gone.persist(0, 1).unwrap();
    let kept = stays.persist(0, 1).unwrap();
    drop(gone);
    drop(lost);
    let snapshot = kept.wait().unwrap();
    let expected: Vec<(i32, Vec<u8>)> = (0..16).map(|i| (1, numbered(i + 100, 3000))).collect();
    assert_eq!(changes(&storage, &snapshot.remote), expected);
    // The file holds the dropped writer's block too, whole.
    let file = std::fs::read(&snapshot.remote.entries[0].handle.path).unwrap();
    let logical = dstl_proto::codec::logical_bytes(&file).unwrap();
    let mut offset = 0;
    let mut all = Vec::new();
    while offset < logical.len() as u64 {
        let mut reader = dstl_proto::codec::ChangeSetReader::new(&logical, offset).unwrap();
        while let Some((key_group, value)) = reader.next_borrowed().unwrap() {
            all.push((key_group, value.to_vec()));
        }
        offset = reader.position();
    }
    let mut dropped: Vec<(i32, Vec<u8>)> = (0..16).map(|i| (0, numbered(i, 3000))).collect();
    dropped.extend(expected);
    assert_eq!(by_key_group(all), by_key_group(dropped));
}

/// Past a quarter of its memory cap a writer's blocks are copied out instead of lent;
/// either way every persist reads back.
#[test]
fn blocks_past_the_lending_bound_are_copied_and_read_back_alike() {
    let (_tmp, storage) = open_temp(&[
        "dstl.writer.memory-limit=4mb",
        "dstl.dfs.batch.persist-delay=200ms",
    ]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let mut pending = Vec::new();
    let mut from = 0;
    for checkpoint in 0..6u32 {
        // 400 KB a persist: the third one in flight passes 1 MB lent.
        let values: Vec<Vec<u8>> = (0..100)
            .map(|i| numbered(checkpoint * 100 + i, 4000))
            .collect();
        for value in &values {
            w.append(2, value).unwrap();
        }
        pending.push((
            w.persist(from, checkpoint as i64 + 1).unwrap(),
            from,
            values,
        ));
        from = w.next_sequence_number().unwrap();
    }
    for (persist, from, values) in pending {
        let snapshot = persist.wait().unwrap();
        let got = payloads(&storage, &snapshot.remote);
        // Each persist covers every change set from `from`: its own values come last.
        assert_eq!(
            got[got.len() - values.len()..],
            values[..],
            "persist from {from}"
        );
    }
}
