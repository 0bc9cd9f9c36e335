//! The sandbox boundary, tested with a misbehaving writer component built for the
//! purpose (`tests/hostile-guest/`): a guest is not trusted, so the host accepts
//! `release`, `stop-tracking` and local `register` only for files that writer holds and
//! traps a writer that asks for anything else; time a writer spends blocked in the host
//! does not count against its call deadline, while guest computation still does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dstl::{
    ChangelogStorage, Error, SnapshotResult, TrapKind, Writer, WriterComponent, WriterOptions,
};
use dstl_tests::harness::{RANGE, break_dir, files, in_temp_dir, remote_paths};
use tempfile::TempDir;

/// The misbehaving component, as `tests/build.rs` built it.
const HOSTILE: &[u8] = include_bytes!(env!("DSTL_HOSTILE_GUEST_WASM"));

/// A storage over `dir` (the harness's), and the hostile component compiled for it.
fn open(dir: &Path, conf: &[&str]) -> (ChangelogStorage, WriterComponent) {
    let storage = dstl_tests::harness::open(dir, conf);
    let hostile = storage.compile_component(HOSTILE).unwrap();
    (storage, hostile)
}

/// [`open`] over a fresh temporary directory, which must outlive the storage.
fn open_temp(conf: &[&str]) -> (TempDir, ChangelogStorage, WriterComponent) {
    let (tmp, (storage, hostile)) = in_temp_dir(|dir| open(dir, conf));
    (tmp, storage, hostile)
}

fn hostile(
    storage: &ChangelogStorage,
    component: &WriterComponent,
    options: WriterOptions,
) -> Writer {
    storage
        .create_writer_with("hostile", RANGE, options.component(component.clone()))
        .unwrap()
}

/// Runs a command in the hostile guest (see its crate docs): a packed batch goes to the
/// guest at once, unlike single appends, which the host buffers.
fn command(writer: &Writer, command: &str) -> Result<(), Error> {
    writer.append_batch(&[-1], &[command.len() as u32], command.as_bytes())
}

/// A healthy writer with a snapshot returned to the caller (not confirmed).
fn returned_snapshot(storage: &ChangelogStorage, value: &[u8]) -> (Writer, SnapshotResult) {
    let w = storage.create_writer("healthy", RANGE).unwrap();
    w.append(1, value).unwrap();
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    storage.wait_idle();
    (w, snapshot)
}

fn expect_trap(result: Result<(), Error>, expected: TrapKind, mentions: &str) -> String {
    match result {
        Err(Error::Trapped {
            writer,
            kind,
            cause,
        }) => {
            assert_eq!(writer, "hostile");
            assert_eq!(kind, expected, "{cause}");
            assert!(cause.contains(mentions), "{cause}");
            cause
        }
        other => panic!("expected a {expected:?} trap, got {other:?}"),
    }
}

#[test]
fn releasing_another_writers_file_traps_the_releaser_only() {
    let (_tmp, storage, component) = open_temp(&[]);
    let (healthy, snapshot) = returned_snapshot(&storage, b"precious");
    let path = remote_paths(&snapshot)[0].clone();
    let count = storage.task_registry().count(&path);
    assert_eq!(count, Some(1));
    let h = hostile(&storage, &component, WriterOptions::default());
    let cause = expect_trap(
        command(&h, &format!("release {path}")),
        TrapKind::GuestFault,
        &path,
    );
    assert!(cause.contains("does not hold"), "{cause}");
    storage.wait_idle();
    assert!(
        Path::new(&path).exists(),
        "the other writer's file survives"
    );
    assert_eq!(storage.task_registry().count(&path), count);
    // The trapped writer stays failed; the healthy one carries on.
    assert!(matches!(
        command(&h, "discard 1"),
        Err(Error::Trapped {
            kind: TrapKind::GuestFault,
            ..
        })
    ));
    assert_eq!(storage.read(&snapshot.remote).unwrap().len(), 1);
    healthy.append(2, b"more").unwrap();
    healthy.persist(0, 2).unwrap().wait().unwrap();
}

#[test]
fn stop_tracking_another_writers_file_traps_the_caller() {
    let (_tmp, storage, component) = open_temp(&[]);
    let (_healthy, snapshot) = returned_snapshot(&storage, b"tracked");
    let path = remote_paths(&snapshot)[0].clone();
    let h = hostile(&storage, &component, WriterOptions::default());
    expect_trap(
        command(&h, &format!("stop-tracking {path}")),
        TrapKind::GuestFault,
        &path,
    );
    // Still tracked: a later release by its owner would delete it as it should.
    assert_eq!(storage.task_registry().count(&path), Some(1));
}

#[test]
fn registering_another_writers_local_copy_traps_and_discards_touch_only_own_claims() {
    let (_tmp, storage, component) = open_temp(&["dstl.local-recovery.enabled=true"]);
    let (healthy, snapshot) = returned_snapshot(&storage, b"local");
    let local = snapshot.local.as_ref().unwrap().entries[0]
        .handle
        .path
        .clone();
    assert!(Path::new(&local).exists());
    // A discard by a writer that claims nothing discards nothing.
    let bystander = hostile(&storage, &component, WriterOptions::default());
    command(&bystander, "discard 1000").unwrap();
    storage.wait_idle();
    assert!(Path::new(&local).exists());
    // Registering someone else's copy (to have it discarded) is a guest fault.
    let h = hostile(&storage, &component, WriterOptions::default());
    expect_trap(
        command(&h, &format!("register {local} 1")),
        TrapKind::GuestFault,
        &local,
    );
    storage.wait_idle();
    assert!(Path::new(&local).exists());
    assert_eq!(storage.local_registry().owners(&local), vec![healthy.id()]);
    let local_handle = snapshot.local.clone().unwrap();
    assert_eq!(storage.read(&local_handle).unwrap().len(), 1);
}

#[test]
fn a_guest_that_computes_past_its_deadline_is_still_interrupted() {
    let (_tmp, storage, component) = open_temp(&[]);
    let h = hostile(
        &storage,
        &component,
        WriterOptions::new().call_timeout(Duration::from_millis(50)),
    );
    let started = std::time::Instant::now();
    expect_trap(command(&h, "spin"), TrapKind::Deadline, "deadline of 50 ms");
    assert!(started.elapsed() >= Duration::from_millis(50));
    let (_healthy, snapshot) = returned_snapshot(&storage, b"unaffected");
    assert_eq!(storage.read(&snapshot.remote).unwrap().len(), 1);
}

#[test]
fn waiting_in_the_host_does_not_use_up_the_deadline() {
    // Uploads fail and are retried after 300 ms, their bytes in flight all the while, so
    // the second schedule blocks on the in-flight limit for about that long.
    let (_tmp, storage, component) = open_temp(&[
        "dstl.dfs.batch.persist-delay=0",
        "dstl.dfs.batch.persist-size-threshold=10b",
        "dstl.dfs.upload.max-in-flight=10b",
        "dstl.dfs.upload.max-attempts=2",
        "dstl.dfs.upload.next-attempt-delay=300ms",
    ]);
    break_dir(&storage.config().job_dir());
    let h = hostile(
        &storage,
        &component,
        WriterOptions::new().call_timeout(Duration::from_millis(20)),
    );
    command(&h, "schedule 10").unwrap();
    let started = std::time::Instant::now();
    command(&h, "schedule 10").unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "the second schedule waited for capacity ({:?})",
        started.elapsed()
    );
    assert!(h.failure().is_none());
}

#[test]
fn panics_and_memory_growth_trap_with_their_kind() {
    let (_tmp, storage, component) = open_temp(&[]);
    panics_and_memory_growth_trap(&storage, &component);
}

/// A guest panic and memory growth past a 4 MB cap, each in a writer of its own.
fn panics_and_memory_growth_trap(storage: &ChangelogStorage, component: &WriterComponent) {
    let h = hostile(storage, component, WriterOptions::default());
    let cause = expect_trap(command(&h, "panic on purpose"), TrapKind::GuestPanic, "");
    assert!(cause.contains("on purpose"), "the guest's message: {cause}");
    let h = hostile(
        storage,
        component,
        WriterOptions::new().memory_limit(4 << 20),
    );
    expect_trap(
        command(&h, "grow 16000000"),
        TrapKind::MemoryLimit,
        "memory",
    );
}

/// Without signal handlers (how the Flink plugin runs inside a JVM) faults are still
/// contained: explicit bounds checks turn them into the same traps.
#[test]
fn without_signal_handlers_guest_faults_still_trap_with_their_kind() {
    let (_tmp, storage, component) = open_temp(&["dstl.writer.signals-based-traps=false"]);
    panics_and_memory_growth_trap(&storage, &component);
    // A healthy writer of the same storage works on.
    let (writer, snapshot) = returned_snapshot(&storage, b"after the traps");
    assert_eq!(snapshot.remote.entries.len(), 1);
    drop(writer);
}

/// Storages opened with `dstl.writer.engine=process` and equal engine settings share one
/// engine, so its instance pool bounds their writers together: a process running many
/// jobs reserves one pool, not one per job.
#[test]
fn storages_of_one_process_can_share_an_engine_and_its_pool() {
    let tmp = tempfile::tempdir().unwrap();
    // A pool size no other test uses, so no other test's storage shares this engine.
    let conf = ["dstl.writer.engine=process", "dstl.writer.max-writers=3"];
    let a = dstl_tests::harness::open(&tmp.path().join("a"), &conf);
    let b = dstl_tests::harness::open(&tmp.path().join("b"), &conf);
    let _w1 = a.create_writer("a-1", RANGE).unwrap();
    let _w2 = b.create_writer("b-1", RANGE).unwrap();
    let w3 = a.create_writer("a-2", RANGE).unwrap();
    let Err(error) = b.create_writer("b-2", RANGE) else {
        panic!("the shared pool holds three writers, yet a fourth was created");
    };
    assert!(error.to_string().contains("b-2"), "{error}");
    // A writer's slot goes back to the shared pool when it is dropped.
    drop(w3);
    let _w4 = b.create_writer("b-3", RANGE).unwrap();
    // Storages with their own engines are not bounded by it.
    let c = dstl_tests::harness::open(&tmp.path().join("c"), &["dstl.writer.max-writers=3"]);
    let _w5 = c.create_writer("c-1", RANGE).unwrap();
}

#[test]
fn a_component_that_is_not_a_writer_is_refused() {
    let (_tmp, storage, _) = open_temp(&[]);
    let error = storage.compile_component(b"\0asm not really").unwrap_err();
    assert!(matches!(error, Error::Setup { .. }), "{error}");
}

/// Files of returned snapshots outlive a dropped writer; uploads nobody was told about
/// do not.
#[test]
fn a_dropped_writer_releases_only_what_no_returned_snapshot_names() {
    let (_tmp, storage, _) = open_temp(&["dstl.dfs.preemptive-persist-threshold=1kb"]);
    let (healthy, snapshot) = returned_snapshot(&storage, b"returned");
    healthy.append(3, &[9; 2048]).unwrap(); // a pre-emptive upload, in no snapshot
    storage.wait_idle();
    let job_dir = storage.config().job_dir();
    assert_eq!(files(&job_dir).len(), 2);
    drop(healthy);
    storage.wait_idle();
    assert_eq!(
        files(&job_dir),
        vec![PathBuf::from(&remote_paths(&snapshot)[0])]
    );
    assert_eq!(storage.read(&snapshot.remote).unwrap().len(), 1);
}

/// The host counts what a block holds, not what the guest says it holds: a task that
/// lies about its sizes, is no change-set block, has no change sets, lends the same bytes
/// as more pieces or blocks than its memory holds or numbers them out of order is a guest
/// fault of that writer; nothing of it is uploaded, and other writers carry on.
#[test]
fn upload_tasks_that_lie_about_their_contents_trap_their_writer() {
    let (_tmp, storage, component) = open_temp(&[
        "dstl.dfs.batch.persist-delay=0",
        "dstl.dfs.batch.persist-size-threshold=0",
        "dstl.dfs.upload.max-in-flight=1kb",
    ]);
    for (misbehaviour, mentions) in [
        (
            "schedule-lying 4000000",
            "claims 0 payload bytes, its block holds 4000000",
        ),
        ("schedule-garbage 64", "is not one change-set block"),
        ("schedule-empty", "has no change sets"),
        (
            "schedule-aliased 1048576 100000",
            "add up to more than the writer's memory",
        ),
        (
            "schedule-aliased-blocks 1048576 100000",
            "add up to more than the writer's memory",
        ),
        (
            "schedule-descending",
            "sequence number 3 does not ascend after 5",
        ),
    ] {
        let h = hostile(&storage, &component, WriterOptions::default());
        expect_trap(command(&h, misbehaviour), TrapKind::GuestFault, mentions);
    }
    storage.wait_idle();
    assert!(files(&storage.config().job_dir()).is_empty());
    // The in-flight limit was never charged, so a healthy writer is not held back.
    let (_healthy, snapshot) = returned_snapshot(&storage, &[7; 512]);
    assert_eq!(storage.read(&snapshot.remote).unwrap().len(), 1);
}

/// A snapshot the guest returns must name only change sets the host delivered to that
/// writer: one naming another writer's file is a guest fault, and the file stays.
#[test]
fn a_snapshot_naming_another_writers_file_traps_the_forger() {
    let (_tmp, storage, component) = open_temp(&[]);
    let (healthy, snapshot) = returned_snapshot(&storage, b"someone else's");
    let path = remote_paths(&snapshot)[0].clone();
    let h = hostile(&storage, &component, WriterOptions::default());
    command(&h, &format!("forge {path}")).unwrap();
    let cause = expect_trap(h.persist(0, 1).map(|_| ()), TrapKind::GuestFault, &path);
    assert!(cause.contains("snapshot"), "{cause}");
    storage.wait_idle();
    assert_eq!(storage.task_registry().count(&path), Some(1));
    assert_eq!(storage.read(&snapshot.remote).unwrap().len(), 1);
    healthy.confirm(0, 1, 1).unwrap();
}

#[test]
fn answers_larger_than_wasmtimes_default_hostcall_budget_reach_the_caller() {
    // Pending persists of one range complete together, in one delivery whose answer
    // lists every change set once per persist: here 400 persists of 3,000 change sets,
    // 1.2 million handle entries, more than the 128 MiB wasmtime lets a call lift by
    // default. A legitimate answer is bounded by the guest's memory, not by that.
    let (_tmp, storage) = dstl_tests::harness::open_temp(&[
        "dstl.dfs.batch.persist-delay=3s",
        "dstl.writer.memory-limit=1gb",
    ]);
    let w = storage.create_writer("big-answers", RANGE).unwrap();
    const SETS: u64 = 3_000;
    const PERSISTS: i64 = 400;
    for i in 0..SETS {
        w.append(1, &i.to_le_bytes()).unwrap();
        assert_eq!(w.next_sequence_number().unwrap(), i + 1);
    }
    let pending: Vec<_> = (1..=PERSISTS)
        .map(|checkpoint| w.persist(0, checkpoint).unwrap())
        .collect();
    for future in pending {
        let snapshot = future.wait().unwrap();
        assert_eq!(snapshot.remote.entries.len() as u64, SETS);
    }
    w.close().unwrap();
}

/// A panic of the host's own code during a writer's call (a defect of dstl: once, an
/// upload timeout that overflowed an instant) stops at that writer: its call and its
/// later calls fail with a typed [`TrapKind::HostPanic`], its pending persists fail, and
/// every other writer, the scheduler whose lock the panic held, closing and dropping go
/// on as before. It used to poison the writer's and the scheduler's locks: every later
/// upload of every writer failed with a `PoisonError`, and dropping the writer panicked
/// again during unwinding, which aborts the process (a TaskManager's JVM).
#[test]
fn a_host_panic_in_a_call_fails_that_writer_alone_with_a_typed_error() {
    // Batches leave at 1 KiB or after a day: the first persist is still waiting when its
    // writer fails.
    let (_tmp, storage) = dstl_tests::harness::open_temp(&[
        "dstl.dfs.batch.persist-delay=1d",
        "dstl.dfs.batch.persist-size-threshold=1kb",
    ]);
    let broken = storage.create_writer("broken", RANGE).unwrap();
    let other = storage.create_writer("other", RANGE).unwrap();
    broken.append(1, b"one").unwrap();
    let pending = broken.persist(0, 1).unwrap();
    broken.append(2, b"two").unwrap();
    broken.next_sequence_number().unwrap();
    storage.panic_in_next_schedule();
    let failed = broken.persist(0, 2);
    let host_panic = |result: Result<_, Error>, what: &str| match result {
        Err(Error::Trapped {
            kind: TrapKind::HostPanic,
            cause,
            ..
        }) => assert!(cause.contains("internal error of dstl"), "{what}: {cause}"),
        other => panic!("{what}: expected a host panic, got {other:?}"),
    };
    host_panic(failed.map(|_| ()), "the call that panicked");
    host_panic(broken.append(3, b"three"), "a later call");
    // The persist pending before fails with the writer.
    host_panic(pending.wait().map(|_| ()), "the persist pending before");
    // The others carry on through the same scheduler (a change set of 1 KiB leaves at
    // once).
    other.append(1, &[7; 1024]).unwrap();
    let snapshot = other.persist(0, 1).unwrap().wait().unwrap();
    assert_eq!(
        dstl_tests::harness::payloads(&storage, &snapshot.remote),
        vec![vec![7; 1024]]
    );
    let late = storage.create_writer("late", RANGE).unwrap();
    late.append(1, &[8; 1024]).unwrap();
    late.persist(0, 1).unwrap().wait().unwrap();
    // Closing the broken writer is a typed error, dropping it nothing at all.
    assert!(broken.close().is_err());
    drop(broken);
    storage.close();
    drop(other);
}
