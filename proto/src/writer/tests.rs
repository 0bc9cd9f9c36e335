//! Native unit tests of the writer state machine: the upstream `FsStateChangelogWriterTest`
//! and `FsStateChangelogWriterSqnTest` scenarios that need its effects in view (what it
//! schedules, releases and registers, and in which order), the preconditions as typed
//! values (ARCHITECTURE.md, "Writer semantics"), and the deliberate fixes ("Where dstl
//! differs from Flink", F1–F15). Upstream cases a host's view covers whole (`testAppend`,
//! `testPreUpload`, `testPersist`, `testPersistAgain`) are shared scenarios only
//! (`tests/scenarios/*.json`), which both hosts run through this machine.
//!
//! Effects go to [`Fake`], which records everything and models Flink's two registries: the
//! task registry (ref count per file, started at the number of change sets in the file) and
//! the local registry (last-used checkpoint per local file, `discard_up_to(n)` drops `< n`).

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::codec::{Change, decode_change_set};

const KG: i32 = 0;
const NAME: &str = "op";
const RANGE: KeyGroupRange = KeyGroupRange { start: 0, end: 9 };

fn config(threshold: u64, local_recovery: bool) -> WriterConfig {
    WriterConfig {
        name: NAME.to_string(),
        key_group_range: RANGE,
        preemptive_persist_threshold: threshold,
        local_recovery,
        value_pieces: true,
    }
}

fn writer(threshold: u64) -> Writer {
    Writer::new(config(threshold, false)).expect("valid config")
}

/// A writer and a fresh [`Fake`], as most tests start.
fn open(threshold: u64) -> (Writer, Fake) {
    (writer(threshold), Fake::default())
}

/// A writer with local recovery and a [`Fake`] whose uploads make local copies.
fn open_local(threshold: u64) -> (Writer, Fake) {
    let w = Writer::new(config(threshold, true)).expect("valid config");
    (w, Fake::with_local_copies())
}

/// Deterministic "random" payload.
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Flink's test helper: returns the sequence number the appended change gets.
fn append(w: &mut Writer, fx: &mut Fake, value: &[u8]) -> SequenceNumber {
    let sqn = w.next_sequence_number();
    w.append(fx, KG, value).expect("append");
    sqn
}

/// Appends `value` as a change set of its own (the next append opens another); returns its
/// sequence number.
fn append_closed(w: &mut Writer, fx: &mut Fake, value: &[u8]) -> SequenceNumber {
    let sqn = append(w, fx, value);
    assert_eq!(
        w.next_sequence_number(),
        sqn + 1,
        "the change set is closed"
    );
    sqn
}

// ---------------------------------------------------------------------------------------
// The recording fake
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Fake {
    /// Every accepted task, in schedule order.
    scheduled: Vec<UploadTask>,
    /// Tasks whose outcome was delivered.
    finished: BTreeSet<u64>,
    /// When set, `schedule` refuses with this cause.
    refuse: Option<Refusal>,
    /// When set, uploads also produce a local copy.
    local_copies: bool,
    releases: Vec<StreamHandle>,
    stop_trackings: Vec<StreamHandle>,
    local_registrations: Vec<(String, CheckpointId)>,
    local_discards: Vec<(CheckpointId, Vec<String>)>,
    logs: Vec<(Level, String)>,
    /// Task registry: path -> ref count.
    ref_counts: BTreeMap<String, u64>,
    /// Releases of files the task registry no longer tracked (Flink logs and ignores them).
    untracked_releases: Vec<String>,
    /// Local registry: path -> (handle, last-used checkpoint).
    local_registry: BTreeMap<String, (StreamHandle, CheckpointId)>,
    /// Files deleted by either registry.
    deleted: BTreeSet<String>,
    /// Logical bytes of every written file.
    files: BTreeMap<String, Vec<u8>>,
    next_file: u64,
}

impl Effects for Fake {
    fn schedule(&mut self, task: UploadTask<Block>) -> Result<(), Refusal> {
        if let Some(refusal) = self.refuse {
            return Err(refusal);
        }
        assert!(
            !task.change_sets.is_empty(),
            "the writer scheduled an empty task {}",
            task.id
        );
        assert!(
            task.change_sets
                .windows(2)
                .all(|w| w[0].sequence_number < w[1].sequence_number),
            "change sets of a task must be in ascending sequence-number order"
        );
        assert!(
            self.scheduled.iter().all(|t| t.id != task.id),
            "task id {} scheduled twice",
            task.id
        );
        // What a host does: each block's pieces into one buffer.
        self.scheduled.push(UploadTask {
            id: task.id,
            change_sets: task
                .change_sets
                .into_iter()
                .map(|c| {
                    let pieces: usize = c.block.pieces().iter().map(|p| p.len()).sum();
                    assert_eq!(pieces, c.block.len(), "the pieces make the block");
                    ChangeSetBlock {
                        sequence_number: c.sequence_number,
                        size: c.size,
                        block: c.block.to_vec(),
                    }
                })
                .collect(),
            preemptive: task.preemptive,
        });
        Ok(())
    }

    fn release(&mut self, handle: &StreamHandle) {
        self.releases.push(handle.clone());
        match self.ref_counts.get_mut(&handle.path) {
            None => self.untracked_releases.push(handle.path.clone()),
            Some(count) => {
                *count -= 1;
                if *count == 0 {
                    self.ref_counts.remove(&handle.path);
                    self.deleted.insert(handle.path.clone());
                }
            }
        }
    }

    fn stop_tracking(&mut self, handle: &StreamHandle) {
        self.stop_trackings.push(handle.clone());
        self.ref_counts.remove(&handle.path);
    }

    fn local_register(&mut self, handle: &StreamHandle, checkpoint: CheckpointId) {
        assert_ne!(
            checkpoint, PREEMPTIVE_CHECKPOINT,
            "local files must never be registered under the pre-emptive checkpoint id"
        );
        self.local_registrations
            .push((handle.path.clone(), checkpoint));
        let entry = self
            .local_registry
            .entry(handle.path.clone())
            .or_insert_with(|| (handle.clone(), checkpoint));
        assert_eq!(
            entry.0, *handle,
            "re-registered a local path with a different handle"
        );
        entry.1 = entry.1.max(checkpoint);
    }

    fn local_discard_up_to(&mut self, checkpoint: CheckpointId) -> Vec<String> {
        let paths: Vec<String> = self
            .local_registry
            .iter()
            .filter(|(_, (_, last_used))| *last_used < checkpoint)
            .map(|(path, _)| path.clone())
            .collect();
        for path in &paths {
            self.local_registry.remove(path);
            self.deleted.insert(path.clone());
        }
        self.local_discards.push((checkpoint, paths.clone()));
        paths
    }

    fn log(&mut self, level: Level, message: &str) {
        self.logs.push((level, message.to_string()));
    }
}

impl Fake {
    fn with_local_copies() -> Self {
        Self {
            local_copies: true,
            ..Self::default()
        }
    }

    fn task(&self, id: u64) -> &UploadTask {
        self.scheduled
            .iter()
            .find(|t| t.id == id)
            .unwrap_or_else(|| panic!("no scheduled task {id}"))
    }

    /// Ids of scheduled tasks without an outcome yet, in schedule order.
    fn pending(&self) -> Vec<u64> {
        self.scheduled
            .iter()
            .map(|t| t.id)
            .filter(|id| !self.finished.contains(id))
            .collect()
    }

    fn last_task(&self) -> &UploadTask {
        self.scheduled.last().expect("a scheduled task")
    }

    /// Sequence numbers of every scheduled task, per task.
    fn scheduled_sqns(&self) -> Vec<Vec<SequenceNumber>> {
        self.scheduled
            .iter()
            .map(|t| t.change_sets.iter().map(|c| c.sequence_number).collect())
            .collect()
    }

    fn is_deleted(&self, path: &str) -> bool {
        self.deleted.contains(path)
    }

    fn warnings(&self) -> Vec<&str> {
        self.logs
            .iter()
            .filter(|(l, _)| *l == Level::Warn)
            .map(|(_, m)| m.as_str())
            .collect()
    }

    /// "Uploads" the given tasks into one remote file (plus one local copy when asked):
    /// offsets are the running sum of block lengths, the task registry starts tracking the
    /// file(s) with the number of change sets in it, and one result list per task is built.
    fn write_file(&mut self, ids: &[u64]) -> Vec<(u64, Vec<UploadResult>)> {
        assert!(!ids.is_empty());
        let n = self.next_file;
        self.next_file += 1;
        let mut logical = Vec::new();
        let mut per_task = Vec::new();
        let mut change_sets = 0u64;
        for &id in ids {
            let task = self.task(id).clone();
            assert!(self.finished.insert(id), "task {id} already has an outcome");
            let mut entries = Vec::new();
            for cs in &task.change_sets {
                entries.push((cs.sequence_number, logical.len() as u64, cs.size));
                logical.extend_from_slice(&cs.block);
                change_sets += 1;
            }
            per_task.push((id, entries));
        }
        let remote = StreamHandle {
            path: format!("remote/{n}"),
            file_size: logical.len() as u64,
        };
        let local = self.local_copies.then(|| StreamHandle {
            path: format!("local/{n}"),
            file_size: logical.len() as u64,
        });
        self.ref_counts.insert(remote.path.clone(), change_sets);
        if let Some(local) = &local {
            self.ref_counts.insert(local.path.clone(), change_sets);
            self.files.insert(local.path.clone(), logical.clone());
        }
        self.files.insert(remote.path.clone(), logical);
        per_task
            .into_iter()
            .map(|(id, entries)| {
                let results = entries
                    .into_iter()
                    .map(|(sequence_number, offset, size)| UploadResult {
                        sequence_number,
                        remote: remote.clone(),
                        offset,
                        local: local.clone().map(|handle| LocalCopy { handle, offset }),
                        size,
                    })
                    .collect();
                (id, results)
            })
            .collect()
    }

    /// Decodes every entry of a handle from the written files.
    fn decode(&self, handle: &ChangelogHandle) -> Vec<Vec<Change>> {
        handle
            .entries
            .iter()
            .map(|e| {
                let file = self
                    .files
                    .get(&e.handle.path)
                    .unwrap_or_else(|| panic!("no file {}", e.handle.path));
                decode_change_set(file, e.offset).expect("decodable block")
            })
            .collect()
    }
}

/// Uploads one task into its own file and delivers the outcome.
fn upload(w: &mut Writer, fx: &mut Fake, id: u64) -> Vec<PersistCompletion> {
    upload_batch(w, fx, &[id])
}

/// Uploads several tasks into one shared file (Flink's batching `scheduleAll`) and delivers
/// each task's outcome in order.
fn upload_batch(w: &mut Writer, fx: &mut Fake, ids: &[u64]) -> Vec<PersistCompletion> {
    let mut completions = Vec::new();
    for (id, results) in fx.write_file(ids) {
        completions.extend(w.on_upload_succeeded(fx, id, results));
    }
    completions
}

/// Uploads every pending task, one file per task.
fn upload_all(w: &mut Writer, fx: &mut Fake) -> Vec<PersistCompletion> {
    let mut completions = Vec::new();
    for id in fx.pending() {
        completions.extend(upload(w, fx, id));
    }
    completions
}

/// Persists `[from, next)` as `checkpoint`, which must wait for an upload, uploads every
/// pending task and returns the snapshot the persist completes with.
fn persist_uploaded(
    w: &mut Writer,
    fx: &mut Fake,
    from: SequenceNumber,
    checkpoint: CheckpointId,
) -> SnapshotResult {
    let ticket = pending(w.persist(fx, from, checkpoint));
    completed(&upload_all(w, fx), ticket)
}

/// How Flink's local-recovery writer tests start: a local writer (threshold 100) whose
/// checkpoint 1, over one small change set (sqn 0), is uploaded and confirmed. Returns
/// the writer, its fake and the end of checkpoint 1's range.
fn local_after_checkpoint_1() -> (Writer, Fake, SequenceNumber) {
    let (mut w, mut fx) = open_local(100);
    let initial = w.initial_sequence_number();
    w.append(&mut fx, KG, &bytes(10, 0)).unwrap();
    let (cp1_sqn, _) = run_checkpoint(&mut w, &mut fx, initial, 1);
    (w, fx, cp1_sqn)
}

/// A checkpoint as Flink's writer tests take one: [`persist_uploaded`], then confirm the
/// range. Returns the range's end (exclusive) and the snapshot.
fn run_checkpoint(
    w: &mut Writer,
    fx: &mut Fake,
    from: SequenceNumber,
    checkpoint: CheckpointId,
) -> (SequenceNumber, SnapshotResult) {
    let to = w.next_sequence_number();
    let snapshot = persist_uploaded(w, fx, from, checkpoint);
    w.confirm(fx, from, to, checkpoint).expect("confirm");
    (to, snapshot)
}

fn fail(w: &mut Writer, fx: &mut Fake, id: u64) -> Vec<PersistCompletion> {
    assert!(fx.finished.insert(id), "task {id} already has an outcome");
    w.on_upload_failed(fx, id)
}

/// The error of a persist whose upload task `task` failed.
fn upload_failed(task: u64) -> WriterError {
    WriterError::UploadFailed(UploadFailure::Failed(FailedTask { task }))
}

fn batch_lengths(total: u64, data: u64) -> WriterError {
    WriterError::InvalidArgument(InvalidArgument::BatchLengths(BatchLengths { total, data }))
}

fn closed_while_persisting(start: u64, end: u64, checkpoint: i64) -> WriterError {
    WriterError::Closed(Closed::WhilePersisting(PendingPersist {
        start,
        end,
        checkpoint,
    }))
}

fn ready(reply: Result<PersistReply, WriterError>) -> SnapshotResult {
    match reply {
        Ok(PersistReply::Ready(snapshot)) => snapshot,
        other => panic!("expected a ready snapshot, got {other:?}"),
    }
}

fn pending(reply: Result<PersistReply, WriterError>) -> u64 {
    match reply {
        Ok(PersistReply::Pending(ticket)) => ticket,
        other => panic!("expected a pending persist, got {other:?}"),
    }
}

/// The outcome of `ticket`, which must occur exactly once.
fn outcome(completions: &[PersistCompletion], ticket: u64) -> Result<SnapshotResult, WriterError> {
    let found: Vec<_> = completions.iter().filter(|c| c.ticket == ticket).collect();
    assert_eq!(
        found.len(),
        1,
        "ticket {ticket} must complete exactly once in {completions:?}"
    );
    found[0].outcome.clone()
}

fn completed(completions: &[PersistCompletion], ticket: u64) -> SnapshotResult {
    outcome(completions, ticket).unwrap_or_else(|e| panic!("ticket {ticket} failed: {e}"))
}

fn paths(handle: &ChangelogHandle) -> Vec<String> {
    handle
        .entries
        .iter()
        .map(|e| e.handle.path.clone())
        .collect()
}

/// The single change of a single-change-set task.
fn only_change(task: &UploadTask) -> Change {
    assert_eq!(
        task.change_sets.len(),
        1,
        "expected one change set: {task:?}"
    );
    let changes = decode_change_set(&task.change_sets[0].block, 0).expect("decodable block");
    assert_eq!(changes.len(), 1, "expected one change: {changes:?}");
    changes.into_iter().next().unwrap()
}

fn change(key_group: i32, value: &[u8]) -> Change {
    Change {
        key_group,
        value: value.to_vec(),
    }
}

// ---------------------------------------------------------------------------------------
// Flink's FsStateChangelogWriterTest
// ---------------------------------------------------------------------------------------

#[test]
fn preemptive_threshold_is_inclusive() {
    // Spec probe: threshold 10 -> 9 bytes no flush; one more byte -> flush, active 0 -> 1.
    let (mut w, mut fx) = open(10);
    w.append(&mut fx, KG, &bytes(9, 1)).unwrap();
    assert!(fx.scheduled.is_empty());
    assert_eq!(w.active_sequence_number(), 0);
    w.append(&mut fx, KG, &bytes(1, 2)).unwrap();
    assert_eq!(fx.scheduled_sqns(), vec![vec![0]]);
    assert_eq!(fx.scheduled[0].change_sets[0].size, 10);
    assert_eq!(w.active_sequence_number(), 1);
    // Metadata counts towards the threshold too.
    w.append_meta(&mut fx, &bytes(10, 3)).unwrap();
    assert_eq!(fx.scheduled_sqns(), vec![vec![0], vec![1]]);
    assert_eq!(
        only_change(&fx.scheduled[1]),
        change(META_KEY_GROUP, &bytes(10, 3))
    );
}

fn paths_of(handles: &[StreamHandle]) -> Vec<String> {
    handles.iter().map(|h| h.path.clone()).collect()
}

#[test]
fn test_file_available_after_pre_upload() {
    let (mut w, mut fx) = open(100);
    let initial = w.initial_sequence_number();

    w.append(&mut fx, KG, &bytes(10, 0)).unwrap(); // sqn 0
    let (cp1_sqn, _) = run_checkpoint(&mut w, &mut fx, initial, 1);

    w.append(&mut fx, KG, &bytes(10, 1)).unwrap(); // sqn 1
    let materialization_sqn = w.next_sequence_number();
    w.append(&mut fx, KG, &bytes(10, 2)).unwrap(); // sqn 2
    let (cp2_sqn, _) = run_checkpoint(&mut w, &mut fx, materialization_sqn, 2);

    // checkpoint 1 subsumed
    w.truncate(&mut fx, materialization_sqn.min(cp1_sqn))
        .unwrap();

    w.append(&mut fx, KG, &bytes(10, 3)).unwrap(); // sqn 3
    run_checkpoint(&mut w, &mut fx, materialization_sqn, 3);

    // pre-emptive upload
    w.append(&mut fx, KG, &bytes(100, 4)).unwrap(); // sqn 4
    upload_all(&mut w, &mut fx);

    // checkpoint 2 subsumed
    w.truncate(&mut fx, materialization_sqn.min(cp2_sqn))
        .unwrap();

    // Everything checkpoint 4 covers is uploaded already: it is ready at once.
    let cp4_sqn = w.next_sequence_number();
    let cp4 = ready(w.persist(&mut fx, materialization_sqn, 4));
    assert!(upload_all(&mut w, &mut fx).is_empty());
    w.confirm(&mut fx, materialization_sqn, cp4_sqn, 4).unwrap();

    assert!(!cp4.remote.entries.is_empty());
    for path in paths(&cp4.remote) {
        assert!(
            !fx.is_deleted(&path),
            "file {path} referenced by checkpoint 4 was discarded"
        );
    }
    // The pre-emptive upload carried the still-unuploaded sqn 1 together with sqn 4; its
    // file survived the release of sqn 1 by the second truncation.
    assert!(fx.scheduled_sqns().contains(&vec![1, 4]));
}

#[test]
fn test_file_available_after_close() {
    let (mut w, mut fx) = open(100);
    let initial = w.initial_sequence_number();
    w.append(&mut fx, KG, &bytes(10, 0)).unwrap(); // sqn 0
    let cp1_sqn = w.next_sequence_number();
    let ticket = pending(w.persist(&mut fx, initial, 1));
    w.append(&mut fx, KG, &bytes(100, 1)).unwrap(); // sqn 1, pre-emptive
    assert_eq!(fx.scheduled_sqns(), vec![vec![0], vec![1]]);

    // Both tasks land in one file (ref count 2).
    let ids = fx.pending();
    let completions = upload_batch(&mut w, &mut fx, &ids);
    let cp1 = completed(&completions, ticket);
    let file = paths(&cp1.remote)[0].clone();
    assert_eq!(fx.ref_counts[&file], 2);

    let closing = w.truncate_and_close(&mut fx, cp1_sqn).unwrap();
    assert!(closing.is_empty(), "no persist was pending");
    assert!(w.is_closed());
    for path in paths(&cp1.remote) {
        assert!(
            !fx.is_deleted(&path),
            "file {path} of checkpoint 1 was discarded"
        );
    }
    assert_eq!(
        fx.ref_counts[&file], 1,
        "only sqn 1's reference was released"
    );
}

#[test]
fn test_local_file_discard() {
    let (mut w, mut fx, _) = local_after_checkpoint_1();
    let initial = w.initial_sequence_number();

    // pre-emptive upload
    w.append(&mut fx, KG, &bytes(100, 1)).unwrap();
    upload_all(&mut w, &mut fx);
    w.append(&mut fx, KG, &bytes(10, 2)).unwrap();
    let (_, result2) = run_checkpoint(&mut w, &mut fx, initial, 2);
    let local2 = result2
        .local
        .clone()
        .expect("checkpoint 2 has a local handle");
    assert_eq!(local2.entries.len(), 3);
    for path in paths(&local2) {
        assert!(
            !fx.is_deleted(&path),
            "local file {path} of checkpoint 2 deleted early"
        );
    }

    let materialization_sqn = w.next_sequence_number();
    w.append(&mut fx, KG, &bytes(10, 3)).unwrap();
    run_checkpoint(&mut w, &mut fx, materialization_sqn, 3);
    for path in paths(&local2) {
        assert!(
            fx.is_deleted(&path),
            "local file {path} of checkpoint 2 survived"
        );
    }

    // Our fix: the dropped local copies are no longer offered; a later full persist has no
    // local handle (only one of four change sets still has a local copy) and registers
    // nothing deleted.
    let registrations_before = fx.local_registrations.len();
    let later = ready(w.persist(&mut fx, initial, 4));
    assert_eq!(later.remote.entries.len(), 4);
    assert_eq!(later.local, None);
    for (path, _) in &fx.local_registrations[registrations_before..] {
        assert!(!fx.is_deleted(path), "registered deleted local file {path}");
    }
}

#[test]
fn test_local_file_after_materialize() {
    let (mut w, mut fx, cp1_sqn) = local_after_checkpoint_1();
    let initial = w.initial_sequence_number();

    w.append(&mut fx, KG, &bytes(10, 1)).unwrap();
    run_checkpoint(&mut w, &mut fx, initial, 2);

    w.append(&mut fx, KG, &bytes(10, 2)).unwrap();
    let cp3_sqn = w.next_sequence_number();
    let result3 = persist_uploaded(&mut w, &mut fx, initial, 3);

    let materialization_sqn = w.next_sequence_number();
    w.truncate(&mut fx, materialization_sqn.min(cp1_sqn))
        .unwrap();
    w.confirm(&mut fx, materialization_sqn, cp3_sqn, 3).unwrap();
    w.append(&mut fx, KG, &bytes(10, 3)).unwrap();

    assert_eq!(result3.remote.entries.len(), 3);
    for path in paths(&result3.remote) {
        assert!(
            !fx.is_deleted(&path),
            "remote file {path} of checkpoint 3 deleted"
        );
    }
    let local3 = result3.local.expect("checkpoint 3 has a local handle");
    assert_eq!(local3.entries.len(), 3);
    for path in paths(&local3) {
        assert!(
            !fx.is_deleted(&path),
            "local file {path} of checkpoint 3 deleted"
        );
        assert_eq!(
            fx.local_registry.get(&path).map(|(_, cp)| *cp),
            Some(3),
            "local file {path} must be registered under checkpoint 3 at persist time"
        );
    }
}

#[test]
fn test_local_file_abort() {
    let (mut w, mut fx, _) = local_after_checkpoint_1();
    let initial = w.initial_sequence_number();

    w.append(&mut fx, KG, &bytes(200, 1)).unwrap(); // pre-emptive
    upload_all(&mut w, &mut fx);
    w.append(&mut fx, KG, &bytes(10, 2)).unwrap();
    let cp2_sqn = w.next_sequence_number();
    let result2 = persist_uploaded(&mut w, &mut fx, initial, 2);

    // checkpoint 2 aborted: all its local files are deleted
    w.reset(&mut fx, initial, cp2_sqn, 2).unwrap();
    let local2 = result2.local.expect("checkpoint 2 has a local handle");
    assert_eq!(local2.entries.len(), 3);
    for path in paths(&local2) {
        assert!(fx.is_deleted(&path), "local file {path} survived the abort");
    }

    w.append(&mut fx, KG, &bytes(10, 3)).unwrap();
    let registrations_before = fx.local_registrations.len();
    let (_, result3) = run_checkpoint(&mut w, &mut fx, initial, 3);

    // Our fix (F5): later snapshots never reference a discarded local copy. Three of
    // the four change sets lost theirs, so checkpoint 3 is remote-only (with a warning).
    assert_eq!(result3.remote.entries.len(), 4);
    if let Some(local3) = &result3.local {
        for path in paths(local3) {
            assert!(
                !fx.is_deleted(&path),
                "checkpoint 3 references deleted {path}"
            );
        }
    }
    assert_eq!(result3.local, None);
    assert!(
        fx.warnings()
            .iter()
            .any(|m| m.contains("only 1 of 4 change sets have a local copy"))
    );
    for (path, _) in &fx.local_registrations[registrations_before..] {
        assert!(
            !local2.entries.iter().any(|e| &e.handle.path == path),
            "a discarded local file {path} was registered again"
        );
    }
    // The newly uploaded change set's local copy survives the confirm.
    let newest = fx.scheduled.last().unwrap().id;
    assert_eq!(newest, 3);
    assert!(!fx.is_deleted("local/3"));
}

#[test]
fn test_no_re_upload_before_completion() {
    let (mut w, mut fx) = open(1000);
    let sqn = append(&mut w, &mut fx, &bytes(10, 0));
    let t1 = pending(w.persist(&mut fx, sqn, 1));
    let t2 = pending(w.persist(&mut fx, sqn, 2));
    assert_ne!(t1, t2);
    assert_eq!(fx.scheduled.len(), 1, "no re-upload should happen");
    let completions = upload_all(&mut w, &mut fx);
    assert_eq!(completions.len(), 2);
    assert_eq!(
        completed(&completions, t1).remote.entries,
        completed(&completions, t2).remote.entries
    );
}

#[test]
fn test_persist_newly_appended() {
    let (mut w, mut fx) = open(1000);
    let sqn = append(&mut w, &mut fx, &bytes(10, 0));
    w.persist(&mut fx, sqn, 1).unwrap();
    let payload = bytes(10, 1);
    let sqn2 = append(&mut w, &mut fx, &payload);
    assert_eq!(sqn2, 1);
    w.persist(&mut fx, sqn2, 2).unwrap();
    assert_eq!(fx.scheduled.len(), 2);
    assert_eq!(only_change(&fx.scheduled[1]), change(KG, &payload));
    assert_eq!(fx.scheduled[1].change_sets[0].sequence_number, 1);
}

#[test]
fn test_persist_after_reset() {
    let (mut w, mut fx) = open(1000);
    let payload = bytes(10, 5);
    let sqn = append(&mut w, &mut fx, &payload);
    w.reset(&mut fx, sqn, u64::MAX, i64::MAX).unwrap();
    // Flink's `checkpoint + 1` wraps here; the port saturates.
    assert_eq!(fx.local_discards, vec![(i64::MAX, vec![])]);
    assert!(fx.scheduled.is_empty());
    pending(w.persist(&mut fx, sqn, 1));
    assert_eq!(fx.scheduled.len(), 1);
    assert_eq!(only_change(&fx.scheduled[0]), change(KG, &payload));
}

#[test]
fn test_persist_failure() {
    let (mut w, mut fx) = open(1000);
    let sqn = append(&mut w, &mut fx, &bytes(10, 0));
    let ticket = pending(w.persist(&mut fx, sqn, 1));
    let completions = fail(&mut w, &mut fx, 0);
    assert_eq!(outcome(&completions, ticket), Err(upload_failed(0)));
    // At debug level: the uploader reported the failure already.
    assert!(fx.logs.iter().any(|(level, m)| *level == Level::Debug
        && m.contains("upload task 0 of change sets [0] failed")));
}

#[test]
fn test_persist_failed_changes() {
    let (mut w, mut fx) = open(1000);
    let sqn = append(&mut w, &mut fx, &bytes(10, 0));
    w.persist(&mut fx, sqn, 1).unwrap();
    fail(&mut w, &mut fx, 0);
    let err = w.persist(&mut fx, sqn, 2).unwrap_err();
    assert_eq!(
        err,
        WriterError::AlreadyFailed(AlreadyFailed {
            failed: 0,
            cause: UploadFailure::Failed(FailedTask { task: 0 }),
        })
    );
    assert_eq!(fx.scheduled.len(), 1, "nothing is re-uploaded");
}

#[test]
fn test_persist_non_failed_changes() {
    let (mut w, mut fx) = open(1000);
    let payload = bytes(10, 0);
    let sqn1 = append(&mut w, &mut fx, &payload);
    w.persist(&mut fx, sqn1, 1).unwrap();
    fail(&mut w, &mut fx, 0);
    let sqn2 = append(&mut w, &mut fx, &payload);
    assert_eq!(sqn2, 1);
    let ticket = pending(w.persist(&mut fx, sqn2, 2));
    assert_eq!(fx.scheduled_sqns(), vec![vec![0], vec![1]]);
    let snapshot = completed(&upload_all(&mut w, &mut fx), ticket);
    assert_eq!(
        fx.decode(&snapshot.remote),
        vec![vec![change(KG, &payload)]]
    );
}

#[test]
fn test_truncate() {
    // Upstream: append (sqn 0 still open), truncate(sqn + 1) -> rejected, because 1 is
    // beyond the active sequence number 0.
    let (mut w, mut fx) = open(1000);
    let sqn = append(&mut w, &mut fx, &bytes(10, 0));
    assert_eq!(
        w.truncate(&mut fx, sqn + 1),
        Err(WriterError::InvalidArgument(
            InvalidArgument::TruncateBeyond(TruncateBeyond { to: 1, active: 0 })
        ))
    );
    // After a rollover the truncation is accepted and persisting the truncated sqn fails.
    let next = w.next_sequence_number();
    assert_eq!(next, sqn + 1);
    w.truncate(&mut fx, next).unwrap();
    assert_eq!(
        w.persist(&mut fx, sqn, 1),
        Err(WriterError::Truncated(Truncated {
            requested: 0,
            truncated: 1,
        }))
    );
    assert!(
        fx.scheduled.is_empty(),
        "truncated changes are never uploaded"
    );
}

// ---------------------------------------------------------------------------------------
// Flink's FsStateChangelogWriterSqnTest (threshold infinite)
// ---------------------------------------------------------------------------------------

/// Flink's sequence-number cases, one row each: what the test does, and the active
/// sequence number it must leave.
#[test]
fn sequence_numbers_advance_only_at_rollover() {
    type Ops = fn(&mut Writer, &mut Fake);
    let cases: [(&str, Ops, SequenceNumber); 9] = [
        (
            "next-sequence-number without append",
            |w, _| {
                assert_eq!(w.next_sequence_number(), 0);
                assert_eq!(w.next_sequence_number(), 0);
            },
            0,
        ),
        (
            "next-sequence-number with append",
            |w, fx| {
                w.append(fx, KG, b"x").unwrap();
                assert_eq!(w.next_sequence_number(), 1);
                assert_eq!(w.next_sequence_number(), 1);
            },
            1,
        ),
        (
            "persist without append",
            |w, fx| {
                ready(w.persist(fx, w.initial_sequence_number(), 1));
            },
            0,
        ),
        (
            "persist with append",
            |w, fx| {
                w.append(fx, KG, b"x").unwrap();
                pending(w.persist(fx, w.initial_sequence_number(), 1));
            },
            1,
        ),
        ("append", |w, fx| w.append(fx, KG, b"x").unwrap(), 0),
        (
            "append after append",
            |w, fx| {
                w.append(fx, KG, b"x").unwrap();
                w.append(fx, KG, b"y").unwrap();
            },
            0,
        ),
        (
            "truncate initial without append",
            |w, fx| {
                w.truncate(fx, w.initial_sequence_number()).unwrap();
            },
            0,
        ),
        (
            "truncate initial after append",
            |w, fx| {
                w.append(fx, KG, b"x").unwrap();
                w.truncate(fx, w.initial_sequence_number()).unwrap();
            },
            0,
        ),
        (
            "truncate next after append",
            |w, fx| {
                w.append(fx, KG, b"x").unwrap();
                let next = w.next_sequence_number();
                w.truncate(fx, next).unwrap();
            },
            1,
        ),
    ];
    for (name, ops, active) in cases {
        let (mut w, mut fx) = open(u64::MAX);
        ops(&mut w, &mut fx);
        assert!(
            fx.scheduled.iter().all(|t| !t.change_sets.is_empty()),
            "{name}"
        );
        assert_eq!(w.active_sequence_number(), active, "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// Preconditions and exact messages
// ---------------------------------------------------------------------------------------

#[test]
fn persist_not_yet_appended_message() {
    let (mut w, mut fx) = open(u64::MAX);
    assert_eq!(
        w.persist(&mut fx, 1, 1),
        Err(WriterError::NotYetAppended(NotYetAppended {
            requested: 1,
            appended: 0,
        }))
    );
    w.append(&mut fx, KG, b"a").unwrap();
    // The open change set is not appended yet as far as sqns go: active is still 0.
    let err = w.persist(&mut fx, 3, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Requested changes were not yet appended (requested: 3, appended: 0)"
    );
    assert!(fx.scheduled.is_empty());
    // from == active is legal.
    pending(w.persist(&mut fx, 0, 1));
}

#[test]
fn persist_truncated_message() {
    let (mut w, mut fx) = open(u64::MAX);
    for seed in 0..3 {
        append_closed(&mut w, &mut fx, &bytes(4, seed));
    }
    w.truncate(&mut fx, 2).unwrap();
    let err = w.persist(&mut fx, 1, 1).unwrap_err();
    assert_eq!(
        err,
        WriterError::Truncated(Truncated {
            requested: 1,
            truncated: 2,
        })
    );
    // Truncation never moves the lower bound back.
    w.truncate(&mut fx, 1).unwrap();
    assert_eq!(
        w.persist(&mut fx, 1, 1).unwrap_err().to_string(),
        "Requested changes were truncated (requested: 1, truncated: 2)"
    );
    pending(w.persist(&mut fx, 2, 1));
    assert_eq!(fx.scheduled_sqns(), vec![vec![2]]);
}

#[test]
fn persist_check_order_already_failed_before_truncated() {
    let (mut w, mut fx) = open(u64::MAX);
    append_closed(&mut w, &mut fx, b"a");
    w.append(&mut fx, KG, b"b").unwrap();
    let ticket = pending(w.persist(&mut fx, 0, 1));
    assert_eq!(fx.scheduled_sqns(), vec![vec![0, 1]]);
    let completions = fail(&mut w, &mut fx, 0);
    assert_eq!(outcome(&completions, ticket), Err(upload_failed(0)));
    w.truncate(&mut fx, 1).unwrap();
    // from = 0 is both below the truncation point and at/below the highest failed sqn 1:
    // the failure check comes first.
    let expected = WriterError::AlreadyFailed(AlreadyFailed {
        failed: 1,
        cause: UploadFailure::Failed(FailedTask { task: 0 }),
    });
    assert_eq!(w.persist(&mut fx, 0, 2), Err(expected.clone()));
    assert_eq!(w.persist(&mut fx, 1, 2), Err(expected));
    // Beyond the failure (from == active) persists work again.
    let snapshot = ready(w.persist(&mut fx, 2, 2));
    assert!(snapshot.remote.entries.is_empty());
    // Truncated before not-yet-appended: the two cannot hold together (lowest <= active
    // always), so only the not-yet-appended case is left beyond active.
    assert_eq!(
        w.persist(&mut fx, 3, 2),
        Err(WriterError::NotYetAppended(NotYetAppended {
            requested: 3,
            appended: 2,
        }))
    );
}

#[test]
fn confirm_range_messages() {
    let (mut w, mut fx) = open(u64::MAX);
    append_closed(&mut w, &mut fx, b"a"); // active 1
    // A range that ends before it starts, and one beyond the active sequence number.
    for (start, end) in [(2, 1), (0, 5)] {
        assert_eq!(
            w.confirm(&mut fx, start, end, 1),
            Err(WriterError::InvalidRange(InvalidRange {
                start,
                end,
                active: 1,
            })),
            "[{start}, {end})"
        );
    }
    assert_eq!(
        w.confirm(&mut fx, 2, 2, 1).unwrap_err().to_string(),
        "Invalid confirm range: [2,2), active sqn: 1"
    );
    assert!(
        fx.local_discards.is_empty(),
        "rejected confirms have no effect"
    );
    // Empty and not-uploaded ranges are fine.
    w.confirm(&mut fx, 1, 1, 1).unwrap();
    w.confirm(&mut fx, 0, 1, 1).unwrap();
    assert!(fx.stop_trackings.is_empty());
    assert_eq!(fx.local_discards.len(), 2);
}

#[test]
fn confirm_stops_tracking_remote_then_local_and_keeps_entries() {
    let (mut w, mut fx) = open_local(u64::MAX);
    append_closed(&mut w, &mut fx, b"a");
    w.append(&mut fx, KG, b"b").unwrap();
    let first = persist_uploaded(&mut w, &mut fx, 0, 1);
    w.confirm(&mut fx, 0, 2, 1).unwrap();
    assert_eq!(
        paths_of(&fx.stop_trackings),
        vec!["remote/0", "remote/0", "local/0", "local/0"]
    );
    assert_eq!(fx.local_discards, vec![(1, vec![])]);
    assert!(
        fx.ref_counts.is_empty(),
        "both files are owned elsewhere now"
    );
    // Entries stay for later checkpoints.
    let again = ready(w.persist(&mut fx, 0, 2));
    assert_eq!(again.remote.entries, first.remote.entries);
    assert_eq!(again.local, first.local);
}

#[test]
fn truncate_beyond_active_is_rejected_without_effect() {
    let (mut w, mut fx) = open(u64::MAX);
    append_closed(&mut w, &mut fx, b"a"); // active 1
    assert_eq!(
        w.truncate(&mut fx, 2),
        Err(WriterError::InvalidArgument(
            InvalidArgument::TruncateBeyond(TruncateBeyond { to: 2, active: 1 })
        ))
    );
    pending(w.persist(&mut fx, 0, 1));
    assert_eq!(fx.scheduled_sqns(), vec![vec![0]]);
}

#[test]
fn second_close_is_rejected() {
    let (mut w, mut fx) = open(u64::MAX);
    assert_eq!(w.close(&mut fx), Ok(vec![]));
    let err = w.close(&mut fx).unwrap_err();
    assert_eq!(
        err,
        WriterError::Closed(Closed::AfterClose(Operation::Close))
    );
    assert_eq!(err.to_string(), "close after the writer was closed");
    assert_eq!(
        w.truncate_and_close(&mut fx, 0),
        Err(WriterError::Closed(Closed::AfterClose(
            Operation::TruncateAndClose
        )))
    );
    assert!(fx.releases.is_empty());
}

#[test]
fn negative_key_group_is_rejected() {
    let (mut w, mut fx) = open(1);
    for key_group in [-1, -2, i32::MIN] {
        assert_eq!(
            w.append(&mut fx, key_group, b"x"),
            Err(WriterError::InvalidArgument(
                InvalidArgument::NegativeKeyGroup(key_group)
            ))
        );
    }
    assert!(
        fx.scheduled.is_empty(),
        "nothing was appended (threshold 1)"
    );
    assert_eq!(w.next_sequence_number(), 0);
}

#[test]
fn key_group_outside_range_is_rejected() {
    let (mut w, mut fx) = open(1);
    for key_group in [10, i32::MAX] {
        assert_eq!(
            w.append(&mut fx, key_group, b"x"),
            Err(WriterError::InvalidArgument(InvalidArgument::OutsideRange(
                OutsideRange {
                    key_group,
                    range: KeyGroupRange { start: 0, end: 9 }
                }
            )))
        );
    }
    assert!(fx.scheduled.is_empty());
    // Both ends of the range are accepted.
    w.append(&mut fx, 0, b"x").unwrap();
    w.append(&mut fx, 9, b"y").unwrap();
    assert_eq!(fx.scheduled_sqns(), vec![vec![0], vec![1]]);
}

#[test]
fn invalid_key_group_range_is_rejected() {
    let bad = |start, end| {
        let mut c = config(1, false);
        c.key_group_range = KeyGroupRange { start, end };
        Writer::new(c).err()
    };
    for (start, end) in [(-1, 5), (6, 5)] {
        assert_eq!(
            bad(start, end),
            Some(WriterError::InvalidArgument(
                InvalidArgument::KeyGroupRange(KeyGroupRange { start, end })
            )),
            "[{start}, {end}]"
        );
    }
    assert_eq!(bad(5, 5), None);
    let w = writer(1);
    assert_eq!(w.config(), &config(1, false));
    assert_eq!(w.initial_sequence_number(), 0);
}

/// Batches the writer refuses whole, one row each: what is wrong with the batch, its
/// columns (key groups, lengths, data) and the error. The threshold is 1: any change taken
/// from a batch would be uploaded at once, so nothing scheduled shows nothing was taken.
#[test]
fn malformed_packed_batches_are_rejected_whole() {
    // The per-value i32 limit needs > 2 GiB of data to reach; a batch can only claim it.
    let huge = i32::MAX as u32 + 1;
    type Case<'a> = (&'a str, &'a [i32], &'a [u32], &'a [u8], WriterError);
    let cases: [Case; 7] = [
        (
            "mismatched columns",
            &[0, 1],
            &[1],
            b"ab",
            WriterError::InvalidArgument(InvalidArgument::BatchColumns(BatchColumns {
                key_groups: 2,
                lengths: 1,
            })),
        ),
        (
            "lengths beyond the data",
            &[0, 1],
            &[1, 2],
            b"ab",
            batch_lengths(3, 2),
        ),
        (
            "lengths short of the data",
            &[0],
            &[1],
            b"ab",
            batch_lengths(1, 2),
        ),
        (
            "u32 lengths whose sum overflows a u32",
            &[0, 0],
            &[u32::MAX, 1],
            b"",
            batch_lengths(u32::MAX as u64 + 1, 0),
        ),
        (
            "a length beyond i32::MAX: the totals are checked first",
            &[0],
            &[huge],
            b"",
            batch_lengths(huge.into(), 0),
        ),
        (
            "a valid change, then a key group outside the range",
            &[0, 10],
            &[1, 1],
            b"ab",
            WriterError::InvalidArgument(InvalidArgument::OutsideRange(OutsideRange {
                key_group: 10,
                range: KeyGroupRange { start: 0, end: 9 },
            })),
        ),
        (
            "a valid change, then a negative key group",
            &[3, -2],
            &[1, 1],
            b"ab",
            WriterError::InvalidArgument(InvalidArgument::NegativeBatchKeyGroup(-2)),
        ),
    ];
    for (name, key_groups, lengths, data, error) in cases {
        let (mut w, mut fx) = open(1);
        assert_eq!(
            w.append_batch(&mut fx, key_groups, lengths, data),
            Err(error),
            "{name}"
        );
        assert!(
            fx.scheduled.is_empty(),
            "{name}: nothing of a rejected batch is appended"
        );
        assert_eq!(w.next_sequence_number(), 0, "{name}");
        assert_eq!(w.active_sequence_number(), 0, "{name}");
    }
}

#[test]
fn packed_batch_appends_metadata_and_data() {
    let (mut w, mut fx) = open(u64::MAX);
    w.append_batch(&mut fx, &[], &[], b"").unwrap();
    assert_eq!(
        w.next_sequence_number(),
        0,
        "an empty batch appends nothing"
    );
    w.append_batch(&mut fx, &[2, -1, 0, 2, 0], &[1, 2, 0, 3, 1], b"abbcccd")
        .unwrap();
    pending(w.persist(&mut fx, 0, 1));
    let changes = decode_change_set(&fx.scheduled[0].change_sets[0].block, 0).unwrap();
    assert_eq!(
        changes,
        vec![
            change(META_KEY_GROUP, b"bb"),
            change(0, b""),
            change(0, b"d"),
            change(2, b"a"),
            change(2, b"ccc"),
        ]
    );
    assert_eq!(fx.scheduled[0].change_sets[0].size, 7);
}

#[test]
fn packed_batch_preemptive_persists_like_individual_appends() {
    let key_groups = [0, -1, 1, 2, 0, 3, -1, 4, 5];
    let lengths = [4u32, 3, 5, 0, 2, 6, 1, 4, 4];
    let data: Vec<u8> = bytes(lengths.iter().sum::<u32>() as usize, 9);

    let mut single = writer(10);
    let mut fx_single = Fake::default();
    let mut start = 0;
    for (&key_group, &len) in key_groups.iter().zip(&lengths) {
        let value = &data[start..start + len as usize];
        start += len as usize;
        if key_group == META_KEY_GROUP {
            single.append_meta(&mut fx_single, value).unwrap();
        } else {
            single.append(&mut fx_single, key_group, value).unwrap();
        }
    }

    let mut batched = writer(10);
    let mut fx_batched = Fake::default();
    batched
        .append_batch(&mut fx_batched, &key_groups, &lengths, &data)
        .unwrap();

    assert!(
        fx_single.scheduled.len() >= 2,
        "the scenario must cross the threshold several times"
    );
    assert_eq!(fx_batched.scheduled, fx_single.scheduled);
    assert_eq!(
        batched.active_sequence_number(),
        single.active_sequence_number()
    );
    assert_eq!(
        batched.next_sequence_number(),
        single.next_sequence_number()
    );
    // The open remainder is identical too.
    let a = batched.persist(&mut fx_batched, 0, 1);
    let b = single.persist(&mut fx_single, 0, 1);
    assert_eq!(a, b);
    assert_eq!(fx_batched.scheduled, fx_single.scheduled);
}

/// `changes` framed as a host frames a batch: one group per key group, in the order given.
fn framed(groups: &[(i32, &[&[u8]])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key_group, values) in groups {
        out.extend_from_slice(&(values.len() as i32).to_be_bytes());
        out.extend_from_slice(&key_group.to_be_bytes());
        for v in *values {
            out.extend_from_slice(&(v.len() as i32).to_be_bytes());
            out.extend_from_slice(v);
        }
    }
    out
}

#[test]
fn framed_batches_are_kept_as_they_are_and_checked_whole_first() {
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, 2, b"x").unwrap();
    w.append_framed_owned(
        &mut fx,
        framed(&[(-1, &[b"m"]), (2, &[b"y", b""]), (0, &[b"z"])]),
    )
    .unwrap();
    w.append(&mut fx, 2, b"after").unwrap();
    w.append_framed_owned(&mut fx, Vec::new()).unwrap();
    pending(w.persist(&mut fx, 0, 1));
    let set = &fx.scheduled[0].change_sets[0];
    assert_eq!(set.size, 9);
    let changes = decode_change_set(&set.block.to_vec(), 0).unwrap();
    // Each key group's changes in the order they came; the framed groups as they were.
    assert_eq!(
        changes,
        vec![
            change(2, b"x"),
            change(META_KEY_GROUP, b"m"),
            change(2, b"y"),
            change(2, b""),
            change(0, b"z"),
            change(2, b"after"),
        ]
    );
    // A malformed batch, or one with a change the writer refuses, appends nothing.
    let whole = framed(&[(1, &[b"ok"]), (3, &[b"abc"])]);
    let lengths = |total: u64, data: usize| {
        Err(WriterError::InvalidArgument(InvalidArgument::BatchLengths(
            BatchLengths {
                total,
                data: data as u64,
            },
        )))
    };
    let cases: Vec<(&str, Vec<u8>, Result<(), WriterError>)> = vec![
        (
            "cut short",
            whole[..whole.len() - 1].to_vec(),
            lengths(29, 28),
        ),
        (
            "a negative count",
            vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0],
            lengths(8, 9),
        ),
        ("a header cut short", vec![0, 0, 0, 1, 0, 0], lengths(8, 6)),
        (
            "a key group outside the range",
            framed(&[(1, &[b"ok"]), (10, &[b"a"])]),
            Err(WriterError::InvalidArgument(InvalidArgument::OutsideRange(
                OutsideRange {
                    key_group: 10,
                    range: KeyGroupRange { start: 0, end: 9 },
                },
            ))),
        ),
        (
            "a key group below -1",
            framed(&[(-2, &[b"a"])]),
            Err(WriterError::InvalidArgument(
                InvalidArgument::NegativeBatchKeyGroup(-2),
            )),
        ),
    ];
    for (name, data, expected) in cases {
        let (mut w, mut fx) = open(1);
        assert_eq!(w.append_framed_owned(&mut fx, data), expected, "{name}");
        assert!(fx.scheduled.is_empty(), "{name}");
        assert_eq!(w.next_sequence_number(), 0, "{name}: nothing appended");
    }
}

#[test]
fn a_framed_batch_reaching_the_threshold_is_uploaded_after_it() {
    let (mut w, mut fx) = open(10);
    w.append_framed_owned(&mut fx, framed(&[(0, &[b"12345"]), (1, &[b"1234"])]))
        .unwrap();
    assert!(fx.scheduled.is_empty(), "9 bytes are below the threshold");
    w.append_framed_owned(&mut fx, framed(&[(0, &[b"1"]), (3, &[b"abc"])]))
        .unwrap();
    assert_eq!(
        fx.scheduled_sqns(),
        vec![vec![0]],
        "at 13 bytes, after the batch"
    );
    assert_eq!(fx.scheduled[0].change_sets[0].size, 13);
    assert_eq!(w.active_sequence_number(), 1);
}

// ---------------------------------------------------------------------------------------
// Deliberate fixes (F1–F15) and other port behaviour
// ---------------------------------------------------------------------------------------

#[test]
fn operations_after_close_return_closed() {
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    w.close(&mut fx).unwrap();
    let closed = |op| Err(WriterError::Closed(Closed::AfterClose(op)));
    assert_eq!(w.append(&mut fx, KG, b"b"), closed(Operation::Append));
    assert_eq!(
        w.append(&mut fx, KG, b"b").unwrap_err().to_string(),
        "append after the writer was closed"
    );
    assert_eq!(w.append_meta(&mut fx, b"b"), closed(Operation::AppendMeta));
    assert_eq!(
        w.append_batch(&mut fx, &[0], &[1], b"b"),
        closed(Operation::AppendBatch)
    );
    assert_eq!(
        w.persist(&mut fx, 0, 1).unwrap_err(),
        WriterError::Closed(Closed::AfterClose(Operation::Persist))
    );
    assert_eq!(w.truncate(&mut fx, 0), closed(Operation::Truncate));
    assert!(w.is_closed());
    // The open change set was dropped; the number is frozen.
    assert_eq!(w.next_sequence_number(), 0);
    assert_eq!(w.active_sequence_number(), 0);
    assert!(fx.scheduled.is_empty());
    assert!(fx.local_discards.is_empty());
    // The coordinator's confirm and abort still reach the local registry (Flink has no
    // closed check there), and their ranges are still checked.
    assert_eq!(w.confirm(&mut fx, 0, 0, 1), Ok(()));
    assert_eq!(w.reset(&mut fx, 0, 0, 2), Ok(()));
    assert_eq!(fx.local_discards, vec![(1, vec![]), (3, vec![])]);
    assert!(matches!(
        w.confirm(&mut fx, 0, 5, 3),
        Err(WriterError::InvalidRange(_))
    ));
}

#[test]
fn close_fails_every_pending_persist() {
    let (mut w, mut fx) = open(100);
    w.append(&mut fx, KG, &bytes(10, 0)).unwrap(); // sqn 0
    let t1 = pending(w.persist(&mut fx, 0, 1)); // task 0: [0]
    w.append(&mut fx, KG, &bytes(100, 1)).unwrap(); // pre-emptive task 1: [1]
    w.append(&mut fx, KG, &bytes(10, 2)).unwrap(); // sqn 2
    let t2 = pending(w.persist(&mut fx, 1, 2)); // task 2: [2]
    assert_eq!(fx.scheduled_sqns(), vec![vec![0], vec![1], vec![2]]);

    let completions = w.close(&mut fx).unwrap();
    assert_eq!(
        completions.len(),
        2,
        "the pre-emptive listener has no ticket"
    );
    assert_eq!(
        outcome(&completions, t1),
        Err(closed_while_persisting(0, 1, 1))
    );
    assert_eq!(
        outcome(&completions, t2),
        Err(closed_while_persisting(1, 3, 2))
    );
    // Late outcomes complete nothing more.
    assert!(upload(&mut w, &mut fx, 0).is_empty());
    assert!(upload(&mut w, &mut fx, 1).is_empty());
    assert!(fail(&mut w, &mut fx, 2).is_empty());
}

#[test]
fn results_after_close_are_released_not_deleted() {
    let (mut w, mut fx) = open_local(u64::MAX);
    w.append(&mut fx, KG, b"abc").unwrap();
    let ticket = pending(w.persist(&mut fx, 0, 1));
    let completions = w.close(&mut fx).unwrap();
    assert!(matches!(
        outcome(&completions, ticket),
        Err(WriterError::Closed(_))
    ));

    // The file is shared with another writer's change set (batching is storage-wide).
    let mut files = fx.write_file(&[0]);
    let (id, results) = files.pop().unwrap();
    *fx.ref_counts.get_mut("remote/0").unwrap() += 1;
    *fx.ref_counts.get_mut("local/0").unwrap() += 1;
    assert!(w.on_upload_succeeded(&mut fx, id, results).is_empty());

    assert_eq!(paths_of(&fx.releases), vec!["remote/0", "local/0"]);
    assert!(
        !fx.is_deleted("remote/0"),
        "the other writer's change set keeps it"
    );
    assert!(!fx.is_deleted("local/0"));
    assert_eq!(fx.ref_counts["remote/0"], 1);
    assert_eq!(fx.ref_counts["local/0"], 1);
    assert!(
        fx.local_registrations.is_empty(),
        "nothing is registered after close"
    );
    assert!(fx.stop_trackings.is_empty());
}

#[test]
fn failure_after_close_is_ignored() {
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, KG, b"abc").unwrap();
    pending(w.persist(&mut fx, 0, 1));
    w.close(&mut fx).unwrap();
    let warnings_before = fx.warnings().len();
    assert!(fail(&mut w, &mut fx, 0).is_empty());
    assert_eq!(fx.warnings().len(), warnings_before);
}

#[test]
fn incremental_size_counts_every_contributing_upload() {
    let (mut w, mut fx) = open(100);
    w.append(&mut fx, KG, &bytes(100, 0)).unwrap(); // pre-emptive task 0: [0]
    w.append(&mut fx, KG, &bytes(10, 1)).unwrap(); // sqn 1
    let ticket = pending(w.persist(&mut fx, 0, 1)); // task 1: [1], waits on task 0 too
    assert_eq!(fx.scheduled_sqns(), vec![vec![0], vec![1]]);

    assert!(upload(&mut w, &mut fx, 0).is_empty());
    let snapshot = completed(&upload(&mut w, &mut fx, 1), ticket);
    assert_eq!(snapshot.remote.entries.len(), 2);
    assert_eq!(snapshot.remote.state_size, 110);
    // Flink would report 10 (only the completing callback); the port counts both.
    assert_eq!(snapshot.remote.incremental_size, 110);
}

#[test]
fn incremental_size_counts_only_new_uploads() {
    // Spec probe: a range of two change sets where one was already uploaded -> size 4,
    // incremental 1.
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, KG, b"abc").unwrap();
    persist_uploaded(&mut w, &mut fx, 0, 1);
    w.append(&mut fx, KG, b"d").unwrap();
    let snapshot = persist_uploaded(&mut w, &mut fx, 0, 2);
    assert_eq!(snapshot.remote.state_size, 4);
    assert_eq!(snapshot.remote.incremental_size, 1);
}

#[test]
fn persist_completes_when_inflight_preemptive_upload_lands() {
    let (mut w, mut fx) = open(10);
    let payload = bytes(10, 4);
    w.append(&mut fx, KG, &payload).unwrap(); // pre-emptive task 0
    assert!(fx.scheduled[0].preemptive, "no checkpoint waits for it");
    let ticket = pending(w.persist(&mut fx, 0, 1));
    assert_eq!(fx.scheduled.len(), 1, "nothing new to upload");
    w.append(&mut fx, KG, b"x").unwrap();
    pending(w.persist(&mut fx, 1, 2));
    assert!(!fx.scheduled[1].preemptive, "checkpoint 2 waits for it");
    let completions = upload(&mut w, &mut fx, 0);
    assert_eq!(completions.len(), 1);
    let snapshot = completed(&completions, ticket);
    assert_eq!(
        fx.decode(&snapshot.remote),
        vec![vec![change(KG, &payload)]]
    );
    assert_eq!(snapshot.remote.incremental_size, 10);
}

#[test]
fn persist_with_nothing_appended_is_ready_and_empty() {
    let (mut w, mut fx) = open_local(u64::MAX);
    let snapshot = ready(w.persist(&mut fx, 0, 1));
    assert!(snapshot.remote.entries.is_empty());
    assert_eq!(snapshot.remote.state_size, 0);
    assert_eq!(snapshot.remote.incremental_size, 0);
    assert_eq!(snapshot.remote.key_group_range, RANGE);
    assert_eq!(snapshot.remote.storage_id, STORAGE_ID);
    assert_eq!(snapshot.local.map(|l| l.entries.len()), Some(0));
    assert!(fx.scheduled.is_empty());

    // Also after uploads: from == active.
    w.append(&mut fx, KG, b"a").unwrap();
    persist_uploaded(&mut w, &mut fx, 0, 2);
    let snapshot = ready(w.persist(&mut fx, 1, 3));
    assert!(snapshot.remote.entries.is_empty());
    assert_eq!(fx.scheduled.len(), 1);
}

#[test]
fn second_persist_of_uploaded_range_is_ready_with_zero_incremental_size() {
    let (mut w, mut fx) = open_local(u64::MAX);
    append_closed(&mut w, &mut fx, b"abc");
    w.append(&mut fx, 1, b"de").unwrap();
    let first = persist_uploaded(&mut w, &mut fx, 0, 1);
    assert_eq!(first.remote.incremental_size, 5);
    assert_eq!(
        first
            .remote
            .entries
            .iter()
            .map(|e| e.offset)
            .collect::<Vec<_>>(),
        vec![0, 4 + 8 + 4 + 3]
    );

    let second = ready(w.persist(&mut fx, 0, 2));
    assert_eq!(second.remote.entries, first.remote.entries);
    assert_eq!(second.remote.state_size, 5);
    assert_eq!(second.remote.incremental_size, 0);
    assert_eq!(second.local, first.local);
    assert_eq!(fx.scheduled.len(), 1, "nothing is uploaded again");
    // Ready results are registered under the new checkpoint at persist time.
    assert_eq!(fx.local_registry["local/0"].1, 2);
}

#[test]
fn refused_schedule_fails_persist_and_marks_sqns_failed() {
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, KG, b"abc").unwrap();
    fx.refuse = Some(Refusal::StorageClosed);
    let cause = UploadFailure::Refused(Refused {
        change_sets: vec![0],
        refusal: Refusal::StorageClosed,
    });
    let err = w.persist(&mut fx, 0, 1).unwrap_err();
    assert_eq!(err, WriterError::UploadFailed(cause.clone()));
    assert_eq!(
        err.to_string(),
        "the uploader refused change sets [0]: the changelog storage is closed"
    );

    fx.refuse = None;
    assert_eq!(
        w.persist(&mut fx, 0, 2),
        Err(WriterError::AlreadyFailed(AlreadyFailed {
            failed: 0,
            cause
        }))
    );
    assert!(fx.scheduled.is_empty());

    // Later change sets are fine, and the refused persist left no listener behind.
    w.append(&mut fx, KG, b"d").unwrap();
    let ticket = pending(w.persist(&mut fx, 1, 3));
    assert_eq!(fx.scheduled_sqns(), vec![vec![1]]);
    let closing = w.close(&mut fx).unwrap();
    assert_eq!(closing.len(), 1);
    assert_eq!(closing[0].ticket, ticket);
}

#[test]
fn refused_preemptive_schedule_fails_the_append() {
    let mut w = writer(10);
    let mut fx = Fake {
        refuse: Some(Refusal::StorageClosed),
        ..Fake::default()
    };
    assert_eq!(
        w.append(&mut fx, KG, &bytes(10, 0)),
        Err(WriterError::UploadFailed(UploadFailure::Refused(Refused {
            change_sets: vec![0],
            refusal: Refusal::StorageClosed
        })))
    );
    assert_eq!(w.active_sequence_number(), 1);
    fx.refuse = None;
    assert!(matches!(
        w.persist(&mut fx, 0, 1),
        Err(WriterError::AlreadyFailed(_))
    ));
    w.append(&mut fx, KG, &bytes(10, 1)).unwrap();
    assert_eq!(fx.scheduled_sqns(), vec![vec![1]]);
}

#[test]
fn refused_schedule_fails_overlapping_pending_persists() {
    // A persist waiting on an in-flight upload and covering the refused sqn fails too.
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    let t1 = pending(w.persist(&mut fx, 0, 1)); // task 0: [0]
    w.append(&mut fx, KG, b"b").unwrap();
    fx.refuse = Some(Refusal::StorageClosed);
    assert!(matches!(
        w.persist(&mut fx, 0, 2),
        Err(WriterError::UploadFailed(_))
    ));
    fx.refuse = None;
    // Checkpoint 1 only covers sqn 0 and still completes.
    let snapshot = completed(&upload(&mut w, &mut fx, 0), t1);
    assert_eq!(snapshot.remote.entries.len(), 1);
}

#[test]
fn upload_failure_fails_all_overlapping_persists() {
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    let t1 = pending(w.persist(&mut fx, 0, 1));
    let t2 = pending(w.persist(&mut fx, 0, 2));
    w.append(&mut fx, KG, b"b").unwrap();
    let t3 = pending(w.persist(&mut fx, 1, 3)); // task 1: [1], unaffected
    let completions = fail(&mut w, &mut fx, 0);
    assert_eq!(completions.len(), 2);
    for ticket in [t1, t2] {
        assert_eq!(
            outcome(&completions, ticket),
            Err(upload_failed(0)),
            "ticket {ticket}"
        );
    }
    let completions = upload(&mut w, &mut fx, 1);
    completed(&completions, t3);
}

#[test]
fn failure_below_truncation_is_not_remembered() {
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    let ticket = pending(w.persist(&mut fx, 0, 1));
    w.truncate(&mut fx, 1).unwrap();
    let completions = fail(&mut w, &mut fx, 0);
    assert_eq!(outcome(&completions, ticket), Err(upload_failed(0)));
    w.append(&mut fx, KG, b"b").unwrap();
    pending(w.persist(&mut fx, 1, 2));
}

#[test]
fn unknown_task_outcomes_are_released_and_logged() {
    let (mut w, mut fx) = open_local(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    let ticket = pending(w.persist(&mut fx, 0, 1));
    let mut files = fx.write_file(&[0]);
    let (_, results) = files.pop().unwrap();

    assert!(
        w.on_upload_succeeded(&mut fx, 42, results.clone())
            .is_empty()
    );
    assert_eq!(paths_of(&fx.releases), vec!["remote/0", "local/0"]);
    assert!(
        fx.warnings()
            .contains(&"writer op: success for unknown upload task 42; releasing its files")
    );
    assert!(w.on_upload_failed(&mut fx, 43).is_empty());
    assert!(
        fx.warnings()
            .contains(&"writer op: failure for unknown upload task 43")
    );

    // The real task still completes; a duplicate outcome afterwards is unknown too.
    let completions = w.on_upload_succeeded(&mut fx, 0, results.clone());
    completed(&completions, ticket);
    assert!(w.on_upload_succeeded(&mut fx, 0, results).is_empty());
    assert!(
        fx.warnings()
            .contains(&"writer op: success for unknown upload task 0; releasing its files")
    );
    assert!(w.on_upload_failed(&mut fx, 0).is_empty());
    // The duplicate failure did not poison the sqn.
    ready(w.persist(&mut fx, 0, 2));
}

#[test]
fn truncate_releases_uploaded_and_drops_not_uploaded() {
    let (mut w, mut fx) = open_local(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    persist_uploaded(&mut w, &mut fx, 0, 1);
    w.append(&mut fx, KG, b"b").unwrap(); // sqn 1, never uploaded
    assert_eq!(w.next_sequence_number(), 2);
    w.truncate(&mut fx, 2).unwrap();
    assert_eq!(paths_of(&fx.releases), vec!["remote/0", "local/0"]);
    assert!(fx.is_deleted("remote/0") && fx.is_deleted("local/0"));
    let snapshot = ready(w.persist(&mut fx, 2, 2));
    assert!(snapshot.remote.entries.is_empty());
    assert_eq!(fx.scheduled.len(), 1, "sqn 1 was dropped without upload");
    assert_eq!(w.active_sequence_number(), 2);
}

#[test]
fn truncate_while_in_flight_releases_results_on_arrival() {
    let (mut w, mut fx) = open_local(u64::MAX);
    append_closed(&mut w, &mut fx, b"a");
    w.append(&mut fx, KG, b"b").unwrap();
    let ticket = pending(w.persist(&mut fx, 0, 1)); // task 0: [0, 1]
    w.truncate(&mut fx, 1).unwrap();
    assert!(fx.releases.is_empty(), "nothing to release before arrival");

    let completions = upload(&mut w, &mut fx, 0);
    // The listener is notified before the truncation filter (as in Flink).
    let snapshot = completed(&completions, ticket);
    assert_eq!(snapshot.remote.entries.len(), 2);
    // sqn 0 is released (remote and local); sqn 1 is kept.
    assert_eq!(paths_of(&fx.releases), vec!["remote/0", "local/0"]);
    assert_eq!(fx.ref_counts["remote/0"], 1);
    assert_eq!(fx.ref_counts["local/0"], 1);
    assert_eq!(
        w.persist(&mut fx, 0, 2),
        Err(WriterError::Truncated(Truncated {
            requested: 0,
            truncated: 1,
        }))
    );
    let again = ready(w.persist(&mut fx, 1, 2));
    assert_eq!(again.remote.entries, snapshot.remote.entries[1..].to_vec());
}

#[test]
fn truncate_and_close_releases_entries_from_on_only() {
    let (mut w, mut fx) = open_local(u64::MAX);
    for (i, value) in [b"a", b"b", b"c"].iter().enumerate() {
        w.append(&mut fx, KG, *value).unwrap();
        let t = pending(w.persist(&mut fx, i as u64, i as i64 + 1));
        completed(&upload(&mut w, &mut fx, i as u64), t);
    }
    w.append(&mut fx, KG, b"d").unwrap();
    let t = pending(w.persist(&mut fx, 3, 4)); // task 3 in flight
    let completions = w.truncate_and_close(&mut fx, 1).unwrap();
    assert_eq!(
        outcome(&completions, t),
        Err(closed_while_persisting(3, 4, 4))
    );
    assert_eq!(
        paths_of(&fx.releases),
        vec!["remote/1", "local/1", "remote/2", "local/2"]
    );
    assert!(!fx.is_deleted("remote/0") && !fx.is_deleted("local/0"));
    assert!(fx.is_deleted("remote/1") && fx.is_deleted("remote/2"));
    // The in-flight upload is released when it lands.
    assert!(upload(&mut w, &mut fx, 3).is_empty());
    assert!(fx.is_deleted("remote/3") && fx.is_deleted("local/3"));
    assert!(!fx.releases.iter().any(|h| h.path == "remote/0"));
}

#[test]
fn local_files_registered_under_the_checkpoint_that_waits_on_them() {
    // Checkpoint 2 only waits on checkpoint 1's upload; Flink registers the result under 1
    // only, so confirming 2 deleted it (F5).
    let (mut w, mut fx) = open_local(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    let t1 = pending(w.persist(&mut fx, 0, 1));
    let t2 = pending(w.persist(&mut fx, 0, 2));
    assert_eq!(fx.scheduled.len(), 1);
    let completions = upload(&mut w, &mut fx, 0);
    completed(&completions, t1);
    let cp2 = completed(&completions, t2);
    assert_eq!(paths(cp2.local.as_ref().unwrap()), vec!["local/0"]);
    assert!(fx.local_registrations.contains(&("local/0".to_string(), 2)));
    assert_eq!(fx.local_registry["local/0"].1, 2);

    let next = w.next_sequence_number();
    w.confirm(&mut fx, 0, next, 2).unwrap();
    assert!(
        !fx.is_deleted("local/0"),
        "checkpoint 2's local file was deleted"
    );
    w.confirm(&mut fx, 0, next, 3).unwrap();
    assert!(
        fx.is_deleted("local/0"),
        "last used by 2, so confirming 3 deletes it"
    );
}

#[test]
fn local_files_of_inflight_preemptive_upload_registered_under_waiting_checkpoint() {
    let (mut w, mut fx) = open_local(10);
    w.append(&mut fx, KG, &bytes(10, 0)).unwrap(); // pre-emptive task 0
    let ticket = pending(w.persist(&mut fx, 0, 1));
    let snapshot = completed(&upload(&mut w, &mut fx, 0), ticket);
    assert_eq!(paths(snapshot.local.as_ref().unwrap()), vec!["local/0"]);
    assert_eq!(fx.local_registrations, vec![("local/0".to_string(), 1)]);
    w.confirm(&mut fx, 0, 1, 1).unwrap();
    assert!(!fx.is_deleted("local/0"));
}

#[test]
fn preemptive_upload_alone_registers_no_local_files() {
    let (mut w, mut fx) = open_local(10);
    w.append(&mut fx, KG, &bytes(10, 0)).unwrap();
    assert!(upload(&mut w, &mut fx, 0).is_empty());
    assert!(fx.local_registrations.is_empty());
}

#[test]
fn discarded_local_copies_are_dropped_from_uploaded_results() {
    let (mut w, mut fx) = open_local(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    let first = persist_uploaded(&mut w, &mut fx, 0, 1);
    assert_eq!(paths(first.local.as_ref().unwrap()), vec!["local/0"]);

    // Abort checkpoint 1: its local copy goes.
    w.reset(&mut fx, 0, 1, 1).unwrap();
    assert_eq!(fx.local_discards, vec![(2, vec!["local/0".to_string()])]);
    assert!(fx.is_deleted("local/0"));

    let registrations_before = fx.local_registrations.len();
    let later = ready(w.persist(&mut fx, 0, 2));
    assert_eq!(later.remote.entries, first.remote.entries);
    assert_eq!(later.local, None, "the only local copy is gone");
    assert_eq!(fx.local_registrations.len(), registrations_before);
    assert!(
        fx.warnings()
            .iter()
            .any(|m| m.contains("only 0 of 1 change sets have a local copy"))
    );

    // New uploads carry local copies again; the mixed snapshot stays remote-only.
    w.append(&mut fx, KG, b"b").unwrap();
    let newest = persist_uploaded(&mut w, &mut fx, 1, 3);
    assert_eq!(paths(newest.local.as_ref().unwrap()), vec!["local/1"]);
    assert_eq!(ready(w.persist(&mut fx, 0, 4)).local, None);
}

#[test]
fn pending_persist_does_not_resurrect_discarded_local_copy() {
    let (mut w, mut fx) = open_local(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    persist_uploaded(&mut w, &mut fx, 0, 1); // local/0 @ 1
    w.append(&mut fx, KG, b"b").unwrap();
    // Checkpoint 2 takes sqn 0 from `uploaded` (local/0 now @ 2) and waits on task 1.
    let t2 = pending(w.persist(&mut fx, 0, 2));
    // Checkpoint 3 is aborted while 2 is still pending: everything last used below 4 goes,
    // local/0 included, and the writer forgets that local copy in `uploaded`.
    w.reset(&mut fx, 0, 2, 3).unwrap();
    assert!(fx.is_deleted("local/0"));

    let registrations_before = fx.local_registrations.len();
    let cp2 = completed(&upload(&mut w, &mut fx, 1), t2);
    for (path, cp) in &fx.local_registrations[registrations_before..] {
        assert!(
            !fx.is_deleted(path),
            "deleted {path} registered again under {cp}"
        );
    }
    if let Some(local) = &cp2.local {
        for path in paths(local) {
            assert!(
                !fx.is_deleted(&path),
                "checkpoint 2 references deleted {path}"
            );
        }
    }
}

#[test]
fn reset_discards_up_to_checkpoint_plus_one() {
    let (mut w, mut fx) = open_local(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    persist_uploaded(&mut w, &mut fx, 0, 5);
    w.reset(&mut fx, 0, 1, 4).unwrap();
    assert!(
        !fx.is_deleted("local/0"),
        "last used by 5, reset of 4 keeps it"
    );
    w.reset(&mut fx, 0, 1, 5).unwrap();
    assert!(fx.is_deleted("local/0"));
    assert_eq!(
        fx.local_discards,
        vec![(5, vec![]), (6, vec!["local/0".to_string()])]
    );
    // Nothing was re-uploaded and the remote part is intact.
    assert_eq!(fx.scheduled.len(), 1);
    assert_eq!(ready(w.persist(&mut fx, 0, 6)).remote.entries.len(), 1);
}

#[test]
fn confirm_after_truncation_is_fine() {
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    persist_uploaded(&mut w, &mut fx, 0, 1);
    w.truncate(&mut fx, 1).unwrap();
    w.confirm(&mut fx, 0, 1, 1).unwrap();
    assert!(fx.stop_trackings.is_empty(), "the truncated entry is gone");
}

#[test]
fn uploaded_blocks_decode_to_appended_changes_in_order() {
    let (mut w, mut fx) = open(u64::MAX);
    w.append(&mut fx, 3, b"k3-a").unwrap();
    w.append_meta(&mut fx, b"meta").unwrap();
    w.append(&mut fx, 1, b"k1").unwrap();
    w.append(&mut fx, 3, b"k3-b").unwrap();
    w.next_sequence_number();
    w.append(&mut fx, 2, b"second").unwrap();
    let ticket = pending(w.persist(&mut fx, 0, 1));
    assert_eq!(fx.scheduled_sqns(), vec![vec![0, 1]]);
    assert_eq!(fx.last_task().change_sets[0].size, 14);
    assert_eq!(fx.last_task().change_sets[1].size, 6);
    let snapshot = completed(&upload_all(&mut w, &mut fx), ticket);
    assert_eq!(
        fx.decode(&snapshot.remote),
        vec![
            vec![
                change(META_KEY_GROUP, b"meta"),
                change(1, b"k1"),
                change(3, b"k3-a"),
                change(3, b"k3-b"),
            ],
            vec![change(2, b"second")],
        ]
    );
    let first_block_len = fx.last_task().change_sets[0].block.len() as u64;
    assert_eq!(snapshot.remote.entries[1].offset, first_block_len);
    assert_eq!(snapshot.remote.state_size, 20);
}

/// A persist waiting for an upload, whose already-uploaded change sets were truncated
/// meanwhile, completes without registering the released local copies: the writer no
/// longer holds them (the host would refuse the registration as a guest fault).
#[test]
fn a_completing_persist_registers_only_the_local_copies_still_held() {
    let (mut w, mut fx) = open_local(u64::MAX);
    w.append(&mut fx, KG, b"a").unwrap();
    persist_uploaded(&mut w, &mut fx, 0, 1);
    w.append(&mut fx, KG, b"b").unwrap();
    let second = pending(w.persist(&mut fx, 0, 2));
    w.truncate(&mut fx, 1).unwrap();
    assert!(fx.is_deleted("local/0"), "change set 0 was released");
    fx.local_registrations.clear();
    let snapshot = completed(&upload_all(&mut w, &mut fx), second);
    assert_eq!(snapshot.remote.entries.len(), 2);
    assert_eq!(
        fx.local_registrations,
        vec![("local/1".to_string(), 2), ("local/1".to_string(), 2)],
        "only the copy of change set 1, which the writer still holds"
    );
}

/// A batch taken over whole behaves exactly like the same batch copied: the same
/// pre-emptive persists at the same changes, the same blocks.
#[test]
fn an_owned_batch_is_appended_like_a_copied_one() {
    let key_groups: Vec<i32> = (0..40).map(|i| (i * 7) % 5).collect();
    let lengths: Vec<u32> = (0..40).map(|i| (i % 9) as u32).collect();
    let data: Vec<u8> = (0..lengths.iter().sum::<u32>()).map(|i| i as u8).collect();
    let run = |owned: bool| {
        let (mut w, mut fx) = open(30);
        if owned {
            w.append_batch_owned(&mut fx, &key_groups, &lengths, data.clone())
                .unwrap();
        } else {
            w.append_batch(&mut fx, &key_groups, &lengths, &data)
                .unwrap();
        }
        w.append(&mut fx, KG, b"tail").unwrap();
        pending(w.persist(&mut fx, 0, 1));
        (fx.scheduled_sqns(), fx.scheduled.clone(), w.open_bytes())
    };
    let (copied, owned) = (run(false), run(true));
    assert!(
        copied.0.len() > 2,
        "pre-emptive persists happened: {:?}",
        copied.0
    );
    assert_eq!(owned, copied);
    // A malformed owned batch is refused whole, as a copied one.
    let (mut w, mut fx) = open(30);
    assert!(matches!(
        w.append_batch_owned(&mut fx, &[0, 1], &[1], vec![1]),
        Err(WriterError::InvalidArgument(_))
    ));
    assert_eq!(w.open_bytes(), 0);
}

/// A writer that keeps large values as pieces of their own schedules the same bytes as
/// one that copies every value into its blocks.
#[test]
fn value_pieces_schedule_the_same_blocks() {
    let lengths: Vec<u32> = vec![5, 4096, 0, 1023, 1024, 70_000, 3];
    let key_groups: Vec<i32> = vec![3, 1, -1, 1, 9, 3, 0];
    let data: Vec<u8> = (0..lengths.iter().sum::<u32>())
        .map(|i| (i % 253) as u8)
        .collect();
    let mut scheduled = Vec::new();
    for value_pieces in [false, true] {
        let mut fx = Fake::default();
        let mut w = Writer::new(WriterConfig {
            value_pieces,
            ..config(1 << 30, false)
        })
        .unwrap();
        w.append_batch_owned(&mut fx, &key_groups, &lengths, data.clone())
            .unwrap();
        w.append(&mut fx, 2, &[7; 2000]).unwrap();
        let to = w.next_sequence_number();
        w.append_batch_owned(&mut fx, &key_groups, &lengths, data.clone())
            .unwrap();
        w.persist(&mut fx, 0, 1).unwrap();
        assert_eq!(fx.last_task().change_sets.len(), 2, "{to}");
        scheduled.push(fx.last_task().clone());
    }
    assert_eq!(scheduled[0], scheduled[1]);
}

#[test]
fn pending_persists_share_results_instead_of_copying_them() {
    // A writer whose uploads fall behind frequent checkpoints: 200 persists from 0, all
    // pending, then the uploads land newest first. Every persist completes with its whole
    // range, and no result is stored more than once (a copy per pending persist grew with
    // the square of their number).
    let (mut w, mut fx) = open(u64::MAX);
    let values: Vec<Vec<u8>> = (0..200).map(|i| bytes(16, i as u8)).collect();
    let mut tickets = Vec::new();
    for (i, value) in values.iter().enumerate() {
        append(&mut w, &mut fx, value);
        tickets.push(pending(w.persist(&mut fx, 0, i as i64 + 1)));
    }
    let mut completions = Vec::new();
    for id in fx.pending().into_iter().rev() {
        completions.extend(upload(&mut w, &mut fx, id));
        assert!(w.stored_results() <= values.len());
    }
    assert_eq!(completions.len(), tickets.len());
    for (i, ticket) in tickets.iter().enumerate() {
        let snapshot = completed(&completions, *ticket);
        let decoded = fx.decode(&snapshot.remote);
        let expected: Vec<Vec<Change>> = values[..=i].iter().map(|v| vec![change(KG, v)]).collect();
        assert_eq!(decoded, expected, "persist {i}");
    }
    assert_eq!(w.stored_results(), values.len());
}

#[test]
fn a_persist_waiting_across_truncations_still_names_the_truncated_change_sets() {
    let (mut w, mut fx) = open(u64::MAX);
    let (a, b, c) = (bytes(8, 1), bytes(8, 2), bytes(8, 3));
    append(&mut w, &mut fx, &a);
    let first = pending(w.persist(&mut fx, 0, 1));
    append(&mut w, &mut fx, &b);
    let second = pending(w.persist(&mut fx, 0, 2));
    append(&mut w, &mut fx, &c);
    let third = pending(w.persist(&mut fx, 0, 3));
    let [t0, t1, t2] = fx.pending()[..] else {
        panic!("three tasks")
    };
    // sqn 0 lands, completing the first persist, whose confirm truncates it away.
    let done = upload(&mut w, &mut fx, t0);
    assert_eq!(
        fx.decode(&completed(&done, first).remote),
        vec![vec![change(KG, &a)]]
    );
    w.confirm(&mut fx, 0, 1, 1).unwrap();
    w.truncate(&mut fx, 1).unwrap();
    // sqn 1 is truncated before its upload lands: released at once, still named.
    w.truncate(&mut fx, 2).unwrap();
    let done = upload(&mut w, &mut fx, t1);
    assert_eq!(
        fx.decode(&completed(&done, second).remote),
        vec![vec![change(KG, &a)], vec![change(KG, &b)]]
    );
    assert_eq!(
        w.stored_results(),
        2,
        "the third persist still names sqn 0 and 1"
    );
    let done = upload(&mut w, &mut fx, t2);
    assert_eq!(
        fx.decode(&completed(&done, third).remote),
        vec![
            vec![change(KG, &a)],
            vec![change(KG, &b)],
            vec![change(KG, &c)]
        ]
    );
    assert_eq!(
        w.stored_results(),
        1,
        "only sqn 2 is held; nothing waits any more"
    );
    assert_eq!(
        paths_of(&fx.releases),
        vec!["remote/0".to_string(), "remote/1".to_string()],
        "truncated change sets are released once, as before"
    );
}

#[test]
fn repeated_results_of_a_task_count_once() {
    // A host that repeats a result, or names a change set the task did not hold, must
    // not complete a persist early: its snapshot would miss a change set.
    let (mut w, mut fx) = open(u64::MAX);
    let (a, b) = (bytes(8, 1), bytes(8, 2));
    append(&mut w, &mut fx, &a);
    let first = pending(w.persist(&mut fx, 0, 1));
    append(&mut w, &mut fx, &b);
    let second = pending(w.persist(&mut fx, 0, 2));
    let [t0, t1] = fx.pending()[..] else {
        panic!("two tasks")
    };
    let (_, results) = fx.write_file(&[t1]).pop().unwrap();
    let mut repeated = results.clone();
    repeated.extend(results.clone());
    repeated.push(UploadResult {
        sequence_number: 0,
        ..results[0].clone()
    });
    assert!(w.on_upload_succeeded(&mut fx, t1, repeated).is_empty());
    assert!(
        fx.logs.iter().any(|(level, m)| *level == Level::Warn
            && m.contains("ignoring the 2 that repeat or name others")),
        "{:?}",
        fx.logs
    );
    let done = upload(&mut w, &mut fx, t0);
    assert_eq!(
        fx.decode(&completed(&done, first).remote),
        vec![vec![change(KG, &a)]]
    );
    assert_eq!(
        fx.decode(&completed(&done, second).remote),
        vec![vec![change(KG, &a)], vec![change(KG, &b)]]
    );
}

#[test]
fn a_task_that_comes_back_short_fails_the_persists_it_leaves_missing() {
    // A host that returns fewer results than the task held must not leave a persist
    // waiting forever with a change set that never gets a result: the persists that need
    // it fail (as for a failed upload), and later persists over it fail too.
    let (mut w, mut fx) = open(u64::MAX);
    let (a, b) = (bytes(8, 1), bytes(8, 2));
    append_closed(&mut w, &mut fx, &a);
    append(&mut w, &mut fx, &b);
    let ticket = pending(w.persist(&mut fx, 0, 1));
    let [task] = fx.pending()[..] else {
        panic!("one task")
    };
    let (_, mut results) = fx.write_file(&[task]).pop().unwrap();
    assert_eq!(results.len(), 2);
    let kept = results.remove(0);
    let done = w.on_upload_succeeded(&mut fx, task, vec![kept]);
    let [completion] = &done[..] else {
        panic!("the persist completes at once: {done:?}")
    };
    assert_eq!(completion.ticket, ticket);
    let Err(WriterError::UploadFailed(cause)) = &completion.outcome else {
        panic!("{completion:?}")
    };
    assert_eq!(
        cause,
        &UploadFailure::NoResult(NoResult {
            task,
            change_sets: vec![1]
        })
    );
    assert_eq!(w.pending_persists(), 0);
    assert!(matches!(
        w.persist(&mut fx, 0, 2),
        Err(WriterError::AlreadyFailed(_))
    ));
}

#[test]
fn pre_emptive_uploads_wait_for_nothing() {
    // Nobody awaits a pre-emptive persist: it uploads and keeps no listener, so results
    // do not visit one per small change set in flight, and no snapshot is built (or
    // warned about) for nobody.
    let (mut w, mut fx) = open_local(10);
    let values: Vec<Vec<u8>> = (0..100).map(|i| bytes(16, i as u8)).collect();
    for value in &values {
        append(&mut w, &mut fx, value);
    }
    assert_eq!(fx.pending().len(), 100, "one pre-emptive upload per change");
    assert_eq!(w.pending_persists(), 0);
    assert!(upload_all(&mut w, &mut fx).is_empty());
    assert!(
        fx.logs.iter().all(|(level, _)| *level != Level::Warn),
        "{:?}",
        fx.logs
    );
    let snapshot = ready(w.persist(&mut fx, 0, 1));
    let expected: Vec<Vec<Change>> = values.iter().map(|v| vec![change(KG, v)]).collect();
    assert_eq!(fx.decode(&snapshot.remote), expected);
    assert_eq!(
        fx.decode(&snapshot.local.expect("every change set has a local copy")),
        expected
    );
}
