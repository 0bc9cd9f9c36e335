//! One operator's writer: a sandboxed component instance ([`crate::sandbox`]), the
//! host-side append buffer ([`buffer`]), the mailbox that delivers upload outcomes
//! ([`mailbox`]), and persists as futures ([`persist`]).

mod buffer;
mod core;
mod mailbox;
mod persist;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dstl_proto::codec::META_KEY_GROUP;
use dstl_proto::error::{Closed, Operation};
use dstl_proto::handoff::{Append, Budget};
use dstl_proto::types::{PersistCompletion, WriterConfig, WriterError};

use self::buffer::AppendBuffer;
use self::core::{Bookkeeping, WriterCore, WriterState};
pub use self::persist::PersistFuture;
use crate::error::Error;
use crate::registry::WriterId;
use crate::sandbox::{
    Call, Instance, Limits, Packed, Placing, Runtime, WriterComponent, WriterLinks,
};
use crate::services::Services;
use crate::telemetry::PersistReturned;
use crate::upload::OutcomeSink;

/// Announces a [`Writer`]'s close ahead of the close itself; from
/// [`Writer::close_signal`]. Holds no reference that keeps the writer alive.
#[derive(Clone)]
pub struct CloseSignal {
    core: Weak<WriterCore>,
}

impl CloseSignal {
    /// Marks the writer closing: its calls that wait for upload capacity give up at once
    /// (their upload fails as `writer closed`), and so does every later wait, so only a
    /// close should follow. Never blocks; does nothing once the writer is gone.
    pub fn raise(&self) {
        if let Some(core) = self.core.upgrade() {
            core.begin_closing();
        }
    }
}

/// Per-writer sandbox settings for [`crate::ChangelogStorage::create_writer_with`]; the
/// storage's settings where unset. Checked when the writer is created.
///
/// ```
/// let options = dstl::WriterOptions::new()
///     .memory_limit(16 << 20)
///     .call_timeout(std::time::Duration::from_secs(1));
/// ```
#[derive(Debug, Clone, Default)]
pub struct WriterOptions {
    pub(crate) memory_limit: Option<u64>,
    pub(crate) call_timeout: Option<Duration>,
    pub(crate) component: Option<WriterComponent>,
}

impl WriterOptions {
    /// The storage's settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Caps this writer's linear memory at `bytes` (from 2 MiB up to the storage's
    /// `dstl.writer.memory-limit`); growth past it traps the writer.
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// The CPU time one call into this writer's sandbox may use (at least 1 ms).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// Runs this writer on another build of the writer component
    /// ([`crate::ChangelogStorage::compile_component`]; it must implement the same WIT
    /// world) instead of the one built into dstl.
    pub fn component(mut self, component: WriterComponent) -> Self {
        self.component = Some(component);
        self
    }
}

/// One operator's writer. Calls are serialized; the handle can be shared across threads.
pub struct Writer {
    core: Arc<WriterCore>,
}

impl Writer {
    pub(crate) fn create(
        services: Arc<Services>,
        runtime: &Runtime,
        id: WriterId,
        config: WriterConfig,
        options: WriterOptions,
    ) -> Result<Self, Error> {
        let limits = Limits {
            memory: options
                .memory_limit
                .unwrap_or(services.config.writer_memory_limit),
            call_timeout: options
                .call_timeout
                .unwrap_or(services.config.writer_call_timeout),
        };
        let pre = match &options.component {
            Some(component) => &component.pre,
            None => &runtime.pre,
        };
        let name = config.name.clone();
        let metrics = services.writer_labels.writer(&name);
        let mut setup_error = None;
        let closing = Arc::new(AtomicBool::new(false));
        let core = Arc::new_cyclic(|this: &Weak<WriterCore>| {
            let links = WriterLinks {
                sink: this.clone() as Weak<dyn OutcomeSink>,
                closing: closing.clone(),
                preemptive_uploads: metrics.preemptive_uploads(),
            };
            let instance = Instance::new(pre, services.clone(), links, id, &config, limits)
                .map_err(|trap| setup_error = Some(trap))
                .ok();
            WriterCore::new(
                name.clone(),
                id,
                config.clone(),
                instance,
                closing,
                services.clone(),
                metrics,
            )
        });
        if let Some(trap) = setup_error {
            return Err(Error::Trapped {
                writer: name,
                kind: trap.kind,
                cause: trap.cause,
            });
        }
        Ok(Self { core })
    }

    /// How much a caller that gathers its own batches (for [`Writer::append_batch`] or
    /// [`Writer::append_placed`]) may gather before it hands them over: the one hand-off rule of every host
    /// (`dstl_proto::handoff`), which hands a batch over exactly when the writer would
    /// persist it pre-emptively unbatched. Valid until the next call of this writer.
    pub fn budget(&self) -> Budget {
        self.core.lock().book.hand_off.budget()
    }

    /// The operator name the writer was created with.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The writer's id in its storage (local copies are owned per writer id).
    pub fn id(&self) -> WriterId {
        self.core.id
    }

    /// Appends a data change for `key_group`.
    ///
    /// Small changes are collected on the host side and handed to the writer as one
    /// packed batch before any other operation of this writer (and whenever 256 KiB or
    /// 4096 changes have gathered), so the order of operations is what the guest sees.
    /// Bad arguments and a closed or failed writer are reported at once; what the
    /// guest itself reports for a batch (a pre-emptive persist refused because an earlier
    /// upload failed) is reported by the call that hands the batch over.
    pub fn append(&self, key_group: i32, value: &[u8]) -> Result<(), Error> {
        let check = self.core.config.check_change(key_group, value.len());
        self.buffered(key_group, Value::Copied(value), Operation::Append, check)
    }

    /// Appends a data change for `key_group` whose bytes the caller gives away: the
    /// writer keeps `value` itself until it hands the batch over, and copies it then
    /// straight into the sandbox. So the value is copied twice on its way to the file
    /// (into the sandbox, out), where [`Writer::append`], which may only borrow the bytes
    /// for the call, copies them once more into the host's buffer. A `Vec<u8>` or
    /// `Bytes` turns into `Bytes` without a copy. Buffered, checked and reported as
    /// [`Writer::append`]; appends of both kinds keep their order. Keeping a value costs
    /// more than copying a small one: below about 1 KiB, [`Writer::append`] is faster
    /// (BENCHMARKS.md, "Owned values").
    pub fn append_owned(&self, key_group: i32, value: impl Into<Bytes>) -> Result<(), Error> {
        let value = value.into();
        let check = self.core.config.check_change(key_group, value.len());
        self.buffered(key_group, Value::Owned(value), Operation::Append, check)
    }

    /// Appends a metadata change (buffered like [`Writer::append`]).
    pub fn append_meta(&self, value: &[u8]) -> Result<(), Error> {
        let check = WriterConfig::check_length(value.len());
        self.buffered(
            META_KEY_GROUP,
            Value::Copied(value),
            Operation::AppendMeta,
            check,
        )
    }

    /// Checks in the guest's order: a failed or closed writer first, then `check`.
    fn buffered(
        &self,
        key_group: i32,
        value: Value<'_>,
        operation: Operation,
        check: Result<(), WriterError>,
    ) -> Result<(), Error> {
        let core = &self.core;
        let mut state = core.lock();
        if state.instance.is_none() {
            return Err(core.trapped_error(&state));
        }
        if state.book.closed {
            return Err(core.writer_error(WriterError::Closed(Closed::AfterClose(operation))));
        }
        check.map_err(|e| core.writer_error(e))?;
        if state
            .book
            .buffer
            .holds_other_kind(matches!(value, Value::Owned(_)))
        {
            // What is buffered goes first, so the order of appends holds.
            core.hand_over(&mut state)?;
        }
        match state.book.hand_off.append(value.len()) {
            Append::Alone => {
                drop(state);
                // Large values gain nothing from batching: hand them over directly.
                let length = [value.len() as u32];
                return match value {
                    Value::Copied(value) => self.append_batch(&[key_group], &length, value),
                    Value::Owned(value) => {
                        self.append_placed(&[key_group], &length, |out, offsets| {
                            buffer::place_values(out, offsets, std::iter::once(&value[..]))
                        })
                    }
                };
            }
            Append::Buffer => {
                value.push_to(&mut state.book.buffer, key_group);
                return Ok(());
            }
            Append::BufferAndHandOver => value.push_to(&mut state.book.buffer, key_group),
        }
        core.hand_over(&mut state)
    }

    /// Appends many changes at once as packed columns: `lengths[i]` bytes of `data`
    /// belong to `key_groups[i]` (-1 for metadata). A malformed batch appends nothing; a
    /// batch whose change triggers a pre-emptive persist that fails (an earlier upload of
    /// its change sets failed) appends up to and including that change, exactly as the
    /// same appends one by one would.
    pub fn append_batch(
        &self,
        key_groups: &[i32],
        lengths: &[u32],
        data: &[u8],
    ) -> Result<(), Error> {
        let batch = Packed::new(key_groups, lengths, data);
        self.locked(|core, state| {
            core.flush(state)?;
            core.append_batch(state, batch)
        })
    }

    /// Appends many changes at once, as [`Writer::append_batch`] does, whose values the
    /// caller writes straight into the writer's sandbox: the copy of a value into the
    /// sandbox is the caller's own, and there is no other before the file's (with
    /// [`Writer::append`] there is one more, into the host's append buffer). For callers
    /// that keep their changes until they hand them over, as the Flink plugin does.
    ///
    /// `lengths[i]` bytes belong to `key_groups[i]` (-1 for metadata). The host frames the
    /// batch in memory the writer allocated for it, then calls `place` with those bytes,
    /// valid only during the call, and `offsets`: change `i`'s value goes into the
    /// `lengths[i]` bytes at `offsets[i]`. `place` writes every value there and nothing
    /// else, or returns false if it cannot.
    ///
    /// The batch is checked whole before anything of it is appended, as by
    /// [`Writer::append_batch`]: bad columns, a key group below -1 or outside the writer's
    /// range, bytes written beyond the values, or a `place` that gave up
    /// ([`Error::InvalidArgument`]) append nothing. The writer checks the pre-emptive
    /// threshold after the batch, so a caller that wants uploads to start where they would
    /// with one append per change hands batches over as [`Writer::budget`] says.
    pub fn append_placed(
        &self,
        key_groups: &[i32],
        lengths: &[u32],
        place: impl FnOnce(&mut [u8], &[u32]) -> bool,
    ) -> Result<(), Error> {
        let mut place = once(place);
        self.locked(|core, state| {
            core.flush(state)?;
            let check = |data: &[u8]| core.config.check_framed(data);
            core.append_placed(state, key_groups, lengths, Placing::new(&mut place, &check))
        })
    }

    /// Appends a batch whose values the caller writes as for [`Writer::append_placed`],
    /// then persists as [`Writer::persist`], in one call into the sandbox. A batch that is
    /// refused fails the call and persists nothing.
    pub fn append_placed_and_persist(
        &self,
        key_groups: &[i32],
        lengths: &[u32],
        place: impl FnOnce(&mut [u8], &[u32]) -> bool,
        from: u64,
        checkpoint: i64,
    ) -> Result<PersistFuture, Error> {
        let mut place = once(place);
        let started = Instant::now();
        let result = self.locked(|core, state| {
            core.flush(state)?;
            let check = |data: &[u8]| core.config.check_framed(data);
            let placing = Placing::new(&mut place, &check);
            core.persist_placed(state, key_groups, lengths, placing, from, checkpoint)
        });
        self.persisted(started, &result);
        result
    }

    /// Always 0.
    pub fn initial_sequence_number(&self) -> Result<u64, Error> {
        self.call(|instance, _| instance.initial_sequence_number())
    }

    /// Closes the open change set (if non-empty) and returns the next sequence number.
    pub fn next_sequence_number(&self) -> Result<u64, Error> {
        self.call(|instance, book| {
            book.hand_off.rolled_over();
            instance.next_sequence_number()
        })
    }

    /// Makes every change set from `from` on durable for `checkpoint`. The returned
    /// future completes when the uploads it needs have landed (or failed).
    ///
    /// Each pending persist's snapshot names every change set from its `from` on, so k
    /// persists pending from the same `from` name O(k²) change sets, built in the sandbox
    /// when they complete. Keep the number pending bounded, as Flink's checkpoint
    /// coordinator does (`execution.checkpointing.max-concurrent-checkpoints`), or
    /// uploads that fall behind frequent persists can take the writer to its memory
    /// limit (`dstl.writer.memory-limit`), where it traps.
    pub fn persist(&self, from: u64, checkpoint: i64) -> Result<PersistFuture, Error> {
        self.persist_with(None, from, checkpoint)
    }

    /// Appends the changes packed as for [`Writer::append_batch`], then persists as
    /// [`Writer::persist`], in one call into the sandbox: for a caller that packs its
    /// appends itself, whose batch goes along with the persist. A failed append fails the
    /// call and persists nothing.
    pub fn append_batch_and_persist(
        &self,
        key_groups: &[i32],
        lengths: &[u32],
        data: &[u8],
        from: u64,
        checkpoint: i64,
    ) -> Result<PersistFuture, Error> {
        let batch = Packed::new(key_groups, lengths, data);
        self.persist_with(Some(batch), from, checkpoint)
    }

    /// Calls into the writer's sandbox so far (deliveries of upload outcomes included), for
    /// dstl's tests of what one call costs (crate feature `test-util`; not a stable API).
    #[cfg(feature = "test-util")]
    pub fn guest_calls(&self) -> u64 {
        let state = self.core.lock();
        state.instance.as_ref().map_or(0, |instance| instance.calls)
    }

    /// A persist that takes the buffered appends along, or `batch` after them.
    fn persist_with(
        &self,
        batch: Option<Packed<'_>>,
        from: u64,
        checkpoint: i64,
    ) -> Result<PersistFuture, Error> {
        let started = Instant::now();
        let result = self.locked(|core, state| match batch {
            None => core.persist_buffered(state, from, checkpoint),
            Some(batch) => {
                core.flush(state)?;
                core.persist(state, batch, from, checkpoint)
            }
        });
        self.persisted(started, &result);
        result
    }

    /// Counts a persist that started at `started` and returned `result`.
    fn persisted(&self, started: Instant, result: &Result<PersistFuture, Error>) {
        self.core.metrics.persisted(
            started,
            match result {
                Ok(future) if future.is_immediate() => PersistReturned::Completed,
                Ok(_) => PersistReturned::Pending,
                Err(_) => PersistReturned::Failed,
            },
        );
    }

    /// Drops change sets below `to`.
    pub fn truncate(&self, to: u64) -> Result<(), Error> {
        self.call(|instance, _| instance.truncate(to))
    }

    /// A checkpoint holding `[from, to)` was confirmed. Also after close, where it still
    /// discards the writer's older local copies.
    pub fn confirm(&self, from: u64, to: u64, checkpoint: i64) -> Result<(), Error> {
        self.call(|instance, _| instance.confirm(from, to, checkpoint))
    }

    /// A checkpoint holding `[from, to)` was aborted.
    pub fn reset(&self, from: u64, to: u64, checkpoint: i64) -> Result<(), Error> {
        self.call(|instance, _| instance.reset(from, to, checkpoint))
    }

    /// Releases change sets from `from` on and closes; pending persists fail with `closed`.
    pub fn truncate_and_close(&self, from: u64) -> Result<(), Error> {
        self.closing(|instance| instance.truncate_and_close(from))
    }

    /// Closes the writer; pending persists fail with `closed`. Files no returned snapshot
    /// names are released; those of returned snapshots stay for a later confirm (or for
    /// `dstl gc`). Uploads still in flight are released when they land.
    pub fn close(&self) -> Result<(), Error> {
        self.closing(|instance| instance.close())
    }

    /// A handle that announces this writer's close from another thread
    /// ([`CloseSignal::raise`]), for an embedding that serializes the writer's calls
    /// under a lock of its own: a call blocked on the in-flight limit holds that lock,
    /// so the thread that wants to close must wake it before it can take the lock.
    pub fn close_signal(&self) -> CloseSignal {
        CloseSignal {
            core: Arc::downgrade(&self.core),
        }
    }

    /// Why the sandbox failed, if it trapped.
    pub fn failure(&self) -> Option<String> {
        let state = self.core.lock();
        state.failure.as_ref().map(|trap| trap.cause.clone())
    }

    /// A call that closes the writer: the writer is marked closed under the same lock, so
    /// no append can slip in between and be accepted only to be lost.
    fn closing(
        &self,
        f: impl FnOnce(&mut Instance) -> Call<Vec<PersistCompletion>>,
    ) -> Result<(), Error> {
        let core = &self.core;
        // A call of this writer blocked on the in-flight limit holds the lock: make it
        // give up (its guest sees the schedule fail) instead of waiting behind it.
        core.begin_closing();
        let name = &core.name;
        self.call(|instance, book| {
            let completions = match f(instance)? {
                Ok(completions) => completions,
                Err(e) => return Ok(Err(e)),
            };
            book.closed = true;
            book.tickets
                .resolve(name, completions, &book.failures, &|snapshot| {
                    core.acknowledge(snapshot)
                });
            instance.release_unreturned();
            Ok(Ok(()))
        })
    }

    /// Runs one guest call under the writer's lock: delivers waiting upload outcomes and
    /// buffered appends first, and outcomes that arrived meanwhile after.
    fn call<R>(
        &self,
        f: impl FnOnce(&mut Instance, &mut Bookkeeping) -> Call<R>,
    ) -> Result<R, Error> {
        self.locked(|core, state| {
            core.flush(state)?;
            core.invoke(state, f)
        })
    }

    /// Runs `f` under the writer's lock and span, with the upload outcomes that arrived
    /// before and during it delivered around it.
    fn locked<R>(
        &self,
        f: impl FnOnce(&WriterCore, &mut WriterState) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let core = &self.core;
        let _span = core.span.enter();
        let mut state = core.lock();
        core.drain(&mut state);
        let result = f(core, &mut state);
        core.drain(&mut state);
        result
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Drop the sandbox now, releasing the files no returned snapshot names; those of
        // returned snapshots stay tracked, as after Flink's close: a checkpoint the
        // coordinator knows about may still need them (`dstl gc` collects true orphans).
        // Uploads still in flight find the writer gone and release their files
        // themselves, and pending persists see the writer dropped.
        let core = &self.core;
        let mut state = core.lock();
        core.abandon(&mut state);
        state.book.tickets.clear();
        // Outcomes posted while this held the lock: with no sandbox left, delivering them
        // releases their files (as the unlock does for those posted later).
        core.drain(&mut state);
    }
}

/// A value for the append buffer: borrowed for the call (copied into the buffer), or
/// given away (kept as it is).
enum Value<'a> {
    Copied(&'a [u8]),
    Owned(Bytes),
}

impl Value<'_> {
    fn len(&self) -> usize {
        match self {
            Value::Copied(value) => value.len(),
            Value::Owned(value) => value.len(),
        }
    }

    fn push_to(self, buffer: &mut AppendBuffer, key_group: i32) {
        match self {
            Value::Copied(value) => buffer.push(key_group, value),
            Value::Owned(value) => buffer.push_owned(key_group, value),
        }
    }
}

/// `place` as an `FnMut` (the lowering holds it as one), false when called again.
fn once(place: impl FnOnce(&mut [u8], &[u32]) -> bool) -> impl FnMut(&mut [u8], &[u32]) -> bool {
    let mut place = Some(place);
    move |out, offsets| place.take().is_some_and(|place| place(out, offsets))
}
