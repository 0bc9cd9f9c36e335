//! The reference model: what every writer of one driver holds (change sets, their
//! uploads and what became of the writer's reference to each file), which persists it
//! accepted and what they returned, and — with local recovery — what it discarded.
//!
//! Upload outcomes reach a writer on other threads, so the model often knows only which
//! answers are possible; it learns what happened from what it observes (snapshots, the
//! store at sync points) and narrows its state down.

use std::collections::{BTreeMap, HashMap, HashSet};

use dstl::writer_error::AlreadyFailed;
use dstl::{KeyGroupRange, SnapshotResult, WriterId};
use dstl_tests::fault_store::{Block, Written};

/// Bytes of the tag that opens every tagged value: writer id (2), sequence number (4),
/// counter (4). Untagged values are shorter, so they are never mistaken for tags.
pub const TAG_LEN: usize = 10;

fn parse_tag(value: &[u8]) -> Option<(u16, u64)> {
    if value.len() < TAG_LEN {
        return None;
    }
    let writer = u16::from_be_bytes([value[0], value[1]]);
    let sqn = u32::from_be_bytes([value[2], value[3], value[4], value[5]]) as u64;
    Some((writer, sqn))
}

/// The change sets of a file, each named by the tags of its values (the store's indexer).
pub fn index_file(bytes: &[u8]) -> Result<Vec<Block>, String> {
    let logical = dstl::codec::logical_bytes(bytes).map_err(|e| e.to_string())?;
    let mut blocks = Vec::new();
    let mut offset = 0u64;
    while offset < logical.len() as u64 {
        let mut reader =
            dstl::codec::ChangeSetReader::new(&logical, offset).map_err(|e| e.to_string())?;
        let mut tag = None;
        while let Some(change) = reader.next_change().map_err(|e| e.to_string())? {
            if let Some(t) = parse_tag(&change.value) {
                match tag {
                    None => tag = Some(t),
                    Some(seen) if seen != t => {
                        return Err(format!(
                            "change set at offset {offset} mixes changes of {seen:?} and {t:?}"
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        let (writer, sqn) =
            tag.ok_or_else(|| format!("change set at offset {offset} has no tagged value"))?;
        blocks.push(Block {
            writer,
            sqn,
            offset,
        });
        offset = reader.position();
    }
    Ok(blocks)
}

/// The file name of a path (remote files and their local copies share it).
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Where a closed change set's upload stands, as far as the model knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upload {
    /// Not handed to the uploader (yet, or ever).
    NotScheduled,
    /// In task `tasks[n]`, outcome not known yet.
    InFlight(usize),
    /// The task failed: no file.
    Failed,
    /// Written to `path` at `offset`, and delivered to the writer.
    Done { path: String, offset: u64 },
    /// Outcome unknown for good (see [`Outcome::Gone`]).
    Gone,
}

/// What the writer did with its reference to the change set's file (as recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// Still held: in the writer's `uploaded` (or will be once delivered), or not
    /// uploaded and still in the writer.
    Held,
    /// Released to the task registry (or dropped before any upload, or its upload failed).
    Released,
    /// Held when the writer was closed (or dropped) and not released by the guest
    /// itself: the host released the reference unless a returned snapshot named the file
    /// (rule "close releases only what no returned snapshot names"); see
    /// [`Model::fates`].
    AtClose,
}

/// What became of the writer's reference, as far as the model can tell now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Still held by an open writer.
    Held,
    /// Released: the file goes once nobody else needs it.
    Released,
    /// Kept by the host for a closed writer because a returned snapshot named the file:
    /// never deleted by dstl (`dstl gc` collects it).
    Abandoned,
    /// `Released` or `Abandoned`: the model cannot know which (a dropped future that may
    /// have completed before the close, an outcome delivered around the close, ...).
    Unknown,
}

#[derive(Debug, Clone)]
pub struct ChangeSet {
    pub changes: Vec<(i32, Vec<u8>)>,
    pub size: u64,
    pub upload: Upload,
    pub holding: Holding,
    /// The task that uploads it, once scheduled.
    pub task: Option<usize>,
    /// Highest checkpoint of a returned snapshot with a local handle that includes it:
    /// its local copy was registered under at least this.
    pub local_registered: Option<i64>,
    /// A discard of the writer may have dropped its local copy.
    pub local_maybe_lost: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Unknown,
    /// Some change set of the task was seen in a completed snapshot.
    SeenDone,
    Done,
    Failed,
    /// Speculative uploads only: no file of the task survives and none would have, so
    /// whether it succeeded is not known (it no longer matters to the files).
    Gone,
}

#[derive(Debug, Clone)]
pub struct Task {
    pub writer: usize,
    pub sqns: Vec<u64>,
    pub outcome: Outcome,
    /// Model time by which its outcome was certainly delivered to the writer.
    pub delivered_at: Option<u64>,
    /// Its outcome was certainly delivered before the writer was closed.
    pub delivered_before_close: bool,
}

impl Task {
    pub fn max(&self) -> u64 {
        *self.sqns.last().unwrap()
    }
}

/// A successful snapshot and the range and checkpoint it was persisted for.
#[derive(Debug, Clone)]
pub struct Snap {
    pub from: u64,
    pub to: u64,
    pub checkpoint: i64,
    pub snapshot: SnapshotResult,
}

/// What became of an accepted persist.
#[derive(Debug, Clone)]
pub enum PersistState {
    /// The driver holds its future and has not waited for it yet.
    Waiting,
    /// The driver dropped its future: the outcome is never observed.
    Dropped,
    /// Completed with this snapshot: returned to the caller (before any close).
    Returned(Box<SnapshotResult>),
    /// Failed (an upload failed, or the writer was closed first).
    Failed,
}

/// A persist the writer accepted.
#[derive(Debug, Clone)]
pub struct PersistRecord {
    pub from: u64,
    pub to: u64,
    pub checkpoint: i64,
    /// Model time of the call.
    pub issued_at: u64,
    pub state: PersistState,
    /// Confirmed while the writer was open: its files stopped being tracked.
    pub confirmed: bool,
}

/// A local path named by returned snapshots of one writer.
#[derive(Debug, Clone, Copy)]
pub struct LocalSeen {
    /// The highest checkpoint of those snapshots: the writer registered the copy under
    /// at least this.
    pub last: i64,
    /// Model time the first of them was observed: registered by then.
    pub first_seen: u64,
}

pub struct WriterModel {
    pub id: u16,
    /// The host's id (local copies are claimed per host writer id).
    pub host_id: WriterId,
    pub name: String,
    pub range: KeyGroupRange,
    pub active_sqn: u64,
    pub lowest: u64,
    /// Closed (or its handle dropped).
    pub closed: bool,
    pub active: Vec<(i32, Vec<u8>)>,
    pub active_size: u64,
    pub sets: BTreeMap<u64, ChangeSet>,
    /// The writer's `highest_failed` is at least this.
    pub certain_failed: Option<u64>,
    pub tasks: Vec<usize>,
    /// Successful snapshots, not confirmed yet, whose change sets were never truncated.
    pub completed: Vec<(usize, Snap)>,
    /// Sequence numbers that `AlreadyFailed` errors named; their tasks must fail.
    pub claimed_failures: Vec<u64>,
    /// Ranges of persists that failed with `UploadFailed`: one of their change sets must
    /// have failed.
    pub failed_ranges: Vec<(u64, u64)>,
    pub counter: u32,
    /// Every persist the writer accepted, in call order.
    pub persists: Vec<PersistRecord>,
    /// Ranges confirmed while the writer was open (their files stopped being tracked).
    pub confirmed_ranges: Vec<(u64, u64)>,
    /// Local-copy discards: (model time, bound). `confirm(cp)` discards the writer's
    /// claims last registered below `cp`, `reset(cp)` below `cp + 1`.
    pub discards: Vec<(u64, i64)>,
    /// The highest discard bound so far.
    pub discard_bound: Option<i64>,
    /// Local paths named by returned snapshots.
    pub local_seen: HashMap<String, LocalSeen>,
}

/// A local copy a writer must still claim (see [`Model::required_local`]).
#[derive(Debug, Clone)]
pub struct RequiredLocal {
    pub path: String,
    /// The snapshot's checkpoint.
    pub checkpoint: i64,
    /// The snapshot was confirmed (else the writer still holds its change sets).
    pub confirmed: bool,
    /// The highest checkpoint of the writer's snapshots naming the copy.
    pub last: i64,
}

/// Whether the host counted a file as handed out when the writer closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HandedOut {
    Yes,
    Maybe,
    No,
}

/// The files of a closed writer that returned snapshots named when it closed.
#[derive(Default)]
struct HandOuts {
    yes: HashSet<String>,
    maybe: HashSet<String>,
    /// A persist that may have completed names files the model does not know yet.
    any: bool,
}

impl HandOuts {
    fn of(&self, path: &str) -> HandedOut {
        if self.yes.contains(path) {
            HandedOut::Yes
        } else if self.any || self.maybe.contains(path) {
            HandedOut::Maybe
        } else {
            HandedOut::No
        }
    }
}

/// The model of one driver's writers.
pub struct Model {
    /// Writer ids of this driver start here (tags and file checks name writers by id).
    pub id_base: u16,
    pub writers: Vec<WriterModel>,
    pub tasks: Vec<Task>,
    /// Files a confirm stopped tracking: never deleted by dstl.
    pub protected: HashSet<String>,
    /// Snapshots confirmed while their writer was open.
    pub confirmed: Vec<(usize, Snap)>,
    pub next_checkpoint: i64,
    /// Model time: one tick per operation and per sync.
    pub clock: u64,
    pub threshold: u64,
    pub local_recovery: bool,
}

impl Model {
    pub fn new(id_base: u16, threshold: u64, local_recovery: bool) -> Self {
        Self {
            id_base,
            writers: Vec::new(),
            tasks: Vec::new(),
            protected: HashSet::new(),
            confirmed: Vec::new(),
            next_checkpoint: 1,
            clock: 0,
            threshold,
            local_recovery,
        }
    }

    /// The snapshots of writer `i` confirmed while it was open, in order.
    pub fn confirmed_of(&self, i: usize) -> impl DoubleEndedIterator<Item = &Snap> {
        self.confirmed
            .iter()
            .filter(move |(c, _)| *c == i)
            .map(|(_, s)| s)
    }

    /// The writer with tag id `id`, if this driver owns it.
    pub fn by_id(&self, id: u16) -> Option<usize> {
        let n = id.checked_sub(self.id_base)? as usize;
        (n < self.writers.len()).then_some(n)
    }

    pub fn add_writer(&mut self, host_id: WriterId, range: KeyGroupRange) -> usize {
        let id = self.id_base + self.writers.len() as u16;
        self.writers.push(WriterModel {
            id,
            host_id,
            name: format!("op-{id}"),
            range,
            active_sqn: 0,
            lowest: 0,
            closed: false,
            active: Vec::new(),
            active_size: 0,
            sets: BTreeMap::new(),
            certain_failed: None,
            tasks: Vec::new(),
            completed: Vec::new(),
            claimed_failures: Vec::new(),
            failed_ranges: Vec::new(),
            counter: 0,
            persists: Vec::new(),
            confirmed_ranges: Vec::new(),
            discards: Vec::new(),
            discard_bound: None,
            local_seen: HashMap::new(),
        });
        self.writers.len() - 1
    }

    /// The name the writer with the next id will get.
    pub fn next_name(&self) -> String {
        format!("op-{}", self.id_base + self.writers.len() as u16)
    }

    // ---- the writer's state machine ----

    pub fn rollover(&mut self, i: usize) {
        let w = &mut self.writers[i];
        if w.active.is_empty() {
            return;
        }
        let changes = std::mem::take(&mut w.active);
        w.sets.insert(
            w.active_sqn,
            ChangeSet {
                changes,
                size: w.active_size,
                upload: Upload::NotScheduled,
                holding: Holding::Held,
                task: None,
                local_registered: None,
                local_maybe_lost: false,
            },
        );
        w.active_size = 0;
        w.active_sqn += 1;
    }

    /// Rollover, then every change set from `from` on that was never scheduled goes into
    /// one new task. Returns the end of the persisted range.
    pub fn schedule(&mut self, i: usize, from: u64) -> u64 {
        self.rollover(i);
        let task = self.tasks.len();
        let w = &mut self.writers[i];
        let sqns: Vec<u64> = w
            .sets
            .range(from..)
            .filter(|(_, cs)| cs.upload == Upload::NotScheduled && cs.holding == Holding::Held)
            .map(|(&s, _)| s)
            .collect();
        if !sqns.is_empty() {
            for s in &sqns {
                let cs = w.sets.get_mut(s).unwrap();
                cs.upload = Upload::InFlight(task);
                cs.task = Some(task);
            }
            w.tasks.push(task);
            self.tasks.push(Task {
                writer: i,
                sqns,
                outcome: Outcome::Unknown,
                delivered_at: None,
                delivered_before_close: false,
            });
        }
        w.active_sqn
    }

    /// The writer's `highest_failed` is certainly at least `from`.
    pub fn must_fail(&self, i: usize, from: u64) -> bool {
        self.writers[i].certain_failed.is_some_and(|f| f >= from)
    }

    /// Some upload that may have failed covers a sequence number from `from` on.
    pub fn may_fail(&self, i: usize, from: u64) -> bool {
        self.must_fail(i, from)
            || self.writers[i].tasks.iter().any(|&t| {
                let task = &self.tasks[t];
                matches!(
                    task.outcome,
                    Outcome::Unknown | Outcome::Failed | Outcome::Gone
                ) && task.max() >= from
            })
    }

    /// An `AlreadyFailed` error for a persist (or pre-emptive persist) from `from`.
    pub fn learn_failure(&mut self, i: usize, from: u64, error: &AlreadyFailed) {
        let message = error;
        assert!(
            self.may_fail(i, from),
            "{}: AlreadyFailed for a persist from {from} although no upload from there on can have failed: {message}",
            self.writers[i].name
        );
        let failed = error.failed;
        assert!(
            failed >= from,
            "{}: AlreadyFailed for a persist from {from} names {failed}: {message}",
            self.writers[i].name
        );
        let w = &self.writers[i];
        let task = w.tasks.iter().find(|&&t| self.tasks[t].max() == failed);
        assert!(
            task.is_some_and(|&t| matches!(
                self.tasks[t].outcome,
                Outcome::Unknown | Outcome::Failed | Outcome::Gone
            )),
            "{}: AlreadyFailed names {failed}, which ends no upload that may have failed: {message}",
            w.name
        );
        let w = &mut self.writers[i];
        w.certain_failed = w.certain_failed.max(Some(failed));
        w.claimed_failures.push(failed);
    }

    /// Adds a change to the open change set; `Some(from)` if it triggers a pre-emptive
    /// persist from `from`.
    pub fn push_change(&mut self, i: usize, key_group: i32, value: Vec<u8>) -> Option<u64> {
        let threshold = self.threshold;
        let w = &mut self.writers[i];
        w.active_size += value.len() as u64;
        w.active.push((key_group, value));
        if w.active_size >= threshold {
            let from = w
                .sets
                .iter()
                .find(|(_, cs)| cs.upload == Upload::NotScheduled && cs.holding == Holding::Held)
                .map(|(&s, _)| s)
                .unwrap_or(w.active_sqn);
            Some(from)
        } else {
            None
        }
    }

    /// `truncate(to)` succeeded.
    pub fn truncate(&mut self, i: usize, to: u64) {
        let w = &mut self.writers[i];
        w.lowest = w.lowest.max(to);
        for (_, cs) in w.sets.range_mut(..to) {
            if cs.holding == Holding::Held {
                cs.holding = Holding::Released;
            }
        }
        w.completed.retain(|(_, s)| s.from >= to);
    }

    /// Applies a close (or a dropped handle) to the model: change sets `>= release_from`
    /// that the writer holds are released by the guest; the host releases the rest unless
    /// a returned snapshot named their file, which [`Model::fates`] works out.
    pub fn close(&mut self, i: usize, release_from: u64) {
        let w = &mut self.writers[i];
        w.closed = true;
        w.active.clear();
        w.active_size = 0;
        for (&sqn, cs) in w.sets.iter_mut() {
            if cs.holding != Holding::Held {
                continue;
            }
            cs.holding = match &cs.upload {
                Upload::NotScheduled | Upload::Failed | Upload::Gone => Holding::Released,
                _ if sqn >= release_from => Holding::Released,
                Upload::Done { .. } | Upload::InFlight(_) => Holding::AtClose,
            };
        }
        // `Done` means delivered: so were the other change sets of its task.
        for cs in w.sets.values() {
            if let (Upload::Done { .. }, Some(t)) = (&cs.upload, cs.task) {
                self.tasks[t].delivered_before_close = true;
            }
        }
    }

    /// A confirm or reset discarded the writer's local claims registered below `bound`.
    pub fn discard(&mut self, i: usize, bound: i64) {
        let at = self.clock;
        let w = &mut self.writers[i];
        w.discards.push((at, bound));
        w.discard_bound = w.discard_bound.max(Some(bound));
        for cs in w.sets.values_mut() {
            if cs.local_registered.is_none_or(|r| r < bound) {
                cs.local_maybe_lost = true;
            }
        }
    }

    /// A successful confirm of `snap` while the writer is open: its files stop being
    /// tracked.
    pub fn confirm(&mut self, i: usize, persist: usize, snap: Snap) {
        let w = &mut self.writers[i];
        w.persists[persist].confirmed = true;
        w.confirmed_ranges.push((snap.from, snap.to));
        for sqn in snap.from..snap.to {
            let cs = &w.sets[&sqn];
            assert_eq!(cs.holding, Holding::Held);
            let Upload::Done { path, .. } = &cs.upload else {
                panic!("{}: confirmed change set {sqn} is {:?}", w.name, cs.upload)
            };
            self.protected.insert(path.clone());
        }
        self.confirmed.push((i, snap));
    }

    /// Persist `persist` of writer `i` completed with `snapshot` (observed now): learns
    /// where its change sets went, that their uploads were delivered (before any close),
    /// and under which checkpoint their local copies were registered.
    pub fn returned(&mut self, i: usize, persist: usize, snapshot: &SnapshotResult) {
        let now = self.clock;
        let (from, to, checkpoint, issued_at) = {
            let p = &self.writers[i].persists[persist];
            (p.from, p.to, p.checkpoint, p.issued_at)
        };
        let closed = self.writers[i].closed;
        let name = self.writers[i].name.clone();
        for (entry, sqn) in snapshot.remote.entries.iter().zip(from..to) {
            let w = &mut self.writers[i];
            let cs = w.sets.get_mut(&sqn).unwrap();
            match &cs.upload {
                Upload::Done { path, offset } => assert!(
                    *path == entry.handle.path && *offset == entry.offset,
                    "{name}: change set {sqn} was delivered as {path}@{offset}, the snapshot says {}@{}",
                    entry.handle.path,
                    entry.offset
                ),
                Upload::InFlight(_) | Upload::Gone => {}
                other => panic!(
                    "{name}: snapshot [{from}, {to}) includes change set {sqn}, which is {other:?}"
                ),
            }
            let task = cs.task;
            let was_in_flight = matches!(cs.upload, Upload::InFlight(_));
            cs.upload = Upload::Done {
                path: entry.handle.path.clone(),
                offset: entry.offset,
            };
            let Some(t) = task else { continue };
            let task = &mut self.tasks[t];
            task.delivered_at = Some(task.delivered_at.map_or(now, |d| d.min(now)));
            // A persist that returned a snapshot completed before any close.
            if closed {
                task.delivered_before_close = true;
            }
            if was_in_flight {
                assert!(
                    task.outcome != Outcome::Failed,
                    "{name}: change set {sqn} is in a snapshot but its upload failed"
                );
                if task.outcome == Outcome::Unknown {
                    task.outcome = Outcome::SeenDone;
                }
            }
        }
        let w = &mut self.writers[i];
        if let Some(local) = &snapshot.local {
            // No discard since the persist started: every change set had its copy when it
            // completed.
            let discarded_since = w.discards.iter().any(|&(t, _)| t > issued_at);
            for (entry, sqn) in local.entries.iter().zip(from..to) {
                let cs = w.sets.get_mut(&sqn).unwrap();
                // The writer registers only the copies of change sets it still holds when
                // the persist completes; one released since may have been truncated before
                // that, so its registration is not known.
                if cs.holding == Holding::Released {
                    continue;
                }
                cs.local_registered = cs.local_registered.max(Some(checkpoint));
                if !discarded_since {
                    cs.local_maybe_lost = false;
                }
                let seen = w
                    .local_seen
                    .entry(entry.handle.path.clone())
                    .or_insert(LocalSeen {
                        last: checkpoint,
                        first_seen: now,
                    });
                seen.last = seen.last.max(checkpoint);
            }
        }
        w.persists[persist].state = PersistState::Returned(Box::new(snapshot.clone()));
    }

    // ---- what a close did ----

    /// The files that returned snapshots named when writer `i` closed.
    fn hand_outs(&self, i: usize) -> HandOuts {
        let w = &self.writers[i];
        let mut out = HandOuts::default();
        let before_close = |s: &u64| {
            w.sets[s]
                .task
                .is_some_and(|t| self.tasks[t].delivered_before_close)
        };
        for p in &w.persists {
            let range = p.from..p.to;
            // Per file the persist's snapshot names (or may name): whether one of its
            // change sets there was still held at the close. If so, the writer's
            // reference count of the file never dropped to zero after the snapshot was
            // returned, so the host still counted it as handed out.
            let mut named: HashMap<&str, bool> = HashMap::new();
            match &p.state {
                PersistState::Failed => continue,
                PersistState::Returned(snapshot) => {
                    for (entry, s) in snapshot.remote.entries.iter().zip(range) {
                        *named.entry(entry.handle.path.as_str()).or_default() |=
                            w.sets[&s].holding == Holding::AtClose;
                    }
                }
                PersistState::Waiting | PersistState::Dropped => {
                    if range.clone().any(|s| w.sets[&s].upload == Upload::Failed) {
                        // Never completed: one of its uploads failed.
                        continue;
                    }
                    // A dropped persist completed before the close if all its change sets
                    // were delivered before it; a waiting one is observed later.
                    let completed = matches!(p.state, PersistState::Dropped)
                        && range.clone().all(|s| before_close(&s));
                    for s in range {
                        match &w.sets[&s].upload {
                            Upload::Done { path, .. } => {
                                *named.entry(path.as_str()).or_default() |=
                                    w.sets[&s].holding == Holding::AtClose;
                            }
                            _ => out.any = true,
                        }
                    }
                    if !completed {
                        out.maybe.extend(named.into_keys().map(str::to_string));
                        continue;
                    }
                }
            }
            for (path, continuous) in named {
                if continuous {
                    out.yes.insert(path.to_string());
                } else {
                    out.maybe.insert(path.to_string());
                }
            }
        }
        out
    }

    /// The fate of every change set of every writer.
    pub fn fates(&self) -> Vec<BTreeMap<u64, Fate>> {
        (0..self.writers.len())
            .map(|i| self.writer_fates(i))
            .collect()
    }

    pub fn writer_fates(&self, i: usize) -> BTreeMap<u64, Fate> {
        let w = &self.writers[i];
        let hand_outs = w.closed.then(|| self.hand_outs(i));
        w.sets
            .iter()
            .map(|(&sqn, cs)| {
                let fate = match cs.holding {
                    Holding::Held => Fate::Held,
                    Holding::Released => Fate::Released,
                    Holding::AtClose => match &cs.upload {
                        Upload::NotScheduled | Upload::Failed => Fate::Released,
                        Upload::InFlight(_) | Upload::Gone => Fate::Unknown,
                        Upload::Done { path, .. } => {
                            match hand_outs.as_ref().unwrap().of(path) {
                                HandedOut::No => Fate::Released,
                                HandedOut::Maybe => Fate::Unknown,
                                // Delivered after the close, the guest released it.
                                HandedOut::Yes => {
                                    if cs
                                        .task
                                        .is_some_and(|t| self.tasks[t].delivered_before_close)
                                    {
                                        Fate::Abandoned
                                    } else {
                                        Fate::Unknown
                                    }
                                }
                            }
                        }
                    },
                };
                (sqn, fate)
            })
            .collect()
    }

    // ---- local copies ----

    /// The local copies writer `i` must still claim: those named by a returned snapshot
    /// that was confirmed while the writer was open (the claim is confirmed: only a
    /// discard ends it), or one of whose change sets in that copy the writer still holds
    /// (held by an open writer, or kept at close because the snapshot was returned), and
    /// that no discard of the writer reached: a discard ends claims last registered below
    /// its bound, and the writer registered the copy under at least the checkpoint of
    /// every returned snapshot naming it (`last >= D` below).
    ///
    /// With the old shared local registry this failed: writer A's `confirm(cp)` deleted
    /// every copy whose highest registration over *all* writers was below `cp`. Say A and
    /// B share a batch file; B persists checkpoint 3 (its local handle names the copy)
    /// and confirms it (B's last = 3, D = 3); A then confirms its checkpoint 5, whose
    /// snapshot names other files: the shared registry saw the copy last used by 3 < 5
    /// and deleted it although B's confirmed checkpoint 3 still needs it. Checkpoint ids
    /// come from one counter per driver, so its writers' checkpoints interleave exactly
    /// like this.
    pub fn required_local(&self, i: usize) -> Vec<RequiredLocal> {
        let w = &self.writers[i];
        let mut required = Vec::new();
        for p in &w.persists {
            let PersistState::Returned(snapshot) = &p.state else {
                continue;
            };
            let Some(local) = &snapshot.local else {
                continue;
            };
            let mut held: HashMap<&str, bool> = HashMap::new();
            for (entry, s) in local.entries.iter().zip(p.from..p.to) {
                *held.entry(entry.handle.path.as_str()).or_default() |=
                    matches!(w.sets[&s].holding, Holding::Held | Holding::AtClose);
            }
            for (path, held) in held {
                let Some(seen) = w.local_seen.get(path) else {
                    // Never certainly registered: no claim the check can rely on.
                    continue;
                };
                let last = seen.last;
                if (p.confirmed || held) && w.discard_bound.is_none_or(|d| last >= d) {
                    required.push(RequiredLocal {
                        path: path.to_string(),
                        checkpoint: p.checkpoint,
                        confirmed: p.confirmed,
                        last,
                    });
                }
            }
        }
        required
    }

    /// Whether writer `i` may still claim the local copy `local` of the file whose
    /// change sets of this writer are `sqns`: no for sure once it released them all
    /// without ever confirming one (and the copy was never handed out at a close), or once
    /// a discard ended the claim (it came after the copy was registered and every upload
    /// into it was delivered, with a bound above every checkpoint the writer could have
    /// registered it under).
    pub fn may_claim_local(
        &self,
        i: usize,
        fates: &BTreeMap<u64, Fate>,
        local: &str,
        sqns: &[u64],
    ) -> bool {
        let w = &self.writers[i];
        let released = sqns.iter().all(|s| fates[s] == Fate::Released);
        let confirmed = w
            .confirmed_ranges
            .iter()
            .any(|&(from, to)| sqns.iter().any(|s| (from..to).contains(s)));
        if released && !confirmed {
            return false;
        }
        !self.discarded_local(i, local, sqns)
    }

    fn discarded_local(&self, i: usize, local: &str, sqns: &[u64]) -> bool {
        let w = &self.writers[i];
        let Some(seen) = w.local_seen.get(local) else {
            return false;
        };
        let mut after = seen.first_seen;
        for s in sqns {
            let delivered = w.sets[s].task.and_then(|t| self.tasks[t].delivered_at);
            match delivered {
                Some(t) => after = after.max(t),
                None => return false,
            }
        }
        let Some(last) = w
            .persists
            .iter()
            .filter(|p| sqns.iter().any(|s| (p.from..p.to).contains(s)))
            .map(|p| p.checkpoint)
            .max()
        else {
            return false;
        };
        w.discards
            .iter()
            .any(|&(t, bound)| t > after && bound > last)
    }

    // ---- sync points ----

    /// After `wait_idle`: learns every outcome of this driver's uploads from what the
    /// store wrote, and checks the writers' claims about failures against them.
    pub fn resolve(&mut self, written: &[Written], on_disk: &HashSet<String>, speculative: bool) {
        self.clock += 1;
        let now = self.clock;
        // Every file holding each change set: one per successful attempt.
        let mut located: HashMap<(u16, u64), Vec<(String, u64)>> = HashMap::new();
        for file in written {
            for b in &file.blocks {
                if self.by_id(b.writer).is_some() {
                    located
                        .entry((b.writer, b.sqn))
                        .or_default()
                        .push((file.path.clone(), b.offset));
                }
            }
        }
        let fates = self.fates();
        for t in 0..self.tasks.len() {
            let task = &self.tasks[t];
            if matches!(task.outcome, Outcome::Done | Outcome::Failed) {
                continue;
            }
            let w = &self.writers[task.writer];
            let files = |s: u64| -> Vec<String> {
                let mut paths: Vec<String> = located
                    .get(&(w.id, s))
                    .map(|v| v.iter().map(|f| f.0.clone()).collect())
                    .unwrap_or_default();
                paths.sort();
                paths
            };
            // Every attempt writes the whole batch: all change sets are in the same files.
            let candidates = files(task.sqns[0]);
            for &s in &task.sqns {
                assert_eq!(
                    files(s),
                    candidates,
                    "{}: upload task {:?} was split over files",
                    w.name,
                    task.sqns
                );
            }
            assert!(
                speculative || candidates.len() <= 1,
                "{}: change sets {:?} were written {} times without any timeout: {candidates:?}",
                w.name,
                task.sqns,
                candidates.len()
            );
            let existing: Vec<&String> =
                candidates.iter().filter(|p| on_disk.contains(*p)).collect();
            assert!(
                existing.len() <= 1,
                "{}: change sets {:?}: the files of several attempts survive: {existing:?}",
                w.name,
                task.sqns
            );
            let seen = task.sqns.iter().find_map(|s| match &w.sets[s].upload {
                Upload::Done { path, .. } => Some(path.clone()),
                _ => None,
            });
            // Without timeouts a written file is the outcome. With them, late attempts
            // are written and deleted, so a file that survives is the winner; if none
            // does, the upload failed unless the writer's reference may have been
            // released.
            let held = task
                .sqns
                .iter()
                .any(|s| matches!(fates[task.writer][s], Fate::Held | Fate::Abandoned));
            let winner: Option<String> = if let Some(seen) = seen {
                assert!(
                    candidates.contains(&seen),
                    "{}: a snapshot names {seen} for change sets {:?}, written to {candidates:?}",
                    w.name,
                    task.sqns
                );
                Some(seen)
            } else if !speculative {
                candidates.first().cloned()
            } else if let Some(path) = existing.first() {
                Some((*path).clone())
            } else if held {
                None
            } else {
                // No file survives and none would: success or failure is not known.
                let (writer, sqns) = (task.writer, task.sqns.clone());
                let w = &mut self.writers[writer];
                for s in &sqns {
                    w.sets.get_mut(s).unwrap().upload = Upload::Gone;
                }
                self.tasks[t].outcome = Outcome::Gone;
                self.tasks[t].delivered_at.get_or_insert(now);
                continue;
            };
            match winner {
                Some(path) => {
                    let (writer, sqns) = (task.writer, task.sqns.clone());
                    let w = &mut self.writers[writer];
                    for s in &sqns {
                        let offset = located[&(w.id, *s)].iter().find(|f| f.0 == path).unwrap().1;
                        let cs = w.sets.get_mut(s).unwrap();
                        if let Upload::Done { path: p, offset: o } = &cs.upload {
                            assert!(
                                *p == path && *o == offset,
                                "{}: change set {s} was seen at {p}@{o} but written to {path}@{offset}",
                                w.name
                            );
                        }
                        cs.upload = Upload::Done {
                            path: path.clone(),
                            offset,
                        };
                    }
                    self.tasks[t].outcome = Outcome::Done;
                    self.tasks[t].delivered_at.get_or_insert(now);
                }
                None => {
                    let task = &self.tasks[t];
                    assert!(
                        task.outcome == Outcome::Unknown,
                        "{}: change sets {:?} are in a snapshot but their file is gone",
                        w.name,
                        task.sqns
                    );
                    let (writer, max, sqns) = (task.writer, task.max(), task.sqns.clone());
                    let w = &mut self.writers[writer];
                    for s in &sqns {
                        w.sets.get_mut(s).unwrap().upload = Upload::Failed;
                    }
                    if !w.closed && max >= w.lowest {
                        w.certain_failed = w.certain_failed.max(Some(max));
                    }
                    self.tasks[t].outcome = Outcome::Failed;
                    self.tasks[t].delivered_at.get_or_insert(now);
                }
            }
        }
        // Nothing was written that the model did not schedule.
        for ((writer, sqn), files) in &located {
            let w = &self.writers[self.by_id(*writer).unwrap()];
            let upload = w.sets.get(sqn).map(|cs| &cs.upload);
            for (path, _) in files {
                assert!(
                    matches!(
                        upload,
                        Some(Upload::Done { .. } | Upload::Failed | Upload::Gone)
                    ),
                    "{}: change set {sqn} was written to {path} but the model has it {upload:?}",
                    w.name
                );
            }
        }
        for w in &self.writers {
            for &failed in &w.claimed_failures {
                let task = w.tasks.iter().find(|&&t| self.tasks[t].max() == failed);
                assert!(
                    task.is_some_and(|&t| matches!(
                        self.tasks[t].outcome,
                        Outcome::Failed | Outcome::Gone
                    )),
                    "{}: AlreadyFailed named {failed}, but that upload did not fail",
                    w.name
                );
            }
            for &(from, to) in &w.failed_ranges {
                assert!(
                    (from..to).any(|s| matches!(w.sets[&s].upload, Upload::Failed | Upload::Gone)),
                    "{}: persist [{from}, {to}) failed with UploadFailed but none of its uploads failed",
                    w.name
                );
            }
        }
    }
}
