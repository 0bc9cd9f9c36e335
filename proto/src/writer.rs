//! The writer: a deterministic, sans-IO state machine with the semantics of Flink's
//! `FsStateChangelogWriter` (ARCHITECTURE.md, "Writer semantics"), minus its known holes
//! ("Where dstl differs from Flink", cited below as F1–F15).
//!
//! The kinds of methods, as in quinn-proto's `Connection`:
//!
//! - **inputs**: the caller's calls ([`Writer::append`], [`Writer::append_batch`],
//!   [`Writer::append_meta`], [`Writer::next_sequence_number`], [`Writer::persist`],
//!   [`Writer::truncate`], [`Writer::confirm`], [`Writer::reset`],
//!   [`Writer::truncate_and_close`], [`Writer::close`]) and the uploader's outcomes
//!   ([`Writer::on_upload_succeeded`], [`Writer::on_upload_failed`]);
//! - **outputs**: each input's return value (a persist's reply, the persists an outcome or
//!   a close completed, or a typed [`WriterError`]), and the effects it hands to the
//!   [`Effects`] sink during the call: uploads to schedule, files to release or stop
//!   tracking, local copies to register or discard, log lines. The sink answers only
//!   whether the uploader accepted a task (a typed [`Refusal`] fails the persist at once)
//!   and which local copies a discard deleted;
//! - **timers**: none. The writer reads no clock: the pre-emptive persist is driven by
//!   bytes, and the host's scheduler owns the persist delay and retries;
//! - **queries**: [`Writer::config`], [`Writer::initial_sequence_number`],
//!   [`Writer::is_closed`], [`Writer::open_bytes`], [`Writer::active_sequence_number`].
//!
//! A host drives it through the component, an export call per input, except that the
//! `persist` export first appends the changes a host buffered: a persist is one call
//! into the sandbox, and so is the delivery of an upload's outcome.
//!
//! Every effect goes through [`Effects`]; the component implements it with host imports,
//! unit tests with a recording fake. Nothing here reads a clock, spawns or does I/O.

use std::collections::{BTreeMap, HashMap};

use crate::codec::{Block, ChangeSetBuilder, META_KEY_GROUP};
use crate::error::*;
use crate::types::*;

/// Everything the writer asks of its environment.
pub trait Effects {
    /// Queues an upload; `Err` means it was not accepted and no outcome will follow.
    fn schedule(&mut self, task: UploadTask<Block>) -> Result<(), Refusal>;
    /// The writer no longer needs one change set in this file.
    fn release(&mut self, handle: &StreamHandle);
    /// Ownership of this file moved to a confirmed checkpoint.
    fn stop_tracking(&mut self, handle: &StreamHandle);
    /// A local file is used by `checkpoint`.
    fn local_register(&mut self, handle: &StreamHandle, checkpoint: CheckpointId);
    /// Deletes local files last used below `checkpoint`; returns their paths.
    fn local_discard_up_to(&mut self, checkpoint: CheckpointId) -> Vec<String>;
    /// A log line.
    fn log(&mut self, level: Level, message: &str);
}

impl WriterConfig {
    /// Checks a data change (key group -1 is refused: metadata goes through append-meta).
    /// Shared with the host, which validates appends it buffers before they reach here.
    pub fn check_change(&self, key_group: i32, len: usize) -> Result<(), WriterError> {
        if key_group < 0 {
            return Err(WriterError::InvalidArgument(
                InvalidArgument::NegativeKeyGroup(key_group),
            ));
        }
        self.check_in_range(key_group)?;
        Self::check_length(len)
    }

    fn check_in_range(&self, key_group: i32) -> Result<(), WriterError> {
        let range = self.key_group_range;
        if key_group != META_KEY_GROUP && !range.contains(key_group) {
            return Err(WriterError::InvalidArgument(InvalidArgument::OutsideRange(
                OutsideRange { key_group, range },
            )));
        }
        Ok(())
    }

    /// Checks a packed batch (`lengths[i]` bytes of `data_len` belong to
    /// `key_groups[i]`, -1 for metadata) before anything of it is appended. Shared with
    /// the host, which checks a batch before it frames it into the writer.
    pub fn check_batch(
        &self,
        key_groups: &[i32],
        lengths: &[u32],
        data_len: usize,
    ) -> Result<(), WriterError> {
        Self::check_columns(key_groups, lengths)?;
        let total: u64 = lengths.iter().map(|&l| l as u64).sum();
        if total != data_len as u64 {
            return Err(WriterError::InvalidArgument(InvalidArgument::BatchLengths(
                BatchLengths {
                    total,
                    data: data_len as u64,
                },
            )));
        }
        self.check_batch_changes(key_groups, lengths)
    }

    /// Checks a batch whose values the host's caller writes into the sandbox itself (the
    /// host frames it from these columns): [`WriterConfig::check_batch`] without data to
    /// add the lengths up against.
    pub fn check_placed(&self, key_groups: &[i32], lengths: &[u32]) -> Result<(), WriterError> {
        Self::check_columns(key_groups, lengths)?;
        self.check_batch_changes(key_groups, lengths)
    }

    /// A batch's columns agree.
    fn check_columns(key_groups: &[i32], lengths: &[u32]) -> Result<(), WriterError> {
        if key_groups.len() != lengths.len() {
            return Err(WriterError::InvalidArgument(InvalidArgument::BatchColumns(
                BatchColumns {
                    key_groups: key_groups.len() as u64,
                    lengths: lengths.len() as u64,
                },
            )));
        }
        Ok(())
    }

    /// Each change of a batch: its key group and its length.
    fn check_batch_changes(&self, key_groups: &[i32], lengths: &[u32]) -> Result<(), WriterError> {
        for (&key_group, &len) in key_groups.iter().zip(lengths) {
            self.check_batch_key_group(key_group)?;
            Self::check_length(len as usize)?;
        }
        Ok(())
    }

    /// A key group in a batch: -1 (metadata) or one of the writer's range.
    fn check_batch_key_group(&self, key_group: i32) -> Result<(), WriterError> {
        if key_group < META_KEY_GROUP {
            return Err(WriterError::InvalidArgument(
                InvalidArgument::NegativeBatchKeyGroup(key_group),
            ));
        }
        self.check_in_range(key_group)
    }

    /// Checks a framed batch (whole change-set groups, `changeCount keyGroup (length
    /// value)*`, as `append-framed` takes them) before anything of it is appended, and
    /// says what it holds. Shared with the host, which checks the bytes of a batch whose
    /// values its caller wrote straight into the sandbox.
    pub fn check_framed(&self, data: &[u8]) -> Result<crate::codec::FramedGroups, WriterError> {
        crate::codec::framed_groups(data, |key_group| self.check_batch_key_group(key_group))
            .map_err(|e| match e {
                Ok(end) => {
                    WriterError::InvalidArgument(InvalidArgument::BatchLengths(BatchLengths {
                        total: end as u64,
                        data: data.len() as u64,
                    }))
                }
                Err(refused) => refused,
            })
    }

    /// Checks a value's length against the format's `i32` lengths.
    pub fn check_length(len: usize) -> Result<(), WriterError> {
        if len > i32::MAX as usize {
            return Err(WriterError::InvalidArgument(InvalidArgument::ValueTooLong(
                len as u64,
            )));
        }
        Ok(())
    }
}

/// A persist waiting for uploads (Flink's `UploadCompletionListener`).
///
/// Unlike Flink's listener it holds no results of its own, only how many of its change
/// sets are still in flight: the results live once, in the writer (`uploaded`, and
/// `retained` for those truncated while it waits). A copy per listener made memory and
/// time grow with the square of the persists pending — each result went into every
/// listener whose range holds it — so a writer whose uploads fell behind frequent
/// checkpoints slowed down further and hit its memory limit.
struct Listener {
    /// What the completion is delivered under.
    ticket: u64,
    from: SequenceNumber,
    to: SequenceNumber,
    checkpoint: CheckpointId,
    /// Change sets of `[from, to)` whose upload has not succeeded yet.
    missing: u64,
    /// Payload bytes uploaded for this persist. Unlike Flink (F4) this counts every
    /// upload that contributes, not only the one that completes the listener.
    incremental_size: u64,
}

impl Listener {
    fn wants(&self, sqn: SequenceNumber) -> bool {
        self.from <= sqn && sqn < self.to
    }
}

struct InFlight {
    sequence_numbers: Vec<SequenceNumber>,
    checkpoint: CheckpointId,
}

/// One operator's writer.
pub struct Writer {
    config: WriterConfig,
    active_sqn: SequenceNumber,
    lowest_sqn: SequenceNumber,
    highest_sqn: SequenceNumber,
    active: ChangeSetBuilder,
    not_uploaded: BTreeMap<SequenceNumber, ChangeSetBlock<Block>>,
    /// Results of the change sets the writer holds (in `[lowest_sqn, highest_sqn)`).
    uploaded: BTreeMap<SequenceNumber, UploadResult>,
    /// Results the writer no longer holds (truncated, before or after their upload) that
    /// a pending persist still names; pruned as the persists complete.
    retained: BTreeMap<SequenceNumber, UploadResult>,
    in_flight: HashMap<u64, InFlight>,
    listeners: Vec<Listener>,
    highest_failed: Option<(SequenceNumber, UploadFailure)>,
    closed: bool,
    next_ticket: u64,
    next_task: u64,
}

impl Writer {
    /// A new writer at sequence number 0.
    pub fn new(config: WriterConfig) -> Result<Self, WriterError> {
        crate::writer_request::check_key_group_range(&config.name, config.key_group_range)
            .map_err(|_| {
                WriterError::InvalidArgument(InvalidArgument::KeyGroupRange(config.key_group_range))
            })?;
        Ok(Self {
            config,
            active_sqn: 0,
            lowest_sqn: 0,
            highest_sqn: u64::MAX,
            active: ChangeSetBuilder::default(),
            not_uploaded: BTreeMap::new(),
            uploaded: BTreeMap::new(),
            retained: BTreeMap::new(),
            in_flight: HashMap::new(),
            listeners: Vec::new(),
            highest_failed: None,
            closed: false,
            next_ticket: 0,
            next_task: 0,
        })
    }

    /// The configuration the writer was created with.
    pub fn config(&self) -> &WriterConfig {
        &self.config
    }

    /// Always 0.
    pub fn initial_sequence_number(&self) -> SequenceNumber {
        0
    }

    /// Closes the open change set if it holds anything, then returns the active number.
    /// Works after close too (the number is frozen then).
    pub fn next_sequence_number(&mut self) -> SequenceNumber {
        self.rollover();
        self.active_sqn
    }

    fn ensure_open(&self, operation: Operation) -> Result<(), WriterError> {
        if self.closed {
            return Err(WriterError::Closed(Closed::AfterClose(operation)));
        }
        Ok(())
    }

    fn check_data_key_group(&self, key_group: i32) -> Result<(), WriterError> {
        self.config.check_change(key_group, 0)
    }

    fn check_length(len: usize) -> Result<(), WriterError> {
        WriterConfig::check_length(len)
    }

    /// Appends a data change.
    pub fn append(
        &mut self,
        fx: &mut impl Effects,
        key_group: i32,
        value: &[u8],
    ) -> Result<(), WriterError> {
        self.ensure_open(Operation::Append)?;
        self.check_data_key_group(key_group)?;
        Self::check_length(value.len())?;
        self.push(fx, key_group, value)
    }

    /// Appends a metadata change.
    pub fn append_meta(&mut self, fx: &mut impl Effects, value: &[u8]) -> Result<(), WriterError> {
        self.ensure_open(Operation::AppendMeta)?;
        Self::check_length(value.len())?;
        self.push(fx, META_KEY_GROUP, value)
    }

    /// Appends packed columns; key group -1 marks metadata. Validates the whole batch
    /// before appending anything, then behaves exactly like one append per change
    /// (including where pre-emptive persists happen).
    pub fn append_batch(
        &mut self,
        fx: &mut impl Effects,
        key_groups: &[i32],
        lengths: &[u32],
        data: &[u8],
    ) -> Result<(), WriterError> {
        self.check_batch(key_groups, lengths, data.len())?;
        let mut start = 0usize;
        for (&key_group, &len) in key_groups.iter().zip(lengths) {
            let end = start + len as usize;
            self.push(fx, key_group, &data[start..end])?;
            start = end;
        }
        Ok(())
    }

    /// Like [`Writer::append_batch`], taking the batch's bytes over: the open change set
    /// keeps them as they are instead of copying each value (a component receives the
    /// batch as its own buffer).
    pub fn append_batch_owned(
        &mut self,
        fx: &mut impl Effects,
        key_groups: &[i32],
        lengths: &[u32],
        data: Vec<u8>,
    ) -> Result<(), WriterError> {
        self.check_batch(key_groups, lengths, data.len())?;
        let segment = std::rc::Rc::new(data);
        let mut start = 0usize;
        for (&key_group, &len) in key_groups.iter().zip(lengths) {
            let end = start + len as usize;
            self.active.push_shared(key_group, &segment, start..end);
            self.after_push(fx)?;
            start = end;
        }
        Ok(())
    }

    /// Appends changes handed over framed as a block frames them, one or more whole
    /// groups (`changeCount keyGroup (length value){changeCount}`), kept as they are and
    /// lent in arrival order. Checks the whole batch before appending anything.
    pub fn append_framed_owned(
        &mut self,
        fx: &mut impl Effects,
        data: Vec<u8>,
    ) -> Result<(), WriterError> {
        self.ensure_open(Operation::AppendBatch)?;
        // Everything is checked before anything is appended.
        let read = self.config.check_framed(&data)?;
        // Then the batch as it is. The threshold is checked after it: a host cuts batches
        // where the open change set reaches it (`handoff::HandOff::room`), and a batch's
        // groups are in key-group order, not in the order of the appends.
        if read.changes > 0 {
            let len = data.len();
            let segment = std::rc::Rc::new(data);
            self.active.push_framed_groups(
                &segment,
                0..len,
                read.groups,
                read.changes,
                read.payload,
            );
            self.after_push(fx)?;
        }
        Ok(())
    }

    /// Checks a whole packed batch before anything of it is appended.
    fn check_batch(
        &self,
        key_groups: &[i32],
        lengths: &[u32],
        data_len: usize,
    ) -> Result<(), WriterError> {
        self.ensure_open(Operation::AppendBatch)?;
        self.config.check_batch(key_groups, lengths, data_len)
    }

    fn push(
        &mut self,
        fx: &mut impl Effects,
        key_group: i32,
        value: &[u8],
    ) -> Result<(), WriterError> {
        self.active.push(key_group, value);
        self.after_push(fx)
    }

    /// The pre-emptive persist, once the open change set reaches the threshold.
    fn after_push(&mut self, fx: &mut impl Effects) -> Result<(), WriterError> {
        if self.active.payload_size() >= self.config.preemptive_persist_threshold {
            let from = self
                .not_uploaded
                .keys()
                .next()
                .copied()
                .unwrap_or(self.active_sqn);
            fx.log(
                Level::Debug,
                &format!(
                    "writer {}: {} open bytes reached the pre-emptive threshold {}; persisting from {from}",
                    self.config.name,
                    self.active.payload_size(),
                    self.config.preemptive_persist_threshold
                ),
            );
            self.persist_internal(fx, from, PREEMPTIVE_CHECKPOINT, None)?;
        }
        Ok(())
    }

    fn rollover(&mut self) {
        if self.active.is_empty() {
            return;
        }
        let size = self.active.payload_size();
        let block = if self.config.value_pieces {
            self.active.block()
        } else {
            self.active.encode().into()
        };
        self.not_uploaded.insert(
            self.active_sqn,
            ChangeSetBlock {
                sequence_number: self.active_sqn,
                size,
                block,
            },
        );
        self.active_sqn += 1;
    }

    /// Makes every change set from `from` on durable (with the checks of ARCHITECTURE.md, "Writer semantics", in
    /// Flink's order and with its messages).
    pub fn persist(
        &mut self,
        fx: &mut impl Effects,
        from: SequenceNumber,
        checkpoint: CheckpointId,
    ) -> Result<PersistReply, WriterError> {
        self.ensure_open(Operation::Persist)?;
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        match self.persist_internal(fx, from, checkpoint, Some(ticket))? {
            Some(snapshot) => Ok(PersistReply::Ready(snapshot)),
            None => Ok(PersistReply::Pending(ticket)),
        }
    }

    fn persist_internal(
        &mut self,
        fx: &mut impl Effects,
        from: SequenceNumber,
        checkpoint: CheckpointId,
        ticket: Option<u64>,
    ) -> Result<Option<SnapshotResult>, WriterError> {
        if let Some((failed, cause)) = &self.highest_failed
            && *failed >= from
        {
            return Err(WriterError::AlreadyFailed(AlreadyFailed {
                failed: *failed,
                cause: cause.clone(),
            }));
        }
        if self.lowest_sqn > from {
            return Err(WriterError::Truncated(Truncated {
                requested: from,
                truncated: self.lowest_sqn,
            }));
        }
        if self.active_sqn < from {
            return Err(WriterError::NotYetAppended(NotYetAppended {
                requested: from,
                appended: self.active_sqn,
            }));
        }
        self.rollover();
        let to_upload = self.not_uploaded.split_off(&from);
        let to = self.active_sqn;
        // A pre-emptive persist only uploads: nobody awaits its snapshot, so it has no
        // listener (one per pre-emptive upload made every result visit thousands of them
        // when small change sets were in flight).
        if let Some(ticket) = ticket {
            // `from` is at or above `lowest_sqn`, so every result of the range is `uploaded`.
            let mut ready = 0u64;
            for result in self.uploaded.range(from..to).map(|(_, r)| r) {
                ready += 1;
                if checkpoint != PREEMPTIVE_CHECKPOINT
                    && let Some(local) = &result.local
                {
                    fx.local_register(&local.handle, checkpoint);
                }
            }
            if to - from == ready {
                debug_assert!(to_upload.is_empty());
                return Ok(Some(self.build_snapshot(fx, from, to, 0)));
            }
            self.listeners.push(Listener {
                ticket,
                from,
                to,
                checkpoint,
                missing: to - from - ready,
                incremental_size: 0,
            });
        }
        if !to_upload.is_empty() {
            let id = self.next_task;
            self.next_task += 1;
            let sequence_numbers: Vec<_> = to_upload.keys().copied().collect();
            let task = UploadTask {
                id,
                change_sets: to_upload.into_values().collect(),
                preemptive: ticket.is_none(),
            };
            self.in_flight.insert(
                id,
                InFlight {
                    sequence_numbers: sequence_numbers.clone(),
                    checkpoint,
                },
            );
            if let Err(refusal) = fx.schedule(task) {
                // Not accepted: the change sets are gone, exactly as if the upload failed.
                self.in_flight.remove(&id);
                if ticket.is_some() {
                    self.listeners.pop();
                }
                let cause = UploadFailure::Refused(Refused {
                    change_sets: sequence_numbers.clone(),
                    refusal,
                });
                self.record_failure(&sequence_numbers, &cause);
                return Err(WriterError::UploadFailed(cause));
            }
        }
        Ok(None)
    }

    /// The results of `[from, to)`, in order: those the writer holds and those it keeps
    /// for pending persists only.
    fn results(&self, from: SequenceNumber, to: SequenceNumber) -> Vec<&UploadResult> {
        // Retained results are below `lowest_sqn` (truncated), held ones at or above it.
        let results: Vec<&UploadResult> = self
            .retained
            .range(from..to)
            .chain(self.uploaded.range(from..to))
            .map(|(_, r)| r)
            .collect();
        debug_assert!(results.is_sorted_by_key(|r| r.sequence_number));
        results
    }

    /// Drops the retained results no pending persist names any more.
    fn prune_retained(&mut self) {
        match self.listeners.iter().map(|l| l.from).min() {
            Some(from) => self.retained = self.retained.split_off(&from),
            None => self.retained.clear(),
        }
    }

    /// Whether a pending persist names change set `sqn`.
    fn wanted(&self, sqn: SequenceNumber) -> bool {
        self.listeners.iter().any(|l| l.wants(sqn))
    }

    fn build_snapshot(
        &self,
        fx: &mut impl Effects,
        from: SequenceNumber,
        to: SequenceNumber,
        incremental_size: u64,
    ) -> SnapshotResult {
        let results = self.results(from, to);
        let handle = |entries: Vec<HandleEntry>, incremental_size| {
            let state_size = entries.iter().map(|e| e.size).sum();
            ChangelogHandle {
                entries,
                key_group_range: self.config.key_group_range,
                state_size,
                incremental_size,
                storage_id: STORAGE_ID.to_string(),
            }
        };
        let remote = handle(
            results
                .iter()
                .map(|r| HandleEntry {
                    handle: r.remote.clone(),
                    offset: r.offset,
                    size: r.size,
                })
                .collect(),
            incremental_size,
        );
        let local = if self.config.local_recovery {
            let locals: Vec<HandleEntry> = results
                .iter()
                .filter_map(|r| {
                    r.local.as_ref().map(|l| HandleEntry {
                        handle: l.handle.clone(),
                        offset: l.offset,
                        size: r.size,
                    })
                })
                .collect();
            if locals.len() == results.len() {
                Some(handle(locals, 0))
            } else {
                fx.log(
                    Level::Warn,
                    &format!(
                        "writer {}: only {} of {} change sets have a local copy; the snapshot has no local handle",
                        self.config.name,
                        locals.len(),
                        results.len()
                    ),
                );
                None
            }
        } else {
            None
        };
        SnapshotResult { remote, local }
    }

    /// Mailbox: task `task` was uploaded. Returns the persists it completes.
    pub fn on_upload_succeeded(
        &mut self,
        fx: &mut impl Effects,
        task: u64,
        results: Vec<UploadResult>,
    ) -> Vec<PersistCompletion> {
        let Some(in_flight) = self.in_flight.remove(&task) else {
            fx.log(
                Level::Warn,
                &format!(
                    "writer {}: success for unknown upload task {task}; releasing its files",
                    self.config.name
                ),
            );
            self.release_all(fx, &results);
            return Vec::new();
        };
        if self.closed {
            // Flink deletes the whole (shared) file here (F3); other writers' change sets
            // may live in it, so only this writer's references are released.
            self.release_all(fx, &results);
            return Vec::new();
        }
        // Each change set of the task counts once, whatever the results say: a listener
        // that reached zero too early would hand out a snapshot with a hole.
        let given = results.len();
        let mut results: Vec<UploadResult> = results
            .into_iter()
            .filter(|r| {
                in_flight
                    .sequence_numbers
                    .binary_search(&r.sequence_number)
                    .is_ok()
            })
            .collect();
        results.sort_by_key(|r| r.sequence_number);
        results.dedup_by_key(|r| r.sequence_number);
        if results.len() != given {
            fx.log(
                Level::Warn,
                &format!(
                    "writer {}: task {task} came back with {given} results for change sets {:?}; ignoring the {} that repeat or name others",
                    self.config.name,
                    in_flight.sequence_numbers,
                    given - results.len()
                ),
            );
        }
        // A change set the task held but got no result for was not uploaded as far as
        // this writer knows: the persists that need it fail (as for a failed upload)
        // instead of waiting for a result that never comes.
        let missing: Vec<SequenceNumber> = in_flight
            .sequence_numbers
            .iter()
            .copied()
            .filter(|s| {
                results
                    .binary_search_by_key(s, |r| r.sequence_number)
                    .is_err()
            })
            .collect();
        let mut completions = Vec::new();
        if !missing.is_empty() {
            let cause = UploadFailure::NoResult(NoResult {
                task,
                change_sets: missing.clone(),
            });
            fx.log(
                Level::Warn,
                &format!("writer {}: {cause}", self.config.name),
            );
            completions = self.record_failure(&missing, &cause);
        }
        for result in &results {
            for listener in self.listeners.iter_mut() {
                if listener.wants(result.sequence_number) {
                    listener.missing -= 1;
                    listener.incremental_size += result.size;
                }
            }
        }
        let held = self.lowest_sqn..self.highest_sqn;
        for result in &results {
            let sqn = result.sequence_number;
            if held.contains(&sqn) {
                self.uploaded.insert(sqn, result.clone());
            } else if self.wanted(sqn) {
                // Truncated while in flight, yet a pending persist names it.
                self.retained.insert(sqn, result.clone());
            }
        }
        let mut i = 0;
        while i < self.listeners.len() {
            if self.listeners[i].missing > 0 {
                i += 1;
                continue;
            }
            let listener = self.listeners.remove(i);
            let snapshot =
                self.build_snapshot(fx, listener.from, listener.to, listener.incremental_size);
            // Register under the checkpoint that uses the files (F5): Flink registers
            // results under the checkpoint of the persist that started the upload, so a
            // later checkpoint that only waited on it lost its local files on confirm.
            // Change sets truncated while the persist waited were released: the writer
            // no longer holds their files, so it has nothing to register for them.
            if listener.checkpoint != PREEMPTIVE_CHECKPOINT && snapshot.local.is_some() {
                for result in self
                    .uploaded
                    .range(listener.from..listener.to)
                    .map(|(_, r)| r)
                {
                    if let Some(local) = &result.local {
                        fx.local_register(&local.handle, listener.checkpoint);
                    }
                }
            }
            completions.push(PersistCompletion {
                ticket: listener.ticket,
                outcome: Ok(snapshot),
            });
        }
        self.prune_retained();
        for result in &results {
            if in_flight.checkpoint != PREEMPTIVE_CHECKPOINT
                && let Some(local) = &result.local
            {
                fx.local_register(&local.handle, in_flight.checkpoint);
            }
            if !held.contains(&result.sequence_number) {
                // Truncated while in flight.
                self.release_all(fx, std::slice::from_ref(result));
            }
        }
        completions
    }

    /// Mailbox: task `task` failed for good (why is the host's to say: the errors name
    /// the task). Returns the persists it fails.
    pub fn on_upload_failed(&mut self, fx: &mut impl Effects, task: u64) -> Vec<PersistCompletion> {
        let Some(in_flight) = self.in_flight.remove(&task) else {
            fx.log(
                Level::Warn,
                &format!(
                    "writer {}: failure for unknown upload task {task}",
                    self.config.name
                ),
            );
            return Vec::new();
        };
        if self.closed {
            return Vec::new();
        }
        // Debug: the uploader has logged the failure and its cause (every writer of a
        // failed batch would echo it here, once per writer).
        fx.log(
            Level::Debug,
            &format!(
                "writer {}: upload task {task} of change sets {:?} failed",
                self.config.name, in_flight.sequence_numbers
            ),
        );
        self.record_failure(
            &in_flight.sequence_numbers,
            &UploadFailure::Failed(FailedTask { task }),
        )
    }

    fn record_failure(
        &mut self,
        sqns: &[SequenceNumber],
        cause: &UploadFailure,
    ) -> Vec<PersistCompletion> {
        let mut completions = Vec::new();
        self.listeners.retain(|listener| {
            if sqns.iter().any(|&s| listener.wants(s)) {
                completions.push(PersistCompletion {
                    ticket: listener.ticket,
                    outcome: Err(WriterError::UploadFailed(cause.clone())),
                });
                false
            } else {
                true
            }
        });
        self.prune_retained();
        if let Some(&max) = sqns.iter().max()
            && max >= self.lowest_sqn
            && self.highest_failed.as_ref().is_none_or(|(h, _)| max > *h)
        {
            self.highest_failed = Some((max, cause.clone()));
        }
        completions
    }

    fn release_all(&self, fx: &mut impl Effects, results: &[UploadResult]) {
        for result in results {
            fx.release(&result.remote);
            if let Some(local) = &result.local {
                fx.release(&local.handle);
            }
        }
    }

    /// A checkpoint holding `[from, to)` was confirmed: its files now belong to it. As in
    /// Flink this works after close too: the coordinator's confirm still
    /// discards the writer's older local copies.
    pub fn confirm(
        &mut self,
        fx: &mut impl Effects,
        from: SequenceNumber,
        to: SequenceNumber,
        checkpoint: CheckpointId,
    ) -> Result<(), WriterError> {
        if from > to || from > self.active_sqn || to > self.active_sqn {
            return Err(WriterError::InvalidRange(InvalidRange {
                start: from,
                end: to,
                active: self.active_sqn,
            }));
        }
        for result in self.uploaded.range(from..to).map(|(_, r)| r) {
            fx.stop_tracking(&result.remote);
        }
        for result in self.uploaded.range(from..to).map(|(_, r)| r) {
            if let Some(local) = &result.local {
                fx.stop_tracking(&local.handle);
            }
        }
        let discarded = fx.local_discard_up_to(checkpoint);
        self.forget_local_copies(&discarded);
        Ok(())
    }

    /// A checkpoint holding `[from, to)` was aborted: its local copies go. Nothing is
    /// re-uploaded and no change set is lost. Works after close too, like `confirm`.
    pub fn reset(
        &mut self,
        fx: &mut impl Effects,
        _from: SequenceNumber,
        _to: SequenceNumber,
        checkpoint: CheckpointId,
    ) -> Result<(), WriterError> {
        // Flink computes `checkpoint + 1`, which wraps at i64::MAX and discards nothing.
        let discarded = fx.local_discard_up_to(checkpoint.saturating_add(1));
        self.forget_local_copies(&discarded);
        Ok(())
    }

    /// Drops the local part of uploaded results whose local file was deleted, so later
    /// snapshots, including persists still waiting for uploads, never point at a deleted
    /// local copy (F5, the abort case).
    fn forget_local_copies(&mut self, discarded: &[String]) {
        if discarded.is_empty() {
            return;
        }
        for result in self.uploaded.values_mut().chain(self.retained.values_mut()) {
            if result
                .local
                .as_ref()
                .is_some_and(|l| discarded.contains(&l.handle.path))
            {
                result.local = None;
            }
        }
    }

    /// Drops change sets below `to` (materialization or subsumption).
    pub fn truncate(
        &mut self,
        fx: &mut impl Effects,
        to: SequenceNumber,
    ) -> Result<(), WriterError> {
        self.ensure_open(Operation::Truncate)?;
        if to > self.active_sqn {
            return Err(WriterError::InvalidArgument(
                InvalidArgument::TruncateBeyond(TruncateBeyond {
                    to,
                    active: self.active_sqn,
                }),
            ));
        }
        // Never move the lower bound back: change sets below it are gone.
        self.lowest_sqn = self.lowest_sqn.max(to);
        let kept = self.not_uploaded.split_off(&to);
        self.not_uploaded = kept;
        let kept = self.uploaded.split_off(&to);
        let dropped = std::mem::replace(&mut self.uploaded, kept);
        for (sqn, result) in dropped {
            self.release_all(fx, std::slice::from_ref(&result));
            if self.wanted(sqn) {
                self.retained.insert(sqn, result);
            }
        }
        Ok(())
    }

    /// Releases change sets from `from` on and closes; returns the persists that fail.
    pub fn truncate_and_close(
        &mut self,
        fx: &mut impl Effects,
        from: SequenceNumber,
    ) -> Result<Vec<PersistCompletion>, WriterError> {
        self.ensure_open(Operation::TruncateAndClose)?;
        self.highest_sqn = from;
        let released = self.uploaded.split_off(&from);
        for result in released.values() {
            self.release_all(fx, std::slice::from_ref(result));
        }
        self.close(fx)
    }

    /// Closes the writer. Unlike Flink (F2), every pending persist fails with `closed`
    /// instead of staying pending forever.
    pub fn close(&mut self, fx: &mut impl Effects) -> Result<Vec<PersistCompletion>, WriterError> {
        if self.closed {
            return Err(WriterError::Closed(Closed::AfterClose(Operation::Close)));
        }
        self.closed = true;
        self.active = ChangeSetBuilder::default();
        self.not_uploaded.clear();
        self.uploaded.clear();
        self.retained.clear();
        fx.log(
            Level::Debug,
            &format!(
                "writer {} closed with {} pending persists",
                self.config.name,
                self.listeners.len()
            ),
        );
        Ok(self
            .listeners
            .drain(..)
            .map(|l| PersistCompletion {
                ticket: l.ticket,
                outcome: Err(WriterError::Closed(Closed::WhilePersisting(
                    PendingPersist {
                        start: l.from,
                        end: l.to,
                        checkpoint: l.checkpoint,
                    },
                ))),
            })
            .collect())
    }

    /// True once closed.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Payload bytes of the open change set.
    pub fn open_bytes(&self) -> u64 {
        self.active.payload_size()
    }

    /// The sequence number the open change set will get.
    pub fn active_sequence_number(&self) -> SequenceNumber {
        self.active_sqn
    }

    /// Persists waiting for uploads.
    #[cfg(test)]
    fn pending_persists(&self) -> usize {
        self.listeners.len()
    }

    /// Upload results stored, once each whatever the number of persists naming them.
    #[cfg(test)]
    fn stored_results(&self) -> usize {
        self.uploaded.len() + self.retained.len()
    }
}

#[cfg(test)]
mod tests;
