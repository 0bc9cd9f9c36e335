//! One operator's writer: a sandboxed component instance plus its mailbox.
//!
//! The mailbox delivers upload outcomes to the guest serially with the writer's own
//! calls: both run only while holding the writer's lock. A writer call drains the
//! mailbox before and after itself; an upload outcome that arrives while the writer is
//! idle is delivered at once by the thread that produced it. Nothing ever waits for the
//! lock while holding another writer's lock, so delivery cannot deadlock.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use dstl_guest::types::{self as t, SnapshotResult, WriterError};
use tokio::sync::oneshot;
use wasmtime::component::{ResourceAny, ResourceTable};
use wasmtime::{Store, StoreLimits, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::component::{self as c, Changelog, WriterComponent, deadline_ticks, w};
use crate::error::{Error, TrapKind};
use crate::registry::WriterId;
use crate::storage::Shared;

/// Store data of one writer's sandbox: what its imports need.
pub(crate) struct WriterCtx {
    name: String,
    id: WriterId,
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    stderr: MemoryOutputPipe,
    shared: Arc<Shared>,
    this: Weak<WriterShared>,
    /// The files the guest holds references to.
    holdings: Holdings,
    /// CPU time of the call running now.
    clock: CallClock,
}

/// The CPU time the call running now has used: a call is limited in what it computes.
/// Time its thread spends blocked in the host (waiting for in-flight capacity in
/// `schedule`) or waiting for a CPU on a busy machine does not count.
struct CallClock {
    started: Duration,
    budget: Duration,
}

impl CallClock {
    fn new(budget: Duration) -> Self {
        Self {
            started: thread_cpu_time(),
            budget,
        }
    }

    fn guest_time(&self) -> Duration {
        thread_cpu_time().saturating_sub(self.started)
    }
}

/// CPU time the calling thread has used (a guest call runs on its caller's thread).
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given, and
    // CLOCK_THREAD_CPUTIME_ID is a valid clock on every platform dstl builds for.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// A guest call the host refuses: the guest named a file it does not hold. The writer is
/// trapped, since a guest that does this is buggy or hostile.
#[derive(Debug, thiserror::Error)]
#[error("guest fault: {0}")]
pub(crate) struct GuestFault(String);

/// One file the guest holds references to.
#[derive(Debug)]
struct Holding {
    /// Change sets in the file delivered to the guest and not released by it.
    refs: u64,
    /// A local copy (owned in the local registry) rather than a store file.
    local: bool,
    /// A snapshot naming the file was returned to the caller: a checkpoint may use it.
    handed_out: bool,
}

/// The files the guest holds references to, as the host delivered them. The guest may
/// release, stop tracking or register only these; when its sandbox goes away, the host
/// releases those no returned snapshot names.
#[derive(Default)]
struct Holdings(HashMap<String, Holding>);

impl Holdings {
    fn add(&mut self, results: &[t::UploadResult]) {
        for result in results {
            self.add_one(&result.remote.path, false);
            if let Some(local) = &result.local {
                self.add_one(&local.handle.path, true);
            }
        }
    }

    fn add_one(&mut self, path: &str, local: bool) {
        self.0
            .entry(path.to_string())
            .or_insert(Holding {
                refs: 0,
                local,
                handed_out: false,
            })
            .refs += 1;
    }

    /// Whether `path` is a held local copy; a fault if the guest does not hold it.
    fn check(&self, path: &str, operation: &str) -> Result<bool, GuestFault> {
        match self.0.get(path) {
            Some(holding) if holding.refs > 0 => Ok(holding.local),
            _ => Err(GuestFault(format!(
                "{operation} of {path}, a file this writer does not hold"
            ))),
        }
    }

    /// Drops one reference; whether the file is a local copy.
    fn release(&mut self, path: &str) -> Result<bool, GuestFault> {
        let local = self.check(path, "release")?;
        let holding = self.0.get_mut(path).expect("checked");
        holding.refs -= 1;
        if holding.refs == 0 {
            self.0.remove(path);
        }
        Ok(local)
    }

    /// Marks the files of a snapshot returned to the caller.
    fn hand_out(&mut self, snapshot: &SnapshotResult) {
        let entries = snapshot.remote.entries.iter();
        for entry in entries.chain(snapshot.local.iter().flat_map(|l| &l.entries)) {
            if let Some(holding) = self.0.get_mut(&entry.handle.path) {
                holding.handed_out = true;
            }
        }
    }

    /// Local copies the local registry discarded for this writer: the guest forgets them.
    fn forget(&mut self, paths: &[String]) {
        for path in paths {
            self.0.remove(path);
        }
    }

    /// Takes the references no returned snapshot covers, to release them. The others stay
    /// held: a checkpoint the coordinator knows about may still need those files.
    fn take_unreturned(&mut self) -> Vec<(String, Holding)> {
        let mut unreturned = Vec::new();
        self.0.retain(|path, holding| {
            if !holding.handed_out {
                let taken = std::mem::replace(&mut holding.refs, 0);
                unreturned.push((
                    path.clone(),
                    Holding {
                        refs: taken,
                        local: holding.local,
                        handed_out: false,
                    },
                ));
            }
            holding.handed_out
        });
        unreturned
    }
}

impl WriterCtx {
    /// Releases every reference the guest holds that no returned snapshot covers: its
    /// sandbox is gone or closed, so it never will.
    fn release_unreturned(&mut self) {
        for (path, holding) in self.holdings.take_unreturned() {
            for _ in 0..holding.refs {
                self.shared.release(self.id, &path, holding.local);
            }
        }
    }
}

impl WasiView for WriterCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl w::Host for WriterCtx {}

impl c::dstl::changelog::uploader::Host for WriterCtx {
    fn schedule(&mut self, task: w::UploadTask) -> wasmtime::Result<Result<(), String>> {
        // Blocks while the in-flight limit is reached: that uses no CPU, so it does not
        // count against the call's deadline.
        let result =
            self.shared
                .scheduler
                .submit(self.this.clone(), self.id, c::from_wit_task(task));
        Ok(result)
    }
}

impl c::dstl::changelog::registry::Host for WriterCtx {
    fn release(&mut self, handle: w::StreamHandle) -> wasmtime::Result<()> {
        let local = self.holdings.release(&handle.path)?;
        self.shared.release(self.id, &handle.path, local);
        Ok(())
    }

    fn stop_tracking(&mut self, handle: w::StreamHandle) -> wasmtime::Result<()> {
        if self.holdings.check(&handle.path, "stop-tracking")? {
            self.shared
                .local_registry
                .stop_tracking(self.id, &handle.path);
        } else {
            self.shared.task_registry.stop_tracking(&handle.path);
        }
        Ok(())
    }
}

impl c::dstl::changelog::local_registry::Host for WriterCtx {
    fn register(&mut self, handle: w::StreamHandle, checkpoint: i64) -> wasmtime::Result<()> {
        if !self.holdings.check(&handle.path, "local register")? {
            return Err(GuestFault(format!(
                "local register of {}, a store file rather than a local copy",
                handle.path
            ))
            .into());
        }
        self.shared
            .local_registry
            .register(self.id, &handle.path, checkpoint);
        Ok(())
    }

    fn discard_up_to(&mut self, checkpoint: i64) -> wasmtime::Result<Vec<String>> {
        let discarded = self
            .shared
            .local_registry
            .discard_up_to(self.id, checkpoint);
        self.holdings.forget(&discarded);
        Ok(discarded)
    }
}

impl c::dstl::changelog::logging::Host for WriterCtx {
    fn log(
        &mut self,
        level: c::dstl::changelog::logging::Level,
        message: String,
    ) -> wasmtime::Result<()> {
        use c::dstl::changelog::logging::Level;
        let writer = &self.name;
        match level {
            Level::Trace => tracing::trace!(writer, "{message}"),
            Level::Debug => tracing::debug!(writer, "{message}"),
            Level::Info => tracing::info!(writer, "{message}"),
            Level::Warn => tracing::warn!(writer, "{message}"),
            Level::Error => tracing::error!(writer, "{message}"),
        }
        Ok(())
    }
}

/// A sandbox for one component instance, its memory capped at `memory_limit` bytes, its
/// stderr captured so a guest panic's message reaches the error, and each call limited to
/// `call_timeout` of CPU time.
pub(crate) fn new_store(
    shared: &Arc<Shared>,
    name: &str,
    id: WriterId,
    memory_limit: u64,
    call_timeout: Duration,
    this: Weak<WriterShared>,
) -> Store<WriterCtx> {
    let stderr = MemoryOutputPipe::new(64 * 1024);
    let ctx = WriterCtx {
        name: name.to_string(),
        id,
        wasi: WasiCtx::builder().stderr(stderr.clone()).build(),
        table: ResourceTable::new(),
        limits: StoreLimitsBuilder::new()
            .memory_size(memory_limit as usize)
            .trap_on_grow_failure(true)
            .build(),
        stderr,
        shared: shared.clone(),
        this,
        holdings: Holdings::default(),
        clock: CallClock::new(call_timeout),
    };
    let mut store = Store::new(&shared.wasm.engine, ctx);
    store.limiter(|ctx| &mut ctx.limits);
    store.set_epoch_deadline(deadline_ticks(call_timeout));
    // The epoch deadline runs on wall time; when it is reached, the call is interrupted
    // only if its CPU time is used up, and extended by the rest otherwise.
    store.epoch_deadline_callback(|ctx| {
        let clock = &ctx.data().clock;
        let used = clock.guest_time();
        Ok(if used >= clock.budget {
            UpdateDeadline::Interrupt
        } else {
            UpdateDeadline::Continue(deadline_ticks(clock.budget - used))
        })
    });
    store
}

/// The component's exported decoder, for checking it against the host's reader.
pub struct ComponentDecoder {
    store: Store<WriterCtx>,
    bindings: Changelog,
    call_timeout: Duration,
}

impl ComponentDecoder {
    pub(crate) fn new(shared: &Arc<Shared>) -> Result<Self, Error> {
        let call_timeout = shared.config.writer_call_timeout;
        let mut store = new_store(
            shared,
            "decoder",
            0,
            shared.config.writer_memory_limit,
            call_timeout,
            Weak::new(),
        );
        let bindings = shared
            .wasm
            .pre
            .instantiate(&mut store)
            .map_err(|e| Error::Trapped {
                writer: "decoder".into(),
                kind: TrapKind::of(&e),
                cause: format!("{e:#}"),
            })?;
        Ok(Self {
            store,
            bindings,
            call_timeout,
        })
    }

    fn trap(e: wasmtime::Error) -> String {
        format!("decoder sandbox trapped: {e:#}")
    }

    fn start_call(&mut self) {
        self.store.data_mut().clock = CallClock::new(self.call_timeout);
        self.store
            .set_epoch_deadline(deadline_ticks(self.call_timeout));
    }

    /// A whole file's logical bytes, decoded inside the sandbox.
    pub fn logical_bytes(&mut self, file: &[u8]) -> Result<Vec<u8>, String> {
        self.start_call();
        self.bindings
            .dstl_changelog_reader()
            .call_logical_bytes(&mut self.store, file)
            .map_err(Self::trap)?
    }

    /// The change set at `offset` of `logical`, decoded inside the sandbox.
    pub fn decode_change_set(
        &mut self,
        logical: &[u8],
        offset: u64,
    ) -> Result<Vec<dstl_guest::codec::Change>, String> {
        self.start_call();
        let changes = self
            .bindings
            .dstl_changelog_reader()
            .call_decode_change_set(&mut self.store, logical, offset)
            .map_err(Self::trap)??;
        Ok(changes
            .into_iter()
            .map(|c| dstl_guest::codec::Change {
                key_group: c.key_group,
                value: c.value,
            })
            .collect())
    }
}

/// An upload outcome waiting for delivery to the guest.
pub(crate) enum Letter {
    Succeeded {
        task: u64,
        results: Vec<t::UploadResult>,
    },
    Failed {
        task: u64,
        cause: String,
    },
}

struct Live {
    store: Store<WriterCtx>,
    bindings: Changelog,
    resource: ResourceAny,
}

type Outcome = Result<SnapshotResult, Error>;

struct Inner {
    live: Option<Live>,
    /// Why the sandbox is gone, once it trapped.
    failure: Option<(TrapKind, String)>,
    pending: HashMap<u64, oneshot::Sender<Outcome>>,
    /// Appends not yet handed to the guest (see [`Writer::append`]).
    buffer: Batch,
    /// Closed by `close` or `truncate-and-close`.
    closed: bool,
    /// The guest's open change-set bytes, mirrored so that a batch is handed over exactly
    /// when an append reaches the pre-emptive threshold, as without buffering.
    open_bytes: u64,
}

/// Appends collected on the host side as packed columns, handed to the guest as one
/// `append-batch` call: a call into the sandbox costs ~0.35 µs, a packed batch of 1000
/// small changes ~20 µs (spec/WASM-NOTES.md).
#[derive(Default)]
struct Batch {
    key_groups: Vec<i32>,
    lengths: Vec<u32>,
    data: Vec<u8>,
}

impl Batch {
    /// Flush at this many bytes or changes.
    const MAX_BYTES: usize = 256 << 10;
    const MAX_CHANGES: usize = 4096;

    fn push(&mut self, key_group: i32, value: &[u8]) {
        self.key_groups.push(key_group);
        self.lengths.push(value.len() as u32);
        self.data.extend_from_slice(value);
    }

    fn is_full(&self) -> bool {
        self.data.len() >= Self::MAX_BYTES || self.key_groups.len() >= Self::MAX_CHANGES
    }

    fn clear(&mut self) {
        self.key_groups.clear();
        self.lengths.clear();
        self.data.clear();
    }
}

/// Shared between the [`Writer`] handle and the uploads in flight for it.
pub(crate) struct WriterShared {
    name: String,
    id: WriterId,
    /// CPU time one call may use.
    call_timeout: Duration,
    config: t::WriterConfig,
    inner: Mutex<Inner>,
    mailbox: Mutex<VecDeque<Letter>>,
    shared: Arc<Shared>,
}

/// Per-writer sandbox settings.
#[derive(Debug, Clone, Default)]
pub struct WriterOptions {
    /// Linear-memory cap of this writer's sandbox; the storage's
    /// `dstl.writer.memory-limit` when `None`.
    pub memory_limit: Option<u64>,
    /// CPU time one call into this writer's sandbox may use; the storage's
    /// `dstl.writer.call-timeout` when `None`.
    pub call_timeout: Option<Duration>,
    /// Another build of the writer component (it must implement the same WIT world);
    /// the component built into dstl when `None`.
    pub component: Option<WriterComponent>,
}

/// One operator's writer. Calls are serialized; the handle can be shared across threads.
pub struct Writer {
    shared: Arc<WriterShared>,
}

impl Writer {
    pub(crate) fn create(
        shared: Arc<Shared>,
        id: WriterId,
        config: t::WriterConfig,
        options: WriterOptions,
    ) -> Result<Self, Error> {
        let memory_limit = options
            .memory_limit
            .unwrap_or(shared.config.writer_memory_limit);
        let name = config.name.clone();
        let call_timeout = options
            .call_timeout
            .unwrap_or(shared.config.writer_call_timeout);
        let pre = match &options.component {
            Some(component) => &component.pre,
            None => &shared.wasm.pre,
        };
        let mut setup_error = None;
        let writer = Arc::new_cyclic(|this: &Weak<WriterShared>| {
            let mut store = new_store(&shared, &name, id, memory_limit, call_timeout, this.clone());
            let live = pre.instantiate(&mut store).and_then(|bindings| {
                let resource = bindings
                    .dstl_changelog_writer()
                    .writer()
                    .call_constructor(&mut store, &c::to_wit_config(&config))?;
                Ok(Live {
                    store,
                    bindings,
                    resource,
                })
            });
            let live = match live {
                Ok(live) => Some(live),
                Err(e) => {
                    setup_error = Some((TrapKind::of(&e), format!("{e:#}")));
                    None
                }
            };
            WriterShared {
                name: name.clone(),
                id,
                call_timeout,
                config: config.clone(),
                inner: Mutex::new(Inner {
                    live,
                    failure: None,
                    pending: HashMap::new(),
                    buffer: Batch::default(),
                    closed: false,
                    open_bytes: 0,
                }),
                mailbox: Mutex::new(VecDeque::new()),
                shared: shared.clone(),
            }
        });
        if let Some((kind, cause)) = setup_error {
            return Err(Error::Trapped {
                writer: name,
                kind,
                cause: format!("could not instantiate the writer component: {cause}"),
            });
        }
        Ok(Self { shared: writer })
    }

    /// The operator name the writer was created with.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The writer's id in its storage (local copies are owned per writer id).
    pub fn id(&self) -> WriterId {
        self.shared.id
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
        let check = self.shared.config.check_change(key_group, value.len());
        self.buffered(key_group, value, "append", check)
    }

    /// Appends a metadata change (buffered like [`Writer::append`]).
    pub fn append_meta(&self, value: &[u8]) -> Result<(), Error> {
        let check = t::WriterConfig::check_length(value.len());
        self.buffered(
            dstl_guest::codec::META_KEY_GROUP,
            value,
            "append-meta",
            check,
        )
    }

    /// Checks in the guest's order: a failed or closed writer first, then `check`.
    fn buffered(
        &self,
        key_group: i32,
        value: &[u8],
        operation: &str,
        check: Result<(), WriterError>,
    ) -> Result<(), Error> {
        let writer = &self.shared;
        let mut inner = writer.inner.lock().unwrap();
        if inner.live.is_none() {
            return Err(writer.trapped_error(&inner));
        }
        if inner.closed {
            return Err(writer.writer_error(writer.config.closed_error(operation)));
        }
        check.map_err(|e| writer.writer_error(e))?;
        if value.len() >= Batch::MAX_BYTES {
            drop(inner);
            // Large values gain nothing from batching: hand them over directly.
            return self.call_with(|state, live| {
                let api = live.bindings.dstl_changelog_writer().writer();
                let result = api.call_append_batch(
                    &mut live.store,
                    live.resource,
                    &[key_group],
                    &[value.len() as u32],
                    value,
                )?;
                Ok(mirror_open_bytes(state.open_bytes, result))
            });
        }
        inner.buffer.push(key_group, value);
        inner.open_bytes = inner.open_bytes.saturating_add(value.len() as u64);
        let preemptive = inner.open_bytes >= writer.config.preemptive_persist_threshold;
        if !preemptive && !inner.buffer.is_full() {
            return Ok(());
        }
        // As for any call: upload outcomes that arrived first are delivered first.
        writer.drain(&mut inner);
        let result = writer.flush(&mut inner);
        writer.drain(&mut inner);
        drop(inner);
        writer.pump();
        result
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
        self.call_with(|state, live| {
            let api = live.bindings.dstl_changelog_writer().writer();
            let result =
                api.call_append_batch(&mut live.store, live.resource, key_groups, lengths, data)?;
            Ok(mirror_open_bytes(state.open_bytes, result))
        })
    }

    /// Always 0.
    pub fn initial_sequence_number(&self) -> Result<u64, Error> {
        self.call(|api, store, r| api.call_initial_sequence_number(store, r).map(Ok))
    }

    /// Closes the open change set (if non-empty) and returns the next sequence number.
    pub fn next_sequence_number(&self) -> Result<u64, Error> {
        self.call_with(|state, live| {
            *state.open_bytes = 0;
            let api = live.bindings.dstl_changelog_writer().writer();
            api.call_next_sequence_number(&mut live.store, live.resource)
                .map(Ok)
        })
    }

    /// Makes every change set from `from` on durable for `checkpoint`. The returned
    /// future completes when the uploads it needs have landed (or failed).
    pub fn persist(&self, from: u64, checkpoint: i64) -> Result<PersistFuture, Error> {
        let name = self.shared.name.clone();
        self.call_with(|state, live| {
            let reply = live
                .bindings
                .dstl_changelog_writer()
                .writer()
                .call_persist(&mut live.store, live.resource, from, checkpoint)?;
            // The guest rolled the open change set over unless a precondition failed.
            if matches!(reply, Ok(_) | Err(w::WriterError::UploadFailed(_))) {
                *state.open_bytes = 0;
            }
            Ok(reply.map(|reply| match reply {
                w::PersistReply::Ready(s) => {
                    let snapshot = c::from_wit_snapshot(s);
                    live.store.data_mut().holdings.hand_out(&snapshot);
                    PersistFuture::ready(Ok(snapshot))
                }
                w::PersistReply::Pending(ticket) => {
                    let (tx, rx) = oneshot::channel();
                    state.tickets.insert(ticket, tx);
                    PersistFuture::waiting(name, rx)
                }
            }))
        })
    }

    /// Drops change sets below `to`.
    pub fn truncate(&self, to: u64) -> Result<(), Error> {
        self.call(|api, store, r| api.call_truncate(store, r, to))
    }

    /// A checkpoint holding `[from, to)` was confirmed. Also after close, where it still
    /// discards the writer's older local copies.
    pub fn confirm(&self, from: u64, to: u64, checkpoint: i64) -> Result<(), Error> {
        self.call(|api, store, r| api.call_confirm(store, r, from, to, checkpoint))
    }

    /// A checkpoint holding `[from, to)` was aborted.
    pub fn reset(&self, from: u64, to: u64, checkpoint: i64) -> Result<(), Error> {
        self.call(|api, store, r| api.call_reset(store, r, from, to, checkpoint))
    }

    /// Releases change sets from `from` on and closes; pending persists fail with `closed`.
    pub fn truncate_and_close(&self, from: u64) -> Result<(), Error> {
        self.closing(|live| {
            live.bindings
                .dstl_changelog_writer()
                .writer()
                .call_truncate_and_close(&mut live.store, live.resource, from)
        })
    }

    /// Closes the writer; pending persists fail with `closed`. Files no returned snapshot
    /// names are released; those of returned snapshots stay for a later confirm (or for
    /// `dstl gc`). Uploads still in flight are released when they land.
    pub fn close(&self) -> Result<(), Error> {
        self.closing(|live| {
            live.bindings
                .dstl_changelog_writer()
                .writer()
                .call_close(&mut live.store, live.resource)
        })
    }

    /// Why the sandbox failed, if it trapped.
    pub fn failure(&self) -> Option<String> {
        let inner = self.shared.inner.lock().unwrap();
        inner.failure.as_ref().map(|(_, cause)| cause.clone())
    }

    fn call<R>(
        &self,
        f: impl FnOnce(
            &c::exports::dstl::changelog::writer::GuestWriter<'_>,
            &mut Store<WriterCtx>,
            ResourceAny,
        ) -> wasmtime::Result<Result<R, w::WriterError>>,
    ) -> Result<R, Error> {
        self.call_with(|_, live| {
            let api = live.bindings.dstl_changelog_writer().writer();
            f(&api, &mut live.store, live.resource)
        })
    }

    /// A call that closes the writer: the writer is marked closed under the same lock, so
    /// no append can slip in between and be accepted only to be lost.
    fn closing(
        &self,
        f: impl FnOnce(&mut Live) -> wasmtime::Result<Result<Vec<w::PersistCompletion>, w::WriterError>>,
    ) -> Result<(), Error> {
        let name = self.shared.name.clone();
        self.call_with(|state, live| {
            let completions = match f(live)? {
                Ok(completions) => completions,
                Err(e) => return Ok(Err(e)),
            };
            *state.closed = true;
            state.resolve(&name, live, completions);
            live.store.data_mut().release_unreturned();
            Ok(Ok(()))
        })
    }

    /// Runs one guest call under the writer's lock: delivers waiting upload outcomes and
    /// buffered appends first, and outcomes that arrived meanwhile after.
    fn call_with<R>(
        &self,
        f: impl FnOnce(&mut CallState<'_>, &mut Live) -> wasmtime::Result<Result<R, w::WriterError>>,
    ) -> Result<R, Error> {
        let writer = &self.shared;
        let mut inner = writer.inner.lock().unwrap();
        writer.drain(&mut inner);
        let result = writer
            .flush(&mut inner)
            .and_then(|()| writer.invoke(&mut inner, f));
        writer.drain(&mut inner);
        drop(inner);
        writer.pump();
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
        let mut inner = self.shared.inner.lock().unwrap();
        if let Some(mut live) = inner.live.take() {
            live.store.data_mut().release_unreturned();
        }
        inner.pending.clear();
        // Outcomes posted while this held the lock: with no sandbox left, delivering them
        // releases their files.
        self.shared.drain(&mut inner);
        drop(inner);
        self.shared.pump();
    }
}

/// Keeps the host's mirror of the guest's open bytes after an `append-batch`: the guest
/// reports them; a failed pre-emptive persist leaves the set open and over the
/// threshold (so the next append tries again, as the guest would); a batch the guest
/// refused as malformed appended nothing.
fn mirror_open_bytes(
    open_bytes: &mut u64,
    result: Result<u64, w::WriterError>,
) -> Result<(), w::WriterError> {
    match result {
        Ok(open) => {
            *open_bytes = open;
            Ok(())
        }
        Err(e @ w::WriterError::InvalidArgument(_)) => Err(e),
        Err(e) => {
            *open_bytes = u64::MAX;
            Err(e)
        }
    }
}

/// The writer's host-side state, as seen inside a writer call.
struct CallState<'a> {
    tickets: &'a mut HashMap<u64, oneshot::Sender<Outcome>>,
    open_bytes: &'a mut u64,
    closed: &'a mut bool,
}

impl CallState<'_> {
    /// Completes the persists the guest finished; the files of every returned snapshot
    /// are marked handed out.
    fn resolve(&mut self, writer: &str, live: &mut Live, completions: Vec<w::PersistCompletion>) {
        for completion in completions {
            let Some(tx) = self.tickets.remove(&completion.ticket) else {
                tracing::warn!(
                    writer,
                    ticket = completion.ticket,
                    "completion for an unknown persist"
                );
                continue;
            };
            let outcome = completion
                .outcome
                .map(|s| {
                    let snapshot = c::from_wit_snapshot(s);
                    live.store.data_mut().holdings.hand_out(&snapshot);
                    snapshot
                })
                .map_err(|e| Error::Writer {
                    writer: writer.to_string(),
                    source: c::from_wit_error(e),
                });
            // The caller may have dropped the future; that is fine.
            let _ = tx.send(outcome);
        }
    }
}

impl WriterShared {
    fn writer_error(&self, source: WriterError) -> Error {
        Error::Writer {
            writer: self.name.clone(),
            source,
        }
    }

    /// One guest call; a trap poisons the writer.
    fn invoke<R>(
        &self,
        inner: &mut Inner,
        f: impl FnOnce(&mut CallState<'_>, &mut Live) -> wasmtime::Result<Result<R, w::WriterError>>,
    ) -> Result<R, Error> {
        let outcome = {
            let Inner {
                live,
                pending,
                open_bytes,
                closed,
                ..
            } = &mut *inner;
            live.as_mut().map(|live| {
                live.store.data_mut().clock = CallClock::new(self.call_timeout);
                live.store
                    .set_epoch_deadline(deadline_ticks(self.call_timeout));
                f(
                    &mut CallState {
                        tickets: pending,
                        open_bytes,
                        closed,
                    },
                    live,
                )
            })
        };
        match outcome {
            None => Err(self.trapped_error(inner)),
            Some(Ok(Ok(value))) => Ok(value),
            Some(Ok(Err(e))) => Err(self.writer_error(c::from_wit_error(e))),
            Some(Err(trap)) => {
                self.poison(inner, trap);
                Err(self.trapped_error(inner))
            }
        }
    }

    /// Hands buffered appends to the guest as one packed batch.
    fn flush(&self, inner: &mut Inner) -> Result<(), Error> {
        if inner.buffer.key_groups.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut inner.buffer);
        let result = self.invoke(inner, |state, live| {
            let api = live.bindings.dstl_changelog_writer().writer();
            let result = api.call_append_batch(
                &mut live.store,
                live.resource,
                &batch.key_groups,
                &batch.lengths,
                &batch.data,
            )?;
            Ok(mirror_open_bytes(state.open_bytes, result))
        });
        // Keep the allocations for the next batch.
        let mut batch = batch;
        batch.clear();
        inner.buffer = batch;
        result
    }

    /// Queues an upload outcome and delivers it unless the writer is busy (then the
    /// writer's own call delivers it before returning).
    pub(crate) fn post(self: &Arc<Self>, letter: Letter) {
        self.mailbox.lock().unwrap().push_back(letter);
        self.pump();
    }

    fn pump(&self) {
        loop {
            if self.mailbox.lock().unwrap().is_empty() {
                return;
            }
            // Busy: the call holding the lock drains the mailbox before it returns.
            let Ok(mut inner) = self.inner.try_lock() else {
                return;
            };
            self.drain(&mut inner);
        }
    }

    fn drain(&self, inner: &mut Inner) {
        loop {
            let Some(letter) = self.mailbox.lock().unwrap().pop_front() else {
                return;
            };
            if inner.live.is_none() {
                // The sandbox is gone: nobody will reference these files.
                if let Letter::Succeeded { results, .. } = letter {
                    self.shared.release_results(self.id, &results);
                }
                continue;
            }
            // A trap is handled by `invoke` (the writer is poisoned, its persists fail).
            let name = &self.name;
            let _ = self.invoke(inner, |state, live| {
                let api = live.bindings.dstl_changelog_writer().writer();
                let completions =
                    match letter {
                        Letter::Succeeded { task, mut results } => {
                            // A local copy this writer's discard already let go of (between the
                            // upload's end and this delivery) is not handed to it again.
                            let local_registry = &self.shared.local_registry;
                            for result in &mut results {
                                if result.local.as_ref().is_some_and(|l| {
                                    !local_registry.claims(self.id, &l.handle.path)
                                }) {
                                    result.local = None;
                                }
                            }
                            live.store.data_mut().holdings.add(&results);
                            let results = c::to_wit_results(results);
                            api.call_on_upload_succeeded(
                                &mut live.store,
                                live.resource,
                                task,
                                &results,
                            )?
                        }
                        Letter::Failed { task, cause } => {
                            api.call_on_upload_failed(&mut live.store, live.resource, task, &cause)?
                        }
                    };
                state.resolve(name, live, completions);
                Ok(Ok(()))
            });
        }
    }

    /// The sandbox trapped: drop it and fail every pending persist with the cause.
    fn poison(&self, inner: &mut Inner, trap: wasmtime::Error) {
        let kind = TrapKind::of(&trap);
        let mut cause = format!("{trap:#}");
        if kind == TrapKind::Deadline {
            cause = format!(
                "the call used up its deadline of {} ms of CPU time (dstl.writer.call-timeout) and was interrupted: {cause}",
                self.call_timeout.as_millis()
            );
        }
        if let Some(live) = &inner.live {
            let printed = live.store.data().stderr.contents();
            if !printed.is_empty() {
                cause.push_str("; guest stderr: ");
                cause.push_str(String::from_utf8_lossy(&printed).trim());
            }
        }
        tracing::error!(writer = %self.name, ?kind, %cause, "writer sandbox trapped");
        self.abandon(inner);
        inner.failure = Some((kind, cause));
        let error = self.trapped_error(inner);
        for (_, tx) in inner.pending.drain() {
            let _ = tx.send(Err(error.clone()));
        }
    }

    /// Drops a trapped sandbox. The guest's references to uploaded files die with it:
    /// those no returned snapshot names are released, so files that no one else needs (no
    /// other writer, no confirmed checkpoint) are deleted; those of returned snapshots
    /// stay tracked, since a coordinator may have completed that checkpoint already.
    fn abandon(&self, inner: &mut Inner) {
        if let Some(mut live) = inner.live.take() {
            live.store.data_mut().release_unreturned();
        }
    }

    fn trapped_error(&self, inner: &Inner) -> Error {
        match &inner.failure {
            Some((kind, cause)) => Error::Trapped {
                writer: self.name.clone(),
                kind: *kind,
                cause: cause.clone(),
            },
            None => Error::Writer {
                writer: self.name.clone(),
                source: WriterError::Closed(format!("writer {} was dropped", self.name)),
            },
        }
    }
}

/// The outcome of a persist: ready at once, or completed by the writer's mailbox.
pub struct PersistFuture {
    state: FutureState,
}

enum FutureState {
    Ready(Option<Outcome>),
    Waiting {
        writer: String,
        rx: oneshot::Receiver<Outcome>,
    },
}

fn dropped(writer: &str) -> Error {
    Error::Writer {
        writer: writer.to_string(),
        source: WriterError::Closed(format!(
            "writer {writer} was dropped before the persist completed"
        )),
    }
}

impl PersistFuture {
    fn ready(outcome: Outcome) -> Self {
        Self {
            state: FutureState::Ready(Some(outcome)),
        }
    }

    fn waiting(writer: String, rx: oneshot::Receiver<Outcome>) -> Self {
        Self {
            state: FutureState::Waiting { writer, rx },
        }
    }

    /// True if the result was available when `persist` returned (nothing to upload).
    pub fn is_immediate(&self) -> bool {
        matches!(self.state, FutureState::Ready(_))
    }

    /// Blocks the calling thread until the persist completes. In async code, `.await`
    /// the future instead (blocking inside a runtime is refused by tokio).
    pub fn wait(self) -> Outcome {
        match self.state {
            FutureState::Ready(outcome) => outcome.expect("persist outcome taken twice"),
            FutureState::Waiting { writer, rx } => {
                rx.blocking_recv().unwrap_or_else(|_| Err(dropped(&writer)))
            }
        }
    }
}

impl std::fmt::Debug for PersistFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            FutureState::Ready(outcome) => f
                .debug_tuple("PersistFuture::Ready")
                .field(outcome)
                .finish(),
            FutureState::Waiting { writer, .. } => f
                .debug_struct("PersistFuture::Waiting")
                .field("writer", writer)
                .finish(),
        }
    }
}

impl Future for PersistFuture {
    type Output = Outcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        match &mut self.state {
            FutureState::Ready(outcome) => Poll::Ready(
                outcome
                    .take()
                    .expect("persist future polled after completion"),
            ),
            FutureState::Waiting { writer, rx } => Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or_else(|_| Err(dropped(writer)))),
        }
    }
}
