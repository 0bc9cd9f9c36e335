//! The store data of one writer's sandbox: what its imports need, the files the guest
//! holds, and the clock of the call running now.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

pub(crate) use dstl_proto::ownership::{GuestFault, Holdings};
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::lease::Keeper;
use crate::registry::WriterId;
use crate::services::Services;
use crate::upload::OutcomeSink;

/// Store data of one writer's sandbox.
pub(crate) struct WriterCtx {
    pub name: String,
    pub id: WriterId,
    wasi: WasiCtx,
    table: ResourceTable,
    pub limits: StoreLimits,
    /// The cap of `limits` in bytes, which also bounds what one call may lift out of the
    /// guest (see `instance::new_store`).
    pub memory_limit: u64,
    pub stderr: MemoryOutputPipe,
    pub services: Arc<Services>,
    /// Where the outcomes of the tasks this writer schedules go (its mailbox).
    pub sink: Weak<dyn OutcomeSink>,
    /// Set when the writer is closing: a `schedule` waiting for in-flight capacity
    /// gives up.
    pub closing: Arc<AtomicBool>,
    /// The files the guest holds references to.
    pub holdings: Holdings,
    /// CPU time of the call running now.
    pub clock: CallClock,
    /// `dstl_writer_preemptive_uploads_total` of this writer.
    preemptive_uploads: metrics::Counter,
    /// Keeps this sandbox's memory for the blocks lent from it (taken out when the
    /// instance is dropped, see `Instance`'s `Drop`).
    pub keeper: Option<Arc<Keeper>>,
}

/// What ties a sandbox to the writer around it.
#[derive(Clone)]
pub(crate) struct WriterLinks {
    /// The writer's mailbox.
    pub sink: Weak<dyn OutcomeSink>,
    /// The writer's closing flag.
    pub closing: Arc<AtomicBool>,
    /// `dstl_writer_preemptive_uploads_total` of the writer.
    pub preemptive_uploads: metrics::Counter,
}

impl WriterCtx {
    pub fn new(
        name: &str,
        id: WriterId,
        memory_limit: u64,
        call_timeout: Duration,
        services: Arc<Services>,
        links: WriterLinks,
    ) -> Self {
        let WriterLinks {
            sink,
            closing,
            preemptive_uploads,
        } = links;
        let stderr = MemoryOutputPipe::new(64 * 1024);
        Self {
            name: name.to_string(),
            id,
            wasi: WasiCtx::builder().stderr(stderr.clone()).build(),
            table: ResourceTable::new(),
            memory_limit,
            limits: StoreLimitsBuilder::new()
                .memory_size(memory_limit as usize)
                .trap_on_grow_failure(true)
                .build(),
            stderr,
            services,
            sink,
            closing,
            holdings: Holdings::default(),
            clock: CallClock::new(call_timeout),
            preemptive_uploads,
            keeper: Some(Arc::default()),
        }
    }

    /// Counts an upload the guest scheduled before any checkpoint.
    pub fn count_preemptive_upload(&self) {
        self.preemptive_uploads.increment(1);
    }

    /// Releases every reference the guest holds that no returned snapshot covers: its
    /// sandbox is gone or closed, so it never will.
    pub fn release_unreturned(&mut self) {
        for (path, holding) in self.holdings.take_unreturned() {
            for _ in 0..holding.refs {
                self.services
                    .registries
                    .release(self.id, &path, holding.local);
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

/// The CPU time the call running now has used: a call is limited in what it computes.
/// Time its thread spends blocked in the host (waiting for in-flight capacity in
/// `schedule`) or waiting for a CPU on a busy machine does not count.
pub(crate) struct CallClock {
    started: Duration,
    pub budget: Duration,
}

impl CallClock {
    /// A clock for a call that may use `budget` of CPU time, starting now.
    pub fn new(budget: Duration) -> Self {
        Self {
            started: thread_cpu_time(),
            budget,
        }
    }

    /// CPU time used so far.
    pub fn guest_time(&self) -> Duration {
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
