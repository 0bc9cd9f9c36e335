//! The store data of one writer's sandbox: what its imports need, the files the guest
//! holds, and the clock of the call running now.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

use dstl_proto::types::{SnapshotResult, StreamHandle, UploadResult};
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

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
    /// An upload failure is being delivered: the scheduler has logged it already, so
    /// the guest's warning about it goes to debug level.
    pub delivering_failure: bool,
    /// A `persist` call runs now: uploads it schedules belong to a checkpoint; uploads
    /// scheduled by any other call are pre-emptive.
    pub persisting: bool,
    /// `dstl_writer_preemptive_uploads_total` of this writer.
    preemptive_uploads: metrics::Counter,
    /// Why the last `schedule` of the running call was refused: the guest gets it as
    /// text, the caller as the typed error ([`crate::Error::Upload`]).
    pub refused: Option<crate::upload::UploadError>,
}

/// What ties a sandbox to the writer around it.
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
            delivering_failure: false,
            persisting: false,
            preemptive_uploads,
            refused: None,
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

/// A guest call the host refuses: the guest named a file it does not hold. The writer is
/// trapped, since a guest that does this is buggy or hostile.
#[derive(Debug, thiserror::Error)]
#[error("guest fault: {0}")]
pub(crate) struct GuestFault(pub String);

/// One file the guest holds references to.
#[derive(Debug)]
pub(crate) struct Holding {
    /// Change sets in the file delivered to the guest and not released by it.
    pub refs: u64,
    /// A local copy (owned in the local registry) rather than a store file.
    pub local: bool,
    /// A snapshot naming the file was returned to the caller: a checkpoint may use it.
    handed_out: bool,
}

/// What the host delivered to the guest of one file: all a snapshot it returns may name.
#[derive(Debug)]
struct Delivered {
    /// The file's logical size, as delivered.
    file_size: u64,
    /// `(offset, size)` of every change set in the file delivered to the guest.
    change_sets: HashSet<(u64, u64)>,
}

/// How many files the guest released are still remembered as delivered. A snapshot may
/// name change sets the guest has released already (a persist that started before a
/// truncate, for instance); pending persists are few, so the most recent files suffice,
/// and the record stays bounded for a writer that lives for weeks.
const RELEASED_KEPT: usize = 1024;

/// The files the guest holds references to, as the host delivered them. The guest may
/// release, stop tracking or register only these; when its sandbox goes away, the host
/// releases those no returned snapshot names.
#[derive(Default)]
pub(crate) struct Holdings {
    held: HashMap<String, Holding>,
    /// Every held file, and the last [`RELEASED_KEPT`] released ones.
    delivered: HashMap<String, Delivered>,
    /// Released files in the order they were released (a file held again may be listed).
    released: VecDeque<String>,
}

impl Holdings {
    /// The guest was given `results`.
    pub fn add(&mut self, results: &[UploadResult]) {
        for result in results {
            self.add_one(&result.remote, false, result.offset, result.size);
            if let Some(local) = &result.local {
                self.add_one(&local.handle, true, local.offset, result.size);
            }
        }
    }

    fn add_one(&mut self, file: &StreamHandle, local: bool, offset: u64, size: u64) {
        self.held
            .entry(file.path.clone())
            .or_insert(Holding {
                refs: 0,
                local,
                handed_out: false,
            })
            .refs += 1;
        self.delivered
            .entry(file.path.clone())
            .or_insert_with(|| Delivered {
                file_size: file.file_size,
                change_sets: HashSet::new(),
            })
            .change_sets
            .insert((offset, size));
    }

    /// Whether `path` is a held local copy; a fault if the guest does not hold it.
    pub fn check(&self, path: &str, operation: &str) -> Result<bool, GuestFault> {
        match self.held.get(path) {
            Some(holding) if holding.refs > 0 => Ok(holding.local),
            _ => Err(GuestFault(format!(
                "{operation} of {path}, a file this writer does not hold"
            ))),
        }
    }

    /// Drops one reference; whether the file is a local copy.
    pub fn release(&mut self, path: &str) -> Result<bool, GuestFault> {
        let local = self.check(path, "release")?;
        let holding = self.held.get_mut(path).expect("checked");
        holding.refs -= 1;
        if holding.refs == 0 {
            self.held.remove(path);
            self.remember_released(path);
        }
        Ok(local)
    }

    /// Keeps what was delivered of `path`, no longer held, among the last released files.
    fn remember_released(&mut self, path: &str) {
        self.released.push_back(path.to_string());
        while self.released.len() > RELEASED_KEPT {
            let oldest = self.released.pop_front().expect("longer than the bound");
            if !self.held.contains_key(&oldest) && !self.released.contains(&oldest) {
                self.delivered.remove(&oldest);
            }
        }
    }

    /// Checks a snapshot the guest returns for the caller and marks its files. Every
    /// entry must be a change set the host delivered to this writer: a guest that names
    /// another writer's change sets or a local path of its choosing would have recovery
    /// read what it has no claim to.
    pub fn hand_out(&mut self, snapshot: &SnapshotResult) -> Result<(), GuestFault> {
        let entries = || {
            let local = snapshot.local.iter().flat_map(|l| &l.entries);
            snapshot.remote.entries.iter().chain(local)
        };
        for entry in entries() {
            let path = &entry.handle.path;
            let Some(delivered) = self.delivered.get(path) else {
                return Err(GuestFault(format!(
                    "a returned snapshot names {path}, a file never delivered to this writer"
                )));
            };
            if entry.handle.file_size != delivered.file_size
                || !delivered.change_sets.contains(&(entry.offset, entry.size))
            {
                return Err(GuestFault(format!(
                    "a returned snapshot names a change set of {path} at offset {} of {} bytes \
                     (file size {}) that was never delivered to this writer",
                    entry.offset, entry.size, entry.handle.file_size
                )));
            }
        }
        for entry in entries() {
            if let Some(holding) = self.held.get_mut(&entry.handle.path) {
                holding.handed_out = true;
            }
        }
        Ok(())
    }

    /// Local copies the local registry discarded for this writer: the guest forgets them.
    pub fn forget(&mut self, paths: &[String]) {
        for path in paths {
            if self.held.remove(path).is_some() {
                self.remember_released(path);
            }
        }
    }

    /// Takes the references no returned snapshot covers, to release them. The others stay
    /// held: a checkpoint the coordinator knows about may still need those files.
    fn take_unreturned(&mut self) -> Vec<(String, Holding)> {
        let mut unreturned = Vec::new();
        self.held.retain(|path, holding| {
            if !holding.handed_out {
                unreturned.push((
                    path.clone(),
                    Holding {
                        refs: std::mem::take(&mut holding.refs),
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
