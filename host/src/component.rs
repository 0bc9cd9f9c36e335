//! The wasmtime side of the component: generated bindings, the engine and the
//! pre-instantiated component shared by every writer, and conversions between the
//! generated WIT types and the plain types of [`dstl_guest::types`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use dstl_guest::types as t;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config as WasmConfig, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

wasmtime::component::bindgen!({
    world: "changelog",
    path: "../wit",
    // An import may trap its caller: the host refuses calls naming files the writer does
    // not hold (a guest fault).
    imports: { default: trappable },
});

pub(crate) use self::dstl::changelog::types as w;

/// The component as built by `build.rs`.
const GUEST_WASM: &[u8] = include_bytes!(env!("DSTL_GUEST_WASM_PATH"));

/// Compiled component plus linker, instantiated once per writer.
pub(crate) struct Runtime {
    pub engine: Engine,
    pub pre: ChangelogPre<crate::writer::WriterCtx>,
    linker: Linker<crate::writer::WriterCtx>,
    ticker: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

/// Another build of the writer component, compiled for one storage's engine
/// ([`crate::ChangelogStorage::compile_component`]) and chosen per writer with
/// [`crate::WriterOptions::component`]. It must implement the same WIT world.
#[derive(Clone)]
pub struct WriterComponent {
    pub(crate) pre: Arc<ChangelogPre<crate::writer::WriterCtx>>,
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

impl Runtime {
    /// One engine with the pooling allocator sized for `max_writers` instances whose
    /// memories may grow to `memory_limit` bytes.
    pub fn new(max_writers: u32, memory_limit: u64) -> wasmtime::Result<Self> {
        let mut pool = PoolingAllocationConfig::default();
        // Each writer is one component instance of 3 core modules and about 19 core
        // instances (spec/WASM-NOTES.md); leave headroom.
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
        let engine = Engine::new(&config)?;
        let component = load_component(&engine)?;
        let mut linker: Linker<crate::writer::WriterCtx> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        Changelog::add_to_linker::<_, HasSelf<_>>(&mut linker, |ctx| ctx)?;
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

/// Where compiled components are cached: `$DSTL_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/dstl`, else `~/.cache/dstl`; `DSTL_CACHE_DIR=off` disables the cache.
fn cache_dir() -> Option<std::path::PathBuf> {
    match std::env::var_os("DSTL_CACHE_DIR") {
        Some(dir) if dir == "off" => None,
        Some(dir) => Some(dir.into()),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
            .map(|d| d.join("dstl")),
    }
}

/// Compiles the component, or loads it precompiled from the cache (about 80 ms of
/// Cranelift saved per process). The cache key covers the component's bytes, the
/// wasmtime version and every engine setting that affects compiled code, so a stale or
/// foreign entry is never loaded; a broken entry is compiled over.
fn load_component(engine: &Engine) -> wasmtime::Result<Component> {
    use std::hash::{Hash, Hasher};
    let Some(dir) = cache_dir() else {
        return Component::new(engine, GUEST_WASM);
    };
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    GUEST_WASM.hash(&mut hasher);
    env!("CARGO_PKG_VERSION").hash(&mut hasher);
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let path = dir.join(format!("writer-{:016x}.cwasm", hasher.finish()));
    if path.is_file() {
        // SAFETY: the file is one this code wrote into the user's own cache directory,
        // for exactly this component and engine configuration (the key above).
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring a broken cached component")
            }
        }
    }
    let component = Component::new(engine, GUEST_WASM)?;
    let stored = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let bytes = component
            .serialize()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let tmp = dir.join(format!(".{}.{}", uuid::Uuid::new_v4(), std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = stored {
        tracing::debug!(dir = %dir.display(), error = %e, "could not cache the compiled component");
    }
    Ok(component)
}

pub(crate) fn from_wit_stream(h: w::StreamHandle) -> t::StreamHandle {
    t::StreamHandle {
        path: h.path,
        file_size: h.file_size,
    }
}

fn to_wit_stream(h: t::StreamHandle) -> w::StreamHandle {
    w::StreamHandle {
        path: h.path,
        file_size: h.file_size,
    }
}

pub(crate) fn to_wit_results(results: Vec<t::UploadResult>) -> Vec<w::UploadResult> {
    results
        .into_iter()
        .map(|r| w::UploadResult {
            sequence_number: r.sequence_number,
            remote: to_wit_stream(r.remote),
            offset: r.offset,
            local: r.local.map(|l| w::LocalCopy {
                handle: to_wit_stream(l.handle),
                offset: l.offset,
            }),
            size: r.size,
        })
        .collect()
}

fn from_wit_handle(h: w::ChangelogHandle) -> t::ChangelogHandle {
    t::ChangelogHandle {
        entries: h
            .entries
            .into_iter()
            .map(|e| t::HandleEntry {
                handle: from_wit_stream(e.handle),
                offset: e.offset,
                size: e.size,
            })
            .collect(),
        key_group_range: t::KeyGroupRange {
            start: h.key_group_range.start,
            end: h.key_group_range.end,
        },
        state_size: h.state_size,
        incremental_size: h.incremental_size,
        storage_id: h.storage_id,
    }
}

pub(crate) fn from_wit_snapshot(s: w::SnapshotResult) -> t::SnapshotResult {
    t::SnapshotResult {
        remote: from_wit_handle(s.remote),
        local: s.local.map(from_wit_handle),
    }
}

pub(crate) fn from_wit_error(e: w::WriterError) -> t::WriterError {
    match e {
        w::WriterError::Closed(m) => t::WriterError::Closed(m),
        w::WriterError::Truncated(m) => t::WriterError::Truncated(m),
        w::WriterError::NotYetAppended(m) => t::WriterError::NotYetAppended(m),
        w::WriterError::AlreadyFailed(m) => t::WriterError::AlreadyFailed(m),
        w::WriterError::InvalidRange(m) => t::WriterError::InvalidRange(m),
        w::WriterError::InvalidArgument(m) => t::WriterError::InvalidArgument(m),
        w::WriterError::UploadFailed(m) => t::WriterError::UploadFailed(m),
    }
}

pub(crate) fn to_wit_config(c: &t::WriterConfig) -> w::WriterConfig {
    w::WriterConfig {
        name: c.name.clone(),
        key_group_range: w::KeyGroupRange {
            start: c.key_group_range.start,
            end: c.key_group_range.end,
        },
        preemptive_persist_threshold: c.preemptive_persist_threshold,
        local_recovery: c.local_recovery,
    }
}

pub(crate) fn from_wit_task(task: w::UploadTask) -> t::UploadTask {
    t::UploadTask {
        id: task.id,
        change_sets: task
            .change_sets
            .into_iter()
            .map(|c| t::ChangeSetBlock {
                sequence_number: c.sequence_number,
                size: c.size,
                block: c.block,
            })
            .collect(),
    }
}
