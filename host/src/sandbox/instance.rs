//! One writer's sandbox: a store with its own memory cap, call deadline and captured
//! stderr, and an instance of the component's `writer` resource. Every call goes through
//! here, so the rest of the host sees plain `dstl_proto` types and a [`Trap`] instead of
//! wasmtime's.

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dstl_proto::types::{
    PersistCompletion, PersistReply, SnapshotResult, WriterConfig, WriterError,
};
use wasmtime::component::{ResourceAny, TypedFunc};
use wasmtime::{Store, UpdateDeadline};

use super::bindings::{
    Changelog, ChangelogPre, from_wit_completions, from_wit_error, from_wit_reply, to_wit_config,
    to_wit_result, wit,
};
use super::context::{CallClock, WriterCtx, WriterLinks};
use super::engine::deadline_ticks;
use super::framed::Framed;
pub(crate) use super::framed::{Batch, Filled, Packed, Placed, Placing};
use super::trap::Trap;
use crate::registry::WriterId;
use crate::services::Services;
use crate::upload::UploadOutcome;

/// The signatures of `append-framed` and `persist-framed`.
type AppendFramedParams<'a> = (ResourceAny, Framed<'a>);
type AppendFramedResults = (Result<u64, wit::WriterError>,);
type PersistFramedParams<'a> = (ResourceAny, Framed<'a>, u64, i64);
type PersistFramedResults = (Result<wit::PersistReply, wit::WriterError>,);

/// The outcome of one call: the guest's answer, or the trap that ended the sandbox.
pub(crate) type Call<T> = Result<Result<T, WriterError>, Trap>;

/// What one writer's sandbox may use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Linear-memory cap in bytes.
    pub memory: u64,
    /// CPU time one call may use.
    pub call_timeout: Duration,
}

/// A sandbox for one component instance, its memory capped, its stderr captured so a
/// guest panic's message reaches the error, and each call limited in its CPU time.
pub(crate) fn new_store(engine: &wasmtime::Engine, ctx: WriterCtx) -> Store<WriterCtx> {
    let timeout = ctx.clock.budget;
    let lift_budget = lift_budget(ctx.memory_limit);
    let mut store = Store::new(engine, ctx);
    store.limiter(|ctx| &mut ctx.limits);
    store.set_hostcall_fuel(lift_budget);
    store.set_epoch_deadline(deadline_ticks(timeout));
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

/// What one call may lift out of a guest whose memory is capped at `memory_limit`:
/// wasmtime's "hostcall fuel", 128 MiB by default, bounds the host's allocations for the
/// lists and strings of one call. A legitimate answer can be larger (pending persists of
/// one range complete together, each listing every change set of it), but it is bounded
/// by the guest's memory; host types take at most about twice the guest's bytes, so four
/// times the cap stops only a guest that names the same bytes over and over.
fn lift_budget(memory_limit: u64) -> usize {
    usize::try_from(memory_limit.saturating_mul(4)).unwrap_or(usize::MAX)
}

/// One writer's live sandbox.
pub(crate) struct Instance {
    /// Dropped through the keeper of its memory (see `Drop`).
    store: ManuallyDrop<Store<WriterCtx>>,
    bindings: Changelog,
    resource: ResourceAny,
    /// The writer's `append-framed` and `persist-framed` exports.
    append_framed: wasmtime::component::Func,
    persist_framed: wasmtime::component::Func,
    /// Scratch of framing batches.
    framing: super::framed::Framing,
    call_timeout: Duration,
    /// Export calls made so far, for dstl's tests of what one writer call costs.
    pub calls: u64,
}

impl Instance {
    /// Instantiates `pre` for the writer `config` describes. While the instance pool is
    /// full and some of its slots are kept by sandboxes whose lent blocks are still on
    /// their way (`lease`), waits for them (up to the call timeout).
    pub fn new(
        pre: &ChangelogPre<WriterCtx>,
        services: Arc<Services>,
        links: WriterLinks,
        id: WriterId,
        config: &WriterConfig,
        limits: Limits,
    ) -> Result<Self, Trap> {
        let deadline = Instant::now() + limits.call_timeout;
        loop {
            let ctx = WriterCtx::new(
                &config.name,
                id,
                limits.memory,
                limits.call_timeout,
                services.clone(),
                links.clone(),
            );
            let mut store = new_store(pre.engine(), ctx);
            let created = pre
                .instance_pre()
                .instantiate(&mut store)
                .and_then(|instance| {
                    let bindings = Changelog::new(&mut store, &instance)?;
                    let interface = instance
                        .get_export_index(&mut store, None, "dstl:changelog/writer@0.1.0")
                        .ok_or_else(|| wasmtime::format_err!("no writer interface"))?;
                    let mut method = |name: &str| {
                        let index = instance
                            .get_export_index(&mut store, Some(&interface), name)
                            .ok_or_else(|| {
                                wasmtime::format_err!("the component exports no {name}")
                            })?;
                        instance
                            .get_func(&mut store, index)
                            .ok_or_else(|| wasmtime::format_err!("{name} is no function"))
                    };
                    let append_framed = method("[method]writer.append-framed")?;
                    let persist_framed = method("[method]writer.persist-framed")?;
                    // Checked once here, so each call takes them unchecked (as the
                    // generated bindings do with theirs).
                    append_framed
                        .typed::<AppendFramedParams<'static>, AppendFramedResults>(&store)?;
                    persist_framed
                        .typed::<PersistFramedParams<'static>, PersistFramedResults>(&store)?;
                    let resource = bindings
                        .dstl_changelog_writer()
                        .writer()
                        .call_constructor(&mut store, &to_wit_config(config.clone()))?;
                    Ok((bindings, resource, append_framed, persist_framed))
                });
            let e = match created {
                Ok((bindings, resource, append_framed, persist_framed)) => {
                    return Ok(Self {
                        store: ManuallyDrop::new(store),
                        bindings,
                        resource,
                        append_framed,
                        persist_framed,
                        framing: Default::default(),
                        call_timeout: limits.call_timeout,
                        calls: 0,
                    });
                }
                Err(e) => e,
            };
            if e.is::<wasmtime::PoolConcurrencyLimitError>()
                && super::lease::wait_for_retired(deadline)
            {
                continue;
            }
            let trap = Trap::new(&e, store.data(), limits.call_timeout);
            return Err(Trap {
                kind: trap.kind,
                cause: format!("could not instantiate the writer component: {}", trap.cause),
            });
        }
    }

    /// Runs one export call with a fresh CPU-time budget.
    fn call<T>(
        &mut self,
        f: impl FnOnce(
            &Changelog,
            &mut Store<WriterCtx>,
            ResourceAny,
        ) -> wasmtime::Result<Result<T, super::bindings::wit::WriterError>>,
    ) -> Call<T> {
        self.calls += 1;
        self.store.data_mut().clock = CallClock::new(self.call_timeout);
        self.store
            .set_epoch_deadline(deadline_ticks(self.call_timeout));
        match f(&self.bindings, &mut self.store, self.resource) {
            Ok(answer) => Ok(answer.map_err(from_wit_error)),
            Err(e) => Err(Trap::new(&e, self.store.data(), self.call_timeout)),
        }
    }

    /// `append-framed` of `batch` (framed while it is lowered): the guest's open bytes
    /// afterwards.
    pub fn append_batch(&mut self, batch: Batch<'_>) -> Call<u64> {
        let func = self.append_framed;
        self.framed_call(batch, |store, r, framed| {
            // SAFETY: its type was checked when the instance was made.
            let typed = unsafe {
                TypedFunc::<AppendFramedParams<'_>, AppendFramedResults>::new_unchecked(func)
            };
            Ok(typed.call(store, (r, framed))?.0)
        })
    }

    /// A call of an export that takes `batch` framed (`framed.rs`).
    fn framed_call<T>(
        &mut self,
        batch: Batch<'_>,
        f: impl FnOnce(
            &mut Store<WriterCtx>,
            ResourceAny,
            Framed<'_>,
        ) -> wasmtime::Result<Result<T, wit::WriterError>>,
    ) -> Call<T> {
        let mut framing = std::mem::take(&mut self.framing);
        let framed = framing.frame(batch);
        let answer = self.call(|_, store, r| f(store, r, framed));
        self.framing = framing;
        answer
    }

    /// `initial-sequence-number`.
    pub fn initial_sequence_number(&mut self) -> Call<u64> {
        self.call(|b, store, r| {
            b.dstl_changelog_writer()
                .writer()
                .call_initial_sequence_number(store, r)
                .map(Ok)
        })
    }

    /// `next-sequence-number`.
    pub fn next_sequence_number(&mut self) -> Call<u64> {
        self.call(|b, store, r| {
            b.dstl_changelog_writer()
                .writer()
                .call_next_sequence_number(store, r)
                .map(Ok)
        })
    }

    /// `persist-framed`: appends `batch` (framed while it is lowered), then persists. A
    /// snapshot ready at once counts as returned to the caller.
    pub fn persist(&mut self, batch: Batch<'_>, from: u64, checkpoint: i64) -> Call<PersistReply> {
        let func = self.persist_framed;
        let reply = self.framed_call(batch, |store, r, framed| {
            // SAFETY: its type was checked when the instance was made.
            let typed = unsafe {
                TypedFunc::<PersistFramedParams<'_>, PersistFramedResults>::new_unchecked(func)
            };
            Ok(typed
                .call(store, (r, framed, from, checkpoint))?
                .0
                .map(from_wit_reply))
        })?;
        if let Ok(PersistReply::Ready(snapshot)) = &reply {
            self.hand_out(snapshot)?;
        }
        Ok(reply)
    }

    /// `truncate`.
    pub fn truncate(&mut self, to: u64) -> Call<()> {
        self.call(|b, store, r| {
            b.dstl_changelog_writer()
                .writer()
                .call_truncate(store, r, to)
        })
    }

    /// `confirm`.
    pub fn confirm(&mut self, from: u64, to: u64, checkpoint: i64) -> Call<()> {
        self.call(|b, store, r| {
            b.dstl_changelog_writer()
                .writer()
                .call_confirm(store, r, from, to, checkpoint)
        })
    }

    /// `reset`.
    pub fn reset(&mut self, from: u64, to: u64, checkpoint: i64) -> Call<()> {
        self.call(|b, store, r| {
            b.dstl_changelog_writer()
                .writer()
                .call_reset(store, r, from, to, checkpoint)
        })
    }

    /// `truncate-and-close`: the persists it fails.
    pub fn truncate_and_close(&mut self, from: u64) -> Call<Vec<PersistCompletion>> {
        self.completions(|b, store, r| {
            b.dstl_changelog_writer()
                .writer()
                .call_truncate_and_close(store, r, from)
        })
    }

    /// `close`: the persists it fails.
    pub fn close(&mut self) -> Call<Vec<PersistCompletion>> {
        self.completions(|b, store, r| b.dstl_changelog_writer().writer().call_close(store, r))
    }

    /// The mailbox entry points: hands one upload outcome to the guest and returns the
    /// persists it completes.
    pub fn deliver(&mut self, outcome: UploadOutcome) -> Result<Vec<PersistCompletion>, Trap> {
        let answer = self.completions(|b, store, r| {
            let api = b.dstl_changelog_writer().writer();
            let returned = (store.data().keeper.as_ref()).map_or_else(Vec::new, |k| k.returned());
            let completions = match outcome {
                UploadOutcome::Succeeded { task, mut results } => {
                    let ctx = store.data_mut();
                    // A local copy this writer's discard already let go of (between the
                    // upload's end and this delivery) is not handed to it again.
                    let local_registry = &ctx.services.registries.local;
                    for result in &mut results {
                        if result
                            .local
                            .as_ref()
                            .is_some_and(|l| !local_registry.claims(ctx.id, &l.handle.path))
                        {
                            result.local = None;
                        }
                    }
                    ctx.holdings.add(&results);
                    let results: Vec<_> = results.into_iter().map(to_wit_result).collect();
                    api.call_on_upload_succeeded(store, r, task, &results, &returned)?
                }
                // Why is the host's: the writer keeps the typed error for the errors
                // naming the task (`writer::UploadFailures`).
                UploadOutcome::Failed { task, .. } => {
                    api.call_on_upload_failed(&mut *store, r, task, &returned)?
                }
            };
            Ok(Ok(completions))
        })?;
        Ok(answer.unwrap_or_default())
    }

    /// A call answering with completed persists; every snapshot among them counts as
    /// returned to the caller.
    fn completions(
        &mut self,
        f: impl FnOnce(
            &Changelog,
            &mut Store<WriterCtx>,
            ResourceAny,
        ) -> wasmtime::Result<
            Result<Vec<super::bindings::wit::PersistCompletion>, super::bindings::wit::WriterError>,
        >,
    ) -> Call<Vec<PersistCompletion>> {
        let completions = self.call(f)?.map(from_wit_completions);
        if let Ok(completions) = &completions {
            for completion in completions {
                if let Ok(snapshot) = &completion.outcome {
                    self.hand_out(snapshot)?;
                }
            }
        }
        Ok(completions)
    }

    /// A snapshot goes to the caller only if it names what this writer holds; otherwise
    /// the guest lied, and its sandbox ends with a guest fault.
    fn hand_out(&mut self, snapshot: &SnapshotResult) -> Result<(), Trap> {
        self.store
            .data_mut()
            .holdings
            .hand_out(snapshot)
            .map_err(|fault| Trap::new(&fault.into(), self.store.data(), self.call_timeout))
    }

    /// Releases what the guest holds that no returned snapshot names (the writer closed,
    /// or its sandbox is being dropped).
    pub fn release_unreturned(&mut self) {
        self.store.data_mut().release_unreturned();
    }
}

impl Drop for Instance {
    /// Blocks lent from this sandbox's memory may still be on their way into a file: the
    /// store (and with it the memory's pool slot) ends when the last of them does.
    fn drop(&mut self) {
        // SAFETY: `store` is not used again; this is the only place that takes it.
        let mut store = unsafe { ManuallyDrop::take(&mut self.store) };
        match store.data_mut().keeper.take() {
            Some(keeper) => keeper.retire(Box::new(store)),
            None => drop(store),
        }
    }
}
