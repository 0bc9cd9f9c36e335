//! A writer's state behind its handle: the sandbox instance, the persists it owes, the
//! host-side append buffer, and how every call into the guest runs.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use dstl_proto::error::{Closed, Operation};
use dstl_proto::handoff::HandOff;
use dstl_proto::types::{PersistReply, SnapshotResult, WriterConfig, WriterError};

use super::buffer::AppendBuffer;
use super::persist::{PersistFuture, Tickets, UploadFailures};
use crate::error::Error;
use crate::registry::WriterId;
use crate::sandbox::{Batch, Call, Filled, Instance, Packed, Placed, Placing, Trap};
use crate::services::Services;
use crate::sync::panic_message;
use crate::telemetry::WriterMetrics;
use crate::upload::UploadOutcome;

/// Shared between the [`super::Writer`] handle and the uploads in flight for it (as
/// their [`crate::upload::OutcomeSink`]).
pub(crate) struct WriterCore {
    pub name: String,
    pub id: WriterId,
    pub config: WriterConfig,
    pub state: Mutex<WriterState>,
    /// Upload outcomes waiting for delivery (see `mailbox.rs`).
    pub mailbox: Mutex<VecDeque<UploadOutcome>>,
    /// Set by `close` before it takes the lock: a call of this writer blocked on the
    /// in-flight limit (holding the lock) gives up, so `close` never waits behind it.
    pub closing: Arc<AtomicBool>,
    pub services: Arc<Services>,
    pub metrics: WriterMetrics,
    /// The `writer` span, entered by every call and every delivery.
    pub span: tracing::Span,
}

/// Everything a writer call may change, under one lock.
pub(crate) struct WriterState {
    /// The sandbox; `None` once it trapped or the writer was dropped.
    pub instance: Option<Instance>,
    /// Why the sandbox is gone, once it trapped.
    pub failure: Option<Trap>,
    pub book: Bookkeeping,
}

/// The host's side of a writer's state.
pub(crate) struct Bookkeeping {
    pub tickets: Tickets,
    /// Why this writer's failed upload tasks failed, for the errors that name them.
    pub failures: UploadFailures,
    /// Appends not yet handed to the guest (see [`super::Writer::append`]).
    pub buffer: AppendBuffer,
    /// When the buffer goes to the guest: exactly when an append reaches the pre-emptive
    /// threshold, as without buffering, or when it is full.
    pub hand_off: HandOff,
    /// Closed by `close` or `truncate-and-close`.
    pub closed: bool,
}

impl WriterCore {
    pub fn new(
        name: String,
        id: WriterId,
        config: WriterConfig,
        instance: Option<Instance>,
        closing: Arc<AtomicBool>,
        services: Arc<Services>,
        metrics: WriterMetrics,
    ) -> Self {
        let hand_off = HandOff::new(config.preemptive_persist_threshold);
        Self {
            span: tracing::info_span!("writer", writer = %name, id),
            name,
            id,
            config,
            state: Mutex::new(WriterState {
                instance,
                failure: None,
                book: Bookkeeping {
                    tickets: Tickets::new(metrics.clone()),
                    failures: UploadFailures::default(),
                    buffer: AppendBuffer::default(),
                    hand_off,
                    closed: false,
                },
            }),
            mailbox: Mutex::new(VecDeque::new()),
            closing,
            services,
            metrics,
        }
    }

    /// Marks the writer closing and wakes its calls blocked on the in-flight limit: they
    /// give up (their upload fails as `writer closed`), and so does every later wait.
    /// Takes no lock of the writer's, so it reaches a call that holds one.
    pub fn begin_closing(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.services.scheduler.throttle.wake();
    }

    /// Takes the writer's lock. Releasing it delivers the upload outcomes that arrived
    /// while it was held, on every path out of a call (early returns included): a
    /// delivering thread that found the lock taken left them to whoever held it.
    pub fn lock(&self) -> Locked<'_> {
        let state = match self.state.lock() {
            Ok(state) => state,
            Err(poisoned) => self.recover(poisoned),
        };
        Locked {
            core: self,
            state: Some(state),
        }
    }

    /// The guard of a lock that a panic poisoned while a thread held it: the writer's
    /// state may be half-way through a change, so the writer fails (its pending persists
    /// with it) as if its sandbox had trapped, and the lock is usable again.
    pub fn recover<'a>(
        &self,
        poisoned: PoisonError<MutexGuard<'a, WriterState>>,
    ) -> MutexGuard<'a, WriterState> {
        self.state.clear_poison();
        let mut state = poisoned.into_inner();
        if state.failure.is_none() {
            self.poison(
                &mut state,
                Trap::host_panic("a thread panicked while it held the writer"),
            );
        }
        state
    }

    /// Whether `snapshot` may be acknowledged: no file it names that the storage still
    /// tracks was written before a lapse of the job's lease, and the lease has not lapsed
    /// now (see `store::lease::LeaseWatch`). Files a confirmed checkpoint owns are no
    /// longer tracked: a manifest names them, so gc keeps them.
    pub fn acknowledge(&self, snapshot: &SnapshotResult) -> Result<(), Error> {
        let task = &self.services.registries.task;
        let generations = snapshot
            .remote
            .entries
            .iter()
            .filter_map(|entry| task.written_in(&entry.handle.path));
        self.services
            .lease
            .check(generations)
            .map_err(|lapse| Error::LeaseLapsed {
                writer: self.name.clone(),
                reason: lapse.to_string(),
            })
    }

    pub fn writer_error(&self, source: WriterError) -> Error {
        Error::Writer {
            writer: self.name.clone(),
            source,
            upload: None,
        }
    }

    /// One guest call; a trap poisons the writer, and so does a panic of the host's own
    /// code during the call (its imports, the scheduler, the bookkeeping around it): the
    /// panic stops here, as a typed error of this writer, instead of unwinding into the
    /// caller (a JVM, through JNI) with the writer's lock poisoned.
    pub fn invoke<R>(
        &self,
        state: &mut WriterState,
        f: impl FnOnce(&mut Instance, &mut Bookkeeping) -> Call<R>,
    ) -> Result<R, Error> {
        let WriterState { instance, book, .. } = state;
        let outcome = instance
            .as_mut()
            .map(|instance| catch_unwind(AssertUnwindSafe(|| f(instance, book))));
        let outcome = match outcome {
            Some(Err(panic)) => Some(Err(Trap::host_panic(&panic_message(&*panic)))),
            Some(Ok(call)) => Some(call),
            None => None,
        };
        match outcome {
            None => Err(self.trapped_error(state)),
            Some(Ok(Ok(value))) => Ok(value),
            Some(Ok(Err(e))) => {
                let upload = book.failures.cause_of(&e);
                Err(Error::from_guest(&self.name, e, upload))
            }
            Some(Err(trap)) => {
                self.poison(state, trap);
                Err(self.trapped_error(state))
            }
        }
    }

    /// Hands buffered appends to the guest, as any call does: upload outcomes that
    /// arrived first are delivered first.
    pub fn hand_over(&self, state: &mut WriterState) -> Result<(), Error> {
        let _span = self.span.enter();
        self.drain(state);
        let result = self.flush(state);
        self.drain(state);
        result
    }

    /// Hands buffered appends to the guest as one batch.
    pub fn flush(&self, state: &mut WriterState) -> Result<(), Error> {
        if state.book.buffer.is_empty() {
            return Ok(());
        }
        self.with_buffer(state, |state, buffer| {
            if buffer.holds_owned() {
                self.with_owned(buffer, |placing| {
                    self.append_placed(state, &buffer.key_groups, &buffer.lengths, placing)
                })
            } else {
                self.append_batch(state, buffer.packed())
            }
        })
    }

    /// A persist that takes the buffered appends along.
    pub fn persist_buffered(
        &self,
        state: &mut WriterState,
        from: u64,
        checkpoint: i64,
    ) -> Result<PersistFuture, Error> {
        self.with_buffer(state, |state, buffer| {
            if buffer.holds_owned() {
                self.with_owned(buffer, |placing| {
                    let (key_groups, lengths) = (&buffer.key_groups, &buffer.lengths);
                    self.persist_placed(state, key_groups, lengths, placing, from, checkpoint)
                })
            } else {
                self.persist(state, buffer.packed(), from, checkpoint)
            }
        })
    }

    /// Runs `call` with the placing of `buffer`'s owned values, checked as any placed
    /// batch is.
    fn with_owned<R>(&self, buffer: &AppendBuffer, call: impl FnOnce(Placing<'_>) -> R) -> R {
        let mut place = |out: &mut [u8], offsets: &[u32]| buffer.place_owned(out, offsets);
        let check = |data: &[u8]| self.config.check_framed(data);
        call(Placing::new(&mut place, &check))
    }

    /// Runs `call` on the buffered appends, taken out of `state`; the buffer's allocations
    /// are kept for the next batch.
    fn with_buffer<R>(
        &self,
        state: &mut WriterState,
        call: impl FnOnce(&mut WriterState, &AppendBuffer) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut buffer = std::mem::take(&mut state.book.buffer);
        let result = call(state, &buffer);
        buffer.clear();
        state.book.buffer = buffer;
        result
    }

    /// Appends `batch`: checked here, then framed into the guest (`append-framed`) in
    /// as many calls as it takes to cut it where the open change set reaches the
    /// pre-emptive threshold, so the writer uploads at the same append as it would take
    /// them one by one. Each answer goes to the hand-off rule.
    pub fn append_batch(&self, state: &mut WriterState, batch: Packed<'_>) -> Result<(), Error> {
        let result = self.invoke(state, |instance, book| {
            append_framed(instance, book, &self.config, batch, false).map(|r| r.map(drop))
        });
        self.appended(&result, batch);
        result
    }

    /// Appends a batch whose values its caller writes straight into the guest
    /// (`append-framed`), checked here first, in one call: such a caller counts down the
    /// writer's budget, so the batch ends where the open change set reaches the
    /// threshold, and needs no cut.
    pub fn append_placed(
        &self,
        state: &mut WriterState,
        key_groups: &[i32],
        lengths: &[u32],
        placing: Placing<'_>,
    ) -> Result<(), Error> {
        let result = self.invoke(state, |instance, book| {
            let batch = match self.check_placed(book, key_groups, lengths, &placing) {
                Ok(batch) => batch,
                Err(e) => return Ok(Err(e)),
            };
            let open = instance.append_batch(batch)?;
            book.hand_off.handed_over(open.as_ref().copied());
            Ok(open.map(drop))
        });
        self.placed(result, placing)
    }

    /// One `persist-framed` call of a batch whose values its caller writes (see
    /// [`WriterCore::append_placed`]): the guest's reply as a future.
    pub fn persist_placed(
        &self,
        state: &mut WriterState,
        key_groups: &[i32],
        lengths: &[u32],
        placing: Placing<'_>,
        from: u64,
        checkpoint: i64,
    ) -> Result<PersistFuture, Error> {
        let result = self.invoke(state, |instance, book| {
            let batch = match self.check_placed(book, key_groups, lengths, &placing) {
                Ok(batch) => batch,
                Err(e) => return Ok(Err(e)),
            };
            let reply = instance.persist(batch, from, checkpoint)?;
            Ok(self.persist_reply(book, reply))
        });
        self.placed(result, placing)
    }

    /// The batch whose values `placing` writes, after the guest's checks, in its order,
    /// before any of it reaches the guest.
    fn check_placed<'a>(
        &self,
        book: &Bookkeeping,
        key_groups: &'a [i32],
        lengths: &'a [u32],
        placing: &'a Placing<'_>,
    ) -> Result<Batch<'a>, WriterError> {
        if book.closed {
            return Err(closed_to_batches());
        }
        self.config.check_placed(key_groups, lengths)?;
        Ok(Batch::Placed(Placed {
            key_groups,
            lengths,
            place: placing,
        }))
    }

    /// The outcome of a call that took `placing`: the host's own verdict on what the
    /// caller wrote comes first (the guest, which checks it too, appended nothing of a
    /// batch the host refuses), then the guest's answer.
    fn placed<R>(&self, result: Result<R, Error>, placing: Placing<'_>) -> Result<R, Error> {
        match placing.placed() {
            Some(Filled::Groups(read)) => {
                let value = result?;
                if read.changes > 0 {
                    self.metrics.appended(read.changes, read.payload as usize);
                }
                Ok(value)
            }
            Some(Filled::Refused(refused)) => Err(self.writer_error(refused)),
            Some(Filled::NotWritten) => Err(Error::InvalidArgument(format!(
                "writer {}: the caller did not write the values of its batch; nothing of it \
                 was appended",
                self.name
            ))),
            // Never lowered: the call failed before it reached the guest.
            None => result,
        }
    }

    /// One `persist` call, which appends `batch` first: the guest's reply as a future.
    pub fn persist(
        &self,
        state: &mut WriterState,
        batch: Packed<'_>,
        from: u64,
        checkpoint: i64,
    ) -> Result<PersistFuture, Error> {
        let result = self.invoke(state, |instance, book| {
            // Parts of the batch before the threshold's cut go first; the rest goes along.
            let rest = match batch.key_groups.is_empty() {
                true => Ok(batch),
                false => append_framed(instance, book, &self.config, batch, true)?,
            };
            let reply = match rest {
                Ok(rest) => instance.persist(Batch::Packed(rest), from, checkpoint)?,
                Err(e) => Err(e),
            };
            Ok(self.persist_reply(book, reply))
        });
        self.appended(&result, batch);
        result
    }

    /// A persist's reply, answered to the hand-off rule, as the caller's future.
    fn persist_reply(
        &self,
        book: &mut Bookkeeping,
        reply: Result<PersistReply, WriterError>,
    ) -> Result<PersistFuture, WriterError> {
        book.hand_off.persisted(reply.as_ref().err());
        reply.map(|reply| match reply {
            PersistReply::Ready(snapshot) => {
                PersistFuture::ready(self.acknowledge(&snapshot).map(|()| snapshot))
            }
            PersistReply::Pending(ticket) => book.tickets.wait_for(&self.name, ticket),
        })
    }

    /// Counts `batch` as appended once the call that took it succeeded: once per batch,
    /// not on the append path.
    fn appended<R>(&self, result: &Result<R, Error>, batch: Packed<'_>) {
        if result.is_ok() && !batch.key_groups.is_empty() {
            self.metrics
                .appended(batch.key_groups.len(), batch.data.len());
        }
    }

    /// The sandbox trapped: drop it and fail every pending persist with the cause.
    pub fn poison(&self, state: &mut WriterState, trap: Trap) {
        tracing::error!(writer = %self.name, kind = ?trap.kind, cause = %trap.cause, "writer sandbox trapped");
        self.metrics.trapped();
        self.abandon(state);
        state.failure = Some(trap);
        let error = self.trapped_error(state);
        state.book.tickets.fail_all(&error);
    }

    /// Drops the sandbox. The guest's references to uploaded files die with it: those no
    /// returned snapshot names are released, so files that no one else needs (no other
    /// writer, no confirmed checkpoint) are deleted; those of returned snapshots stay
    /// tracked, since a coordinator may have completed that checkpoint already.
    pub fn abandon(&self, state: &mut WriterState) {
        if let Some(mut instance) = state.instance.take() {
            instance.release_unreturned();
        }
    }

    /// The error of any call once the sandbox is gone.
    pub fn trapped_error(&self, state: &WriterState) -> Error {
        match &state.failure {
            Some(trap) => Error::Trapped {
                writer: self.name.clone(),
                kind: trap.kind,
                cause: trap.cause.clone(),
            },
            None => Error::dropped(&self.name),
        }
    }
}

/// The writer's locked state; see [`WriterCore::lock`].
pub(crate) struct Locked<'a> {
    core: &'a WriterCore,
    /// `None` only while dropping.
    state: Option<MutexGuard<'a, WriterState>>,
}

impl Deref for Locked<'_> {
    type Target = WriterState;

    fn deref(&self) -> &WriterState {
        self.state.as_deref().expect("held until dropped")
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut WriterState {
        self.state.as_deref_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Unlock first, then look at the mailbox: an outcome queued before the unlock by
        // a thread whose `try_lock` failed is seen here (see `mailbox.rs`).
        drop(self.state.take());
        self.core.pump();
    }
}

/// `batch` framed into the guest (`append-framed`), checked first, in as many calls as
/// it takes to cut it where the open change set reaches the pre-emptive threshold (see
/// `WriterCore::append_batch`); each answer goes to the hand-off rule. With `keep_last`,
/// the last part is not sent but answered, for a `persist-framed` to take along.
fn append_framed<'a>(
    instance: &mut Instance,
    book: &mut Bookkeeping,
    config: &WriterConfig,
    batch: Packed<'a>,
    keep_last: bool,
) -> Call<Packed<'a>> {
    // The guest's checks, in its order, before any part of the batch reaches it.
    if book.closed {
        return Ok(Err(closed_to_batches()));
    }
    if let Err(e) = config.check_batch(batch.key_groups, batch.lengths, batch.data.len()) {
        return Ok(Err(e));
    }
    let (mut first, mut start) = (0usize, 0usize);
    loop {
        // The cut: the change that brings the open bytes to the threshold.
        let room = book.hand_off.room();
        let (mut bytes, mut end, mut data_end) = (0u64, first, start);
        while end < batch.lengths.len() {
            let len = batch.lengths[end] as usize;
            bytes += len as u64;
            data_end += len;
            end += 1;
            if bytes >= room {
                break;
            }
        }
        let part = Packed::new(
            &batch.key_groups[first..end],
            &batch.lengths[first..end],
            &batch.data[start..data_end],
        );
        if keep_last && end == batch.lengths.len() {
            return Ok(Ok(part));
        }
        let open = instance.append_batch(Batch::Packed(part))?;
        book.hand_off.handed_over(open.as_ref().copied());
        if let Err(e) = open {
            return Ok(Err(e));
        }
        (first, start) = (end, data_end);
        // An empty batch is still one call: the writer answers it (after close, an error).
        if first >= batch.lengths.len() {
            return Ok(Ok(Packed::new(&[], &[], &[])));
        }
    }
}

/// What a closed writer answers a batch.
fn closed_to_batches() -> WriterError {
    WriterError::Closed(Closed::AfterClose(Operation::AppendBatch))
}
