//! The shared upload scheduler — batching, retries and timeouts, back-pressure, metrics,
//! closing (README.md, "Uploads: batching, retries, back-pressure"; the scenarios of
//! Flink's BatchingStateChangeUploadSchedulerTest, RetryingExecutorTest,
//! ChangelogStorageMetricsTest and FsStateChangelogStorageTest),
//! through the wasmtime host, with a real directory behind a store that injects faults.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dstl::{ChangelogStorage, Error, SnapshotResult, UploadError, Writer};
use dstl_cli::workload::Workload;
use dstl_tests::fault_store::{Fault, FaultStore};
use dstl_tests::harness::{
    EVENTUALLY, RANGE, files, in_temp_dir, path_strings, payloads, remote_paths, spawn,
    upload_error,
};
use tempfile::TempDir;

/// A storage over `dir` (the harness's, with up to 16 writers) whose uploads go to a
/// [`FaultStore`] with nothing planned yet, then `conf`.
fn open(dir: &Path, conf: &[&str]) -> (ChangelogStorage, Arc<FaultStore>) {
    dstl_tests::harness::open_faulty(dir, &[&["dstl.writer.max-writers=16"][..], conf].concat())
}

/// [`open`] over a fresh temporary directory, which must outlive the storage.
fn open_temp(conf: &[&str]) -> (TempDir, ChangelogStorage, Arc<FaultStore>) {
    let (tmp, (storage, store)) = in_temp_dir(|dir| open(dir, conf));
    (tmp, storage, store)
}

/// [`open_temp`] with `faults` planned for the store, and a writer `op` of the storage
/// that has appended `value` to key group 0.
fn planned(
    conf: &[&str],
    faults: impl IntoIterator<Item = Fault>,
    value: &[u8],
) -> (TempDir, ChangelogStorage, Arc<FaultStore>, Writer) {
    let (tmp, storage, store) = open_temp(conf);
    store.plan(faults);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, value).unwrap();
    (tmp, storage, store, w)
}

/// `conf` after the pairs that upload every task alone and at once: no batch delay, no
/// size threshold.
fn unbatched<'a>(conf: &[&'a str]) -> Vec<&'a str> {
    [
        &[
            "dstl.dfs.batch.persist-delay=0",
            "dstl.dfs.batch.persist-size-threshold=0",
        ][..],
        conf,
    ]
    .concat()
}

/// The files the snapshot's remote handle names.
fn paths(snapshot: &SnapshotResult) -> HashSet<String> {
    remote_paths(snapshot).into_iter().collect()
}

// ---- batching (Flink's BatchingStateChangeUploadSchedulerTest) ----

#[test]
fn without_delay_and_threshold_every_task_uploads_alone() {
    let (_tmp, storage, store) = open_temp(&unbatched(&[]));
    let mut files = HashSet::new();
    for i in 0..3u8 {
        let w = storage.create_writer(&format!("op-{i}"), RANGE).unwrap();
        w.append(0, &[i]).unwrap();
        let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
        assert_eq!(payloads(&storage, &snapshot.remote), vec![vec![i]]);
        files.extend(paths(&snapshot));
    }
    storage.wait_idle();
    let metrics = storage.metrics();
    assert_eq!(files.len(), 3);
    assert_eq!(store.files().len(), 3);
    assert_eq!(metrics.upload_batch_sizes.count, 3);
    assert_eq!(metrics.upload_batch_sizes.max, 1);
}

/// Pre-emptive uploads (no checkpoint waits for them) wait in their batch for company
/// whatever their size, so writers filling up together share a file; a persist's task of
/// half the threshold or more still leaves at once.
#[test]
fn preemptive_uploads_wait_for_company_and_a_persists_large_task_leaves_at_once() {
    let (_tmp, storage, store) = open_temp(&[
        "dstl.dfs.batch.persist-delay=1h",
        "dstl.dfs.batch.persist-size-threshold=1000b",
        "dstl.dfs.preemptive-persist-threshold=600b",
    ]);
    let a = storage.create_writer("a", RANGE).unwrap();
    let b = storage.create_writer("b", RANGE).unwrap();
    a.append(1, &[1; 600]).unwrap();
    assert_eq!(
        storage.metrics().upload_queue_size,
        1,
        "a's pre-emptive upload waits"
    );
    b.append(1, &[2; 600]).unwrap();
    storage.wait_idle();
    let metrics = storage.metrics();
    assert_eq!(metrics.upload_queue_size, 0, "together at the threshold");
    assert_eq!(store.files().len(), 1, "one file for both");
    assert_eq!(metrics.upload_batch_sizes.max, 2);
    let c = storage.create_writer("c", RANGE).unwrap();
    c.append(1, &[3; 500]).unwrap();
    let persisted = c.persist(0, 1).unwrap();
    assert_eq!(
        storage.metrics().upload_queue_size,
        0,
        "the persist's task left at once"
    );
    let snapshot = persisted.wait().unwrap();
    assert_eq!(payloads(&storage, &snapshot.remote), vec![vec![3; 500]]);
}

#[test]
fn size_threshold_sends_one_batch_of_all_writers_in_one_file() {
    let (_tmp, storage, store) = open_temp(&[
        "dstl.dfs.batch.persist-delay=1h",
        "dstl.dfs.batch.persist-size-threshold=77b",
    ]);
    let writers: Vec<_> = (0..7)
        .map(|i| storage.create_writer(&format!("op-{i}"), RANGE).unwrap())
        .collect();
    let mut pending = Vec::new();
    for (i, w) in writers.iter().enumerate() {
        w.append(0, &[i as u8; 11]).unwrap();
        pending.push(w.persist(0, 1).unwrap());
        if i < 6 {
            assert_eq!(storage.metrics().upload_queue_size, i as u64 + 1);
            assert_eq!(
                store.creates(),
                0,
                "below the threshold nothing is uploaded"
            );
        }
    }
    let snapshots: Vec<SnapshotResult> = pending.into_iter().map(|p| p.wait().unwrap()).collect();
    let files: HashSet<String> = snapshots.iter().flat_map(paths).collect();
    assert_eq!(files.len(), 1, "one batch, one file");
    // Tasks are written in queue order.
    let offsets: Vec<u64> = snapshots
        .iter()
        .map(|s| s.remote.entries[0].offset)
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    for (i, snapshot) in snapshots.iter().enumerate() {
        assert_eq!(
            payloads(&storage, &snapshot.remote),
            vec![vec![i as u8; 11]]
        );
    }
    let metrics = storage.metrics();
    assert_eq!(metrics.upload_queue_size, 0);
    assert_eq!(metrics.upload_batch_sizes.max, 7);
    assert_eq!(store.creates(), 1);
}

#[test]
fn delay_batches_persists_arriving_within_it() {
    let (_tmp, storage, store) = open_temp(&["dstl.dfs.batch.persist-delay=1s"]);
    let writers: Vec<_> = (0..4)
        .map(|i| storage.create_writer(&format!("op-{i}"), RANGE).unwrap())
        .collect();
    let started = Instant::now();
    let pending: Vec<_> = writers
        .iter()
        .map(|w| {
            w.append(1, b"x").unwrap();
            w.persist(0, 1).unwrap()
        })
        .collect();
    assert_eq!(store.creates(), 0, "nothing leaves before the delay");
    let files: HashSet<String> = pending
        .into_iter()
        .flat_map(|p| paths(&p.wait().unwrap()))
        .collect();
    assert!(started.elapsed() >= Duration::from_millis(1000));
    assert_eq!(files.len(), 1);
    assert_eq!(store.creates(), 1);
}

#[test]
fn eight_writers_share_few_files() {
    let summary = run_deleting_subsumed(&[], &deleting_workload(8, 80_000, 1_000, 1));
    assert_eq!(summary.checkpoints, 80);
    assert!(
        summary.files < summary.checkpoints,
        "{} files for {} persists",
        summary.files,
        summary.checkpoints
    );
}

/// `dstl run`'s workload of `writers` writers appending `changes` changes in all, 100 bytes
/// each over 128 key groups, with a checkpoint every `checkpoint_every` appends of a writer;
/// it deletes the files of subsumed checkpoints as it goes and does not cap pending ones.
fn deleting_workload(writers: usize, changes: u64, checkpoint_every: u64, seed: u64) -> Workload {
    Workload {
        writers,
        changes,
        change_size: 100,
        key_groups: 128,
        checkpoint_every,
        seed,
        manifests: None,
        delete_subsumed: true,
        max_pending_checkpoints: None,
    }
}

/// Runs `workload`, which deletes the files of subsumed checkpoints, on a storage opened
/// with `conf`: the run verifies, and leaves exactly the files it did not delete.
fn run_deleting_subsumed(conf: &[&str], workload: &Workload) -> dstl_cli::workload::Summary {
    let (_tmp, storage, store) = open_temp(conf);
    let summary = dstl_cli::workload::run(&storage, workload, &|_| {}).unwrap();
    assert!(summary.verified, "{summary:?}");
    assert_eq!(
        store.files().len() as u64,
        summary.files - summary.deleted_files,
        "{summary:?}"
    );
    summary
}

/// `dstl run`'s job manager: with 16 writers sharing files, several persists in flight
/// each and pre-emptive uploads between checkpoints, the run deletes the files of
/// subsumed checkpoints as it goes, never one a checkpoint names (the run would fail
/// naming it), and leaves only what the last checkpoints name.
#[test]
fn a_run_deletes_subsumed_files_and_none_a_checkpoint_still_names() {
    // Enough changes that persists complete while the writers go on appending (40 MB each).
    let workload = deleting_workload(16, 4_000_000, 2_000, 3);
    let summary = run_deleting_subsumed(&["dstl.dfs.preemptive-persist-threshold=16kb"], &workload);
    assert!(summary.deleted_files > 0, "{summary:?}");
}

/// `dstl run`'s cap on pending checkpoints, as Flink's coordinator caps concurrent ones:
/// persists take at least 20 ms and a checkpoint falls due every 100 appends, so with at
/// most one pending the writers take far fewer than fall due and go on appending
/// meanwhile; the run still verifies and deletes what its checkpoints subsumed. Without
/// the cap the same run takes every one.
#[test]
fn a_run_defers_checkpoints_past_its_cap_on_pending_ones() {
    let run = |max_pending_checkpoints| {
        let workload = Workload {
            max_pending_checkpoints,
            ..deleting_workload(2, 20_000, 100, 4)
        };
        run_deleting_subsumed(&["dstl.dfs.batch.persist-delay=20ms"], &workload).checkpoints
    };
    assert_eq!(run(None), 200, "every checkpoint that falls due");
    let capped = run(Some(1));
    assert!(
        capped <= 100,
        "{capped} of 200 checkpoints taken with one pending at most"
    );
}

// ---- retries, timeouts and faults (Flink's BatchingStateChangeUploadSchedulerTest and
// RetryingExecutorTest; I/O failures are retried unlike Flink: ARCHITECTURE.md F8) ----

#[test]
fn transient_failures_are_retried_and_leave_one_file() {
    let (_tmp, storage, store) = open_temp(&[
        "dstl.dfs.upload.max-attempts=5",
        "dstl.dfs.upload.next-attempt-delay=0",
    ]);
    store.plan([Fault::Fail, Fault::Fail, Fault::Fail, Fault::Fail]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(3, b"survives").unwrap();
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    assert_eq!(
        payloads(&storage, &snapshot.remote),
        vec![b"survives".to_vec()]
    );
    storage.wait_idle();
    assert_eq!(store.files().len(), 1);
    let m = storage.metrics();
    assert_eq!((m.upload_requests, m.upload_failures), (5, 4));
    assert_eq!(
        (m.attempts_per_upload.max, m.total_attempts_per_upload.max),
        (5, 5)
    );
}

#[test]
fn permanent_failure_fails_the_persist_with_its_cause_and_leaves_nothing() {
    let (_tmp, storage, store) = open_temp(&["dstl.dfs.upload.next-attempt-delay=5ms"]);
    store.set_broken(true);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"doomed").unwrap();
    let error = upload_error(w.persist(0, 1).unwrap().wait());
    assert!(error.io_error().is_some(), "{error}");
    let cause = error.to_string();
    assert!(cause.contains("after 3 attempts"), "{cause}");
    assert!(cause.contains("injected: the store is down"), "{cause}");
    assert_eq!(store.creates(), 3);
    // Later persists that exclude the failed change set succeed.
    store.set_broken(false);
    let sqn = w.next_sequence_number().unwrap();
    w.append(0, b"fine").unwrap();
    let snapshot = w.persist(sqn, 2).unwrap().wait().unwrap();
    assert_eq!(payloads(&storage, &snapshot.remote), vec![b"fine".to_vec()]);
    storage.wait_idle();
    assert_eq!(
        store.files().len(),
        1,
        "no file of the failed upload is left"
    );
}

#[test]
fn a_hung_upload_is_overtaken_and_its_late_file_deleted() {
    let (_tmp, storage, store, w) = planned(
        &["dstl.dfs.upload.timeout=200ms"],
        [Fault::Hang],
        b"speculative",
    );
    let started = Instant::now();
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        payloads(&storage, &snapshot.remote),
        vec![b"speculative".to_vec()]
    );
    store.open_gate();
    storage.wait_idle();
    let files = store.files();
    assert_eq!(files.len(), 1, "the loser's file is deleted: {files:?}");
    assert_eq!(
        paths(&snapshot),
        HashSet::from([files[0].to_string_lossy().into_owned()])
    );
    let m = storage.metrics();
    assert_eq!(
        (m.attempts_per_upload.max, m.total_attempts_per_upload.max),
        (2, 2)
    );
}

#[test]
fn a_speculative_losers_local_copy_is_deleted_too() {
    let (_tmp, storage, store, w) = planned(
        &[
            "dstl.dfs.upload.timeout=200ms",
            "dstl.local-recovery.enabled=true",
        ],
        [Fault::Hang],
        b"twice",
    );
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    store.open_gate();
    storage.wait_idle();
    let local = snapshot.local.expect("local handle");
    assert_eq!(
        files(&storage.config().local_copies_dir()),
        vec![PathBuf::from(&local.entries[0].handle.path)]
    );
    assert_eq!(store.files().len(), 1);
}

#[test]
fn last_attempt_timing_out_fails_and_the_late_file_is_deleted() {
    let (_tmp, storage, store, w) = planned(
        &[
            "dstl.dfs.upload.timeout=100ms",
            "dstl.dfs.upload.max-attempts=1",
        ],
        [Fault::Hang],
        b"late",
    );
    let error = w.persist(0, 1).unwrap().wait().unwrap_err();
    assert!(
        error
            .to_string()
            .contains("attempt 1 timed out after 100 ms"),
        "{error}"
    );
    store.open_gate();
    storage.wait_idle();
    assert!(store.files().is_empty(), "{:?}", store.files());
}

#[test]
fn retry_policy_none_makes_a_single_attempt() {
    let (_tmp, _storage, store, w) =
        planned(&["dstl.dfs.upload.retry-policy=none"], [Fault::Fail], b"x");
    assert!(w.persist(0, 1).unwrap().wait().is_err());
    assert_eq!(store.creates(), 1);
}

#[test]
fn writers_closed_with_uploads_in_flight_leave_only_referenced_files() {
    let (_tmp, storage, store) = open_temp(&[
        "dstl.dfs.batch.persist-delay=20ms",
        "dstl.dfs.preemptive-persist-threshold=2kb",
    ]);
    let mut live = HashSet::new();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let storage = &storage;
                scope.spawn(move || {
                    let w = storage.create_writer(&format!("op-{i}"), RANGE).unwrap();
                    let mut kept = HashSet::new();
                    for cp in 1..=5 {
                        w.append(i, &[i as u8; 1500]).unwrap();
                        let to = w.next_sequence_number().unwrap();
                        let pending = w.persist(0, cp).unwrap();
                        if i % 2 == 0 && cp == 3 {
                            // Close with the persist (and pre-emptive uploads) in flight.
                            w.close().unwrap();
                            // Either the upload landed first or the close failed it.
                            let _ = pending.wait();
                            return kept;
                        }
                        let snapshot = pending.wait().unwrap();
                        w.confirm(0, to, cp).unwrap();
                        kept.extend(paths(&snapshot));
                    }
                    kept
                })
            })
            .collect();
        for h in handles {
            live.extend(h.join().unwrap());
        }
    });
    storage.wait_idle();
    let on_disk: HashSet<String> = path_strings(&store.files()).into_iter().collect();
    assert_eq!(
        on_disk, live,
        "every file is referenced by a confirmed snapshot or deleted"
    );
}

// ---- back-pressure and availability (Flink's BatchingStateChangeUploadSchedulerTest) ----

#[test]
fn back_pressure_blocks_until_uploads_complete() {
    let (_tmp, storage, store) = open_temp(&unbatched(&[
        "dstl.dfs.upload.max-in-flight=1000b",
        "dstl.dfs.upload.timeout=0",
    ]));
    store.plan([Fault::Hang]);
    let storage = Arc::new(storage);
    let a = storage.create_writer("a", RANGE).unwrap();
    a.append(0, &[1; 500]).unwrap();
    a.next_sequence_number().unwrap();
    a.append(0, &[2; 500]).unwrap();
    let first = a.persist(0, 1).unwrap();
    let availability = storage.availability();
    assert!(!availability.is_available(), "1000 of 1000 bytes in flight");
    assert_eq!(storage.metrics().bytes_in_flight, 1000);
    let s = storage.clone();
    let blocked = spawn(move || {
        let b = s.create_writer("b", RANGE).unwrap();
        b.append(0, &[3]).unwrap();
        let snapshot = b.persist(0, 1).unwrap().wait().unwrap();
        payloads(&s, &snapshot.remote)
    });
    assert!(
        blocked.recv_timeout(Duration::from_millis(500)).is_err(),
        "a further upload waits while the limit is reached"
    );
    store.open_gate();
    assert_eq!(first.wait().unwrap().remote.entries.len(), 2);
    assert_eq!(blocked.recv_timeout(EVENTUALLY).unwrap(), vec![vec![3]]);
    let mut availability = availability;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { tokio::time::timeout(EVENTUALLY, availability.available()).await })
        .unwrap();
}

#[test]
fn a_task_above_the_limit_is_admitted_when_below_it() {
    let (_tmp, storage, _) = open_temp(&[
        "dstl.dfs.batch.persist-delay=0",
        "dstl.dfs.upload.max-in-flight=100b",
        "dstl.dfs.batch.persist-size-threshold=10b",
    ]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, &[7; 101]).unwrap();
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    assert_eq!(snapshot.remote.state_size, 101);
}

/// Flink's FsStateChangelogStorageTest testDeadlockOnUploadCompletion: every append
/// persists (threshold 0), capacity is 10 bytes and uploads hang until the third append
/// blocks on capacity.
#[test]
fn no_deadlock_when_an_upload_completes_while_the_writer_waits_for_capacity() {
    let (_tmp, storage, store) = open_temp(&unbatched(&[
        "dstl.dfs.upload.max-in-flight=10b",
        "dstl.dfs.upload.num-threads=1",
        "dstl.dfs.upload.timeout=0",
        "dstl.dfs.preemptive-persist-threshold=0",
    ]));
    store.plan([Fault::Hang, Fault::Hang]);
    let storage = Arc::new(storage);
    let s = storage.clone();
    let done = spawn(move || {
        let w = s.create_writer("op", RANGE).unwrap();
        w.append(0, &[1]).unwrap();
        w.append(0, &[2; 10]).unwrap();
        w.append(0, &[3]).unwrap(); // waits for capacity inside the writer's call
        let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
        payloads(&s, &snapshot.remote)
    });
    assert!(
        done.recv_timeout(Duration::from_millis(300)).is_err(),
        "the third append waits"
    );
    store.open_gate();
    assert_eq!(
        done.recv_timeout(EVENTUALLY).expect("no deadlock"),
        vec![vec![1], vec![2; 10], vec![3]]
    );
}

// ---- metrics (Flink's ChangelogStorageMetricsTest) ----

#[test]
fn metrics_count_uploads_sizes_and_failures() {
    let (_tmp, storage, store) = open_temp(&[
        "dstl.dfs.batch.persist-delay=0",
        "dstl.dfs.upload.retry-policy=none",
    ]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let mut from = 0;
    for i in 0..5 {
        w.append(0, &[i; 4]).unwrap();
        let to = w.next_sequence_number().unwrap();
        w.persist(from, i as i64 + 1).unwrap().wait().unwrap();
        from = to;
    }
    let m = storage.metrics();
    assert_eq!(m.upload_requests, 5);
    assert!(m.upload_latencies_nanos.min > 0);
    // A 1-byte change is 1 + 16 framing bytes; a 33-byte one 49.
    w.append(0, &[1]).unwrap();
    w.persist(from, 6).unwrap().wait().unwrap();
    assert_eq!(storage.metrics().upload_sizes.min, 17);
    let to = w.next_sequence_number().unwrap();
    w.append(0, &[1; 33]).unwrap();
    w.persist(to, 7).unwrap().wait().unwrap();
    assert_eq!(storage.metrics().upload_sizes.max, 49);
    // Failures.
    store.set_broken(true);
    for cp in 8..13 {
        let from = w.next_sequence_number().unwrap();
        w.append(0, b"x").unwrap();
        assert!(w.persist(from, cp).unwrap().wait().is_err());
    }
    assert_eq!(storage.metrics().upload_failures, 5);
}

#[test]
fn metrics_of_batches_attempts_and_queue() {
    let (_tmp, storage, store) = open_temp(&[
        "dstl.dfs.batch.persist-delay=1h",
        "dstl.dfs.batch.persist-size-threshold=5b",
        "dstl.dfs.upload.next-attempt-delay=0",
    ]);
    let writers: Vec<_> = (0..5)
        .map(|i| storage.create_writer(&format!("op-{i}"), RANGE).unwrap())
        .collect();
    for round in 1..=3 {
        store.plan([Fault::Fail, Fault::Fail]);
        let pending: Vec<_> = writers
            .iter()
            .map(|w| {
                let from = w.next_sequence_number().unwrap();
                w.append(0, b"y").unwrap();
                w.persist(from, round).unwrap()
            })
            .collect();
        for p in pending {
            p.wait().unwrap();
        }
    }
    let m = storage.metrics();
    assert_eq!(
        (
            m.upload_batch_sizes.min,
            m.upload_batch_sizes.max,
            m.upload_batch_sizes.count
        ),
        (5, 5, 3)
    );
    assert_eq!(
        (m.attempts_per_upload.min, m.attempts_per_upload.max),
        (3, 3)
    );
    // The queue gauge counts tasks waiting for their batch.
    for w in &writers[..4] {
        let from = w.next_sequence_number().unwrap();
        w.append(0, b"z").unwrap();
        drop(w.persist(from, 9).unwrap());
    }
    assert_eq!(storage.metrics().upload_queue_size, 4);
}

#[test]
fn closing_the_storage_fails_queued_uploads() {
    let (_tmp, storage, _) = open_temp(&["dstl.dfs.batch.persist-delay=1h"]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, b"queued").unwrap();
    let pending = w.persist(0, 1).unwrap();
    assert_eq!(storage.metrics().upload_queue_size, 1);
    let started = Instant::now();
    storage.close();
    let source = upload_error(pending.wait());
    assert!(matches!(source, UploadError::ClosedBeforeStart), "{source}");
    assert!(started.elapsed() < EVENTUALLY);
    // The writer learns about it on its next persist, with a typed error.
    let error = w.persist(0, 2).unwrap_err();
    assert!(matches!(error, Error::Writer { .. }), "{error}");
}

// ---- waiting in the host is not guest time ----

/// A writer blocked on in-flight capacity (inside its `schedule` import) for far longer
/// than its call deadline is not interrupted: the deadline counts guest time only.
#[test]
fn waiting_for_capacity_does_not_count_against_the_call_deadline() {
    let (_tmp, storage, store) = open_temp(&unbatched(&[
        "dstl.dfs.upload.max-in-flight=10b",
        "dstl.dfs.upload.timeout=0",
        "dstl.writer.call-timeout=5ms",
    ]));
    store.plan([Fault::Delay(Duration::from_millis(300))]);
    let w = storage.create_writer("patient", RANGE).unwrap();
    w.append(0, &[1; 10]).unwrap();
    let first = w.persist(0, 1).unwrap();
    let from = w.next_sequence_number().unwrap();
    w.append(0, &[2; 10]).unwrap();
    let started = Instant::now();
    // The limit is reached: this persist waits ~300 ms for the first upload.
    let second = w.persist(from, 2).unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "the persist waited for capacity ({:?})",
        started.elapsed()
    );
    assert_eq!(
        payloads(&storage, &first.wait().unwrap().remote),
        vec![vec![1; 10]]
    );
    assert_eq!(
        payloads(&storage, &second.wait().unwrap().remote),
        vec![vec![2; 10]]
    );
    assert!(w.failure().is_none());
}

// ---- closing the storage ----

/// An upload still running when the close grace period ends is abandoned: its persist
/// fails instead of staying pending for as long as the writer lives.
#[test]
fn close_fails_persists_whose_uploads_are_still_running() {
    let (_tmp, storage, store, w) = planned(
        &[
            "dstl.dfs.batch.persist-delay=0",
            "dstl.dfs.upload.timeout=0",
            "dstl.dfs.upload.max-attempts=1",
        ],
        [Fault::Hang],
        b"hung",
    );
    let pending = w.persist(0, 1).unwrap();
    let started = Instant::now();
    storage.close();
    let closed_after = started.elapsed();
    let outcome = spawn(move || pending.wait())
        .recv_timeout(Duration::from_secs(10))
        .expect("the persist completes at close, not when the writer is dropped");
    let source = upload_error(outcome);
    assert!(matches!(source, UploadError::Abandoned), "{source}");
    assert!(closed_after < EVENTUALLY);
    // The writer is still usable and says the storage is closed.
    assert!(w.persist(0, 2).is_err());
    store.open_gate();
}

/// A writer that outlives its storage still has its releases carried out: dropping it
/// deletes the files no returned snapshot names.
#[test]
fn releases_after_close_are_carried_out() {
    let (_tmp, storage, store) = open_temp(&[
        "dstl.dfs.batch.persist-delay=0",
        "dstl.dfs.preemptive-persist-threshold=10b",
    ]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(0, &[5; 20]).unwrap(); // uploaded pre-emptively, named by no snapshot
    storage.wait_idle();
    assert_eq!(store.files().len(), 1);
    storage.close();
    drop(w);
    assert!(store.files().is_empty(), "{:?}", store.files());
}

// ---- deletions ----

/// `dstl.dfs.discard.num-threads` bounds the deletions running at once.
#[test]
fn deletions_run_on_at_most_discard_num_threads() {
    for threads in [1u32, 3] {
        let (_tmp, storage, store) = open_temp(&[
            "dstl.dfs.batch.persist-delay=0",
            &format!("dstl.dfs.discard.num-threads={threads}"),
        ]);
        let w = storage.create_writer("op", RANGE).unwrap();
        let mut from = 0;
        for cp in 1..=8 {
            w.append(0, &[cp as u8; 8]).unwrap();
            let to = w.next_sequence_number().unwrap();
            w.persist(from, cp).unwrap().wait().unwrap();
            from = to;
        }
        storage.wait_idle();
        assert_eq!(store.files().len(), 8);
        store.set_delete_gate(false);
        w.truncate(from).unwrap(); // releases all eight files
        std::thread::sleep(Duration::from_millis(300));
        store.set_delete_gate(true);
        storage.wait_idle();
        assert!(store.files().is_empty());
        assert_eq!(store.max_concurrent_deletes(), threads);
    }
}

// ---- hung stores and idle writers ----

/// Hung attempts that hold every upload thread do not stop the retry policy: the attempt
/// waiting for a thread is on the clock too, so the persist fails within
/// `max-attempts × timeout` whatever the store does.
#[test]
fn a_frozen_store_fails_persists_within_the_retry_policy() {
    let (_tmp, storage, store, w) = planned(
        &[
            "dstl.dfs.batch.persist-delay=0",
            "dstl.dfs.upload.num-threads=1",
            "dstl.dfs.upload.timeout=200ms",
            "dstl.dfs.upload.max-attempts=2",
        ],
        [Fault::Hang, Fault::Hang, Fault::Hang, Fault::Hang],
        b"frozen",
    );
    let started = Instant::now();
    let first = w.persist(0, 1).unwrap();
    let from = w.next_sequence_number().unwrap();
    w.append(0, b"behind").unwrap();
    let second = w.persist(from, 2).unwrap();
    let outcomes = spawn(move || (first.wait(), second.wait()))
        .recv_timeout(Duration::from_secs(5))
        .expect("both persists fail within their retry policy");
    let failed_after = started.elapsed();
    for outcome in [outcomes.0, outcomes.1] {
        let error = outcome.unwrap_err();
        assert!(
            error.to_string().contains("timed out after 200 ms"),
            "{error}"
        );
    }
    assert!(failed_after < Duration::from_secs(3), "{failed_after:?}");
    store.open_gate();
    storage.wait_idle();
    assert!(store.files().is_empty(), "{:?}", store.files());
}

/// `Writer::close` does not wait behind a call of the same writer that is blocked on the
/// in-flight limit of a frozen store: it returns at once and fails that call. Nor does an
/// embedding that serializes the writer's calls under a lock of its own (the Flink
/// plugin's writer monitor, which Flink's canceler takes before it interrupts the task):
/// it raises the writer's [`dstl::CloseSignal`] first, which ends the blocked call and
/// frees the lock.
#[test]
fn closing_a_writer_ends_its_call_waiting_for_capacity() {
    for own_lock in [false, true] {
        let (_tmp, _storage, store, w) = planned(
            &unbatched(&[
                "dstl.dfs.upload.max-in-flight=10b",
                "dstl.dfs.upload.timeout=0",
            ]),
            [Fault::Hang],
            &[1; 10],
        );
        let _first = w.persist(0, 1).unwrap();
        let from = w.next_sequence_number().unwrap();
        w.append(0, &[2; 10]).unwrap();
        let signal = w.close_signal();
        let w = Arc::new(w);
        // The embedding's lock, which the blocked call holds throughout.
        let embedding = Arc::new(std::sync::Mutex::new(()));
        let (blocked, lock) = (w.clone(), embedding.clone());
        let second = spawn(move || {
            let _held = lock.lock().unwrap();
            blocked.persist(from, 2).map(|_| ())
        });
        assert!(
            second.recv_timeout(Duration::from_millis(300)).is_err(),
            "the second persist waits for capacity"
        );
        let started = Instant::now();
        if own_lock {
            signal.raise();
            // The blocked call gives the embedding's lock back (no waiting forever here).
            let _held = loop {
                if let Ok(held) = embedding.try_lock() {
                    break held;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(1),
                    "the blocked call still holds the embedding's lock"
                );
                std::thread::sleep(Duration::from_millis(5));
            };
            w.close().unwrap();
        } else {
            w.close().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "own lock {own_lock}: {:?}",
            started.elapsed()
        );
        let outcome = second
            .recv_timeout(Duration::from_secs(1))
            .expect("the waiting call ends with the close");
        let error = outcome.unwrap_err();
        assert!(
            error.to_string().contains("closed"),
            "own lock {own_lock}: {error}"
        );
        store.open_gate();
    }
}

/// Outcomes reach their persists while the writer is idle: no further call of the writer
/// is needed, however the uploads' completions interleave with its appends.
#[test]
fn persists_of_an_idle_writer_complete_without_further_calls() {
    let (_tmp, storage, _store) = open_temp(&unbatched(&[]));
    let w = storage.create_writer("op", RANGE).unwrap();
    let mut pending = Vec::new();
    let mut from = 0;
    let mut i = 0u32;
    for checkpoint in 1..=30 {
        w.append(0, &[1; 64]).unwrap();
        pending.push(w.persist(from, checkpoint).unwrap());
        from = w.next_sequence_number().unwrap();
        // Single appends, which the host buffers, while the upload completes: its outcome
        // arrives while a buffered append holds the writer.
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(20) {
            w.append((i % 128) as i32, &i.to_le_bytes()).unwrap();
            i += 1;
        }
    }
    // The writer is idle from here on.
    let outcomes = spawn(move || pending.into_iter().map(|p| p.wait()).collect::<Vec<_>>())
        .recv_timeout(EVENTUALLY)
        .expect("every persist completes while the writer is idle");
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
}

/// A writer dropped while its blocks hang in an upload keeps its sandbox's pool slot (the
/// upload still reads the sandbox's memory). A writer created while the pool is full of
/// such sandboxes waits for one to end, and gives up at once when its thread's interrupt
/// check says so.
#[test]
fn a_new_writer_waits_for_a_slot_kept_by_a_hung_upload_unless_interrupted() {
    let conf = unbatched(&["dstl.writer.max-writers=1"]);
    let (_tmp, (storage, store)) = in_temp_dir(|dir| dstl_tests::harness::open_faulty(dir, &conf));
    store.plan([Fault::Hang]);
    let w = storage.create_writer("first", RANGE).unwrap();
    w.append(0, b"lent").unwrap();
    let pending = w.persist(0, 1).unwrap();
    let deadline = Instant::now() + EVENTUALLY;
    while store.creates() == 0 {
        assert!(Instant::now() < deadline, "the upload never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(pending);
    drop(w);
    let started = Instant::now();
    let refused = dstl::interruptible(&|| true, || storage.create_writer("second", RANGE));
    let Err(error) = refused else {
        panic!("the only slot is kept by the hung upload's sandbox");
    };
    assert!(error.to_string().contains("instances"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "an interrupted wait ends at once"
    );
    let gate = {
        let store = store.clone();
        spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            store.open_gate();
        })
    };
    let started = Instant::now();
    let second = storage.create_writer("second", RANGE).unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "it waited for the slot"
    );
    gate.recv().unwrap();
    second.append(0, b"next").unwrap();
    let snapshot = second.persist(0, 1).unwrap().wait().unwrap();
    assert_eq!(payloads(&storage, &snapshot.remote), vec![b"next".to_vec()]);
}
