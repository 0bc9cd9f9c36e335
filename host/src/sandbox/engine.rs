//! The wasmtime engine shared by every writer of a storage: pooling allocator, epoch
//! ticker for call deadlines, and the pre-linked writer component.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use wasmtime::component::{Component, Linker};
use wasmtime::{Config as WasmConfig, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::ChangelogPre;
use super::cache::load_component;
use super::context::WriterCtx;

/// Compiled component plus linker, instantiated once per writer.
pub(crate) struct Runtime {
    pub engine: Engine,
    pub pre: ChangelogPre<WriterCtx>,
    linker: Linker<WriterCtx>,
    ticker: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

/// Another build of the writer component, compiled for one storage's engine
/// ([`crate::ChangelogStorage::compile_component`]) and chosen per writer with
/// [`crate::WriterOptions::component`]. It must implement the same WIT world.
#[derive(Clone)]
pub struct WriterComponent {
    pub(crate) pre: Arc<ChangelogPre<WriterCtx>>,
}

impl std::fmt::Debug for WriterComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriterComponent")
    }
}

/// Epoch ticks for a call deadline of `timeout`: one more than it spans, so a call is
/// never interrupted before `timeout` has passed, whenever in a tick it starts.
pub(crate) fn deadline_ticks(timeout: std::time::Duration) -> u64 {
    (timeout.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64 + 1
}

/// How often the engine's epoch advances; the resolution of call deadlines.
pub(crate) const EPOCH_TICK: std::time::Duration = std::time::Duration::from_millis(1);

/// What an engine is built from; storages whose settings are equal can share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineSettings {
    /// Instances the pool holds at once.
    pub max_writers: u32,
    /// Largest linear memory of one writer.
    pub memory_limit: u64,
    /// Traps through signal handlers (faster bounds checks) or explicit checks only.
    pub signals_based_traps: bool,
}

/// Engines shared by the storages of this process (`dstl.writer.engine = process`),
/// kept while some storage uses them.
static SHARED: Mutex<Vec<(EngineSettings, Weak<Runtime>)>> = Mutex::new(Vec::new());

/// The most address space a pool may reserve: x86-64 gives a process 128 TiB, and a
/// reservation of 32 TiB was the largest one that a default Linux granted at once, here.
pub(crate) const MAX_POOL_RESERVATION: u128 = 24 << 40;

/// The address space the instance pool reserves up front: two memories per writer, each
/// at its limit with explicit bounds checks, or at 4 GiB plus wasmtime's 32 MiB guard
/// region when faults trap through signal handlers (bounds checks are then elided).
pub(crate) fn pool_reservation(
    max_writers: u32,
    memory_limit: u64,
    signals_based_traps: bool,
) -> u128 {
    let per_memory = if signals_based_traps {
        u128::from(memory_limit.max(4 << 30)) + (32 << 20)
    } else {
        u128::from(memory_limit)
    };
    u128::from(max_writers) * 2 * per_memory
}

impl Runtime {
    /// The process's engine for `settings`, created on first use and shared by every
    /// storage that asks for the same settings while one of them is open. One pool
    /// reservation per process, instead of one per storage: a TaskManager running many
    /// jobs (one storage each) reserves address space once.
    pub fn shared(settings: EngineSettings) -> wasmtime::Result<Arc<Self>> {
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        shared.retain(|(_, runtime)| runtime.strong_count() > 0);
        if let Some(runtime) = shared
            .iter()
            .find(|(s, _)| *s == settings)
            .and_then(|(_, runtime)| runtime.upgrade())
        {
            return Ok(runtime);
        }
        let runtime = Arc::new(Self::new(settings)?);
        shared.push((settings, Arc::downgrade(&runtime)));
        Ok(runtime)
    }

    /// One engine with the pooling allocator sized for `max_writers` instances whose
    /// memories may grow to `memory_limit` bytes (address space: [`pool_reservation`]).
    pub fn new(settings: EngineSettings) -> wasmtime::Result<Self> {
        let EngineSettings {
            max_writers,
            memory_limit,
            signals_based_traps,
        } = settings;
        let mut pool = PoolingAllocationConfig::default();
        // Each writer is one component instance of 3 core modules and about 19 core
        // instances (measured); leave headroom.
        pool.total_component_instances(max_writers)
            .total_core_instances(max_writers.saturating_mul(24))
            .total_memories(max_writers.saturating_mul(2))
            .total_tables(max_writers.saturating_mul(8))
            .max_memory_size(memory_limit as usize);
        let mut config = WasmConfig::new();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        // Guest calls get a deadline: a call that runs away (a bug, a hostile batch)
        // is interrupted with a trap instead of holding its writer forever.
        config.epoch_interruption(true);
        // Off, no signal handler is installed and out-of-bounds accesses are caught by
        // explicit checks; a host process with handlers of its own (a JVM) keeps them.
        config.signals_based_traps(signals_based_traps);
        // Uploads write blocks from where they lie in a guest's memory (`lease`): a
        // memory must never move, so growth happens in its pool slot or fails.
        config.memory_may_move(false);
        if !signals_based_traps {
            // Bounds are checked explicitly either way, so guard regions buy nothing:
            // reserve each memory at its limit only. The pool then reserves `max_writers`
            // × 2 × the limit of address space (512 GiB for 1024 writers of 256 MB)
            // instead of × 2 × (4 GiB + guards), which matters where address space is
            // capped (`ulimit -v`) or many pools share a process.
            config
                .memory_reservation(memory_limit)
                .memory_guard_size(0)
                .memory_reservation_for_growth(0);
        }
        let engine = Engine::new(&config)?;
        let component = load_component(&engine)?;
        let mut linker: Linker<WriterCtx> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        super::imports::add_to_linker(&mut linker)?;
        let pre = ChangelogPre::new(linker.instantiate_pre(&component)?)?;
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let (engine, stop) = (engine.clone(), stop.clone());
            std::thread::Builder::new()
                .name("dstl-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })?
        };
        Ok(Self {
            engine,
            pre,
            linker,
            ticker: Some((stop, ticker)),
        })
    }

    /// Compiles and links another build of the writer component.
    pub fn compile(&self, wasm: &[u8]) -> wasmtime::Result<WriterComponent> {
        let component = Component::new(&self.engine, wasm)?;
        let pre = ChangelogPre::new(self.linker.instantiate_pre(&component)?)?;
        Ok(WriterComponent { pre: Arc::new(pre) })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some((stop, ticker)) = self.ticker.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = ticker.join();
        }
    }
}
