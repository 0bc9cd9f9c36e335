//! [`ChangelogStorage`]: one per process or job. It owns the wasm engine, the upload
//! machinery and the registries that all its writers share.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dstl_guest::codec::Change;
use dstl_guest::types::{ChangelogHandle, KeyGroupRange, UploadResult, WriterConfig};

use crate::background::Outstanding;
use crate::component::{Runtime as Wasm, WriterComponent};
use crate::config::Config;
use crate::error::Error;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::reader::ReadError;
use crate::registry::{Discarder, LocalRegistry, TaskRegistry, WriterId};
use crate::retry::RetryPolicy;
use crate::scheduler::Scheduler;
use crate::store::{FileSource, LocalStore, Location, S3Store, Store, Stores};
use crate::throttle::Availability;
use crate::uploader::Uploader;
use crate::writer::{Writer, WriterOptions};

/// State shared by the storage and every writer's sandbox.
pub(crate) struct Shared {
    pub config: Config,
    pub remote: Arc<dyn Store>,
    pub files: FileSource,
    pub wasm: Wasm,
    pub scheduler: Arc<Scheduler>,
    pub task_registry: TaskRegistry,
    pub local_registry: LocalRegistry,
    pub discarder: Discarder,
    pub outstanding: Outstanding,
    pub metrics: Arc<Metrics>,
    next_writer: AtomicU64,
}

impl Shared {
    /// Writer `writer` no longer needs one change set in `path`: a store file's count
    /// is in the task registry, a local copy's claim in the local registry.
    pub fn release(&self, writer: WriterId, path: &str, local: bool) {
        if local {
            self.local_registry.release(writer, path);
        } else {
            self.task_registry.release(path);
        }
    }

    /// Releases every file reference `results` hold (their writer cannot take them).
    pub fn release_results(&self, writer: WriterId, results: &[UploadResult]) {
        crate::uploader::release_results(
            &self.task_registry,
            &self.local_registry,
            writer,
            results,
        );
    }
}

/// The changelog storage of one job: creates writers and reads snapshots back.
pub struct ChangelogStorage {
    shared: Arc<Shared>,
    closed: Arc<AtomicBool>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl ChangelogStorage {
    /// Opens the storage described by `config`: creates `<base>/<job-id>/dstl/` (and the
    /// local-copy directory with local recovery on) and compiles the writer component.
    pub fn open(config: Config) -> Result<Self, Error> {
        let store: Arc<dyn Store> = match config.location() {
            Location::Local(_) => {
                let job_dir = config.job_dir();
                let store = LocalStore::open(&job_dir).map_err(|e| {
                    Error::Setup(format!(
                        "cannot create the changelog directory {}: {e}",
                        job_dir.display()
                    ))
                })?;
                Arc::new(store.with_buffer_size(config.upload_buffer_size as usize))
            }
            Location::S3 { bucket, prefix } => Arc::new(
                S3Store::open(&config.s3, &bucket, &prefix, &config.job_id)
                    .map_err(Error::Setup)?,
            ),
        };
        Self::open_with_store(config, store)
    }

    /// Opens a storage whose uploads go to `store` instead of `<base>/<job-id>/dstl/`.
    pub fn open_with_store(config: Config, store: Arc<dyn Store>) -> Result<Self, Error> {
        config.validate()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(config.upload_threads + 2)
            .thread_name("dstl-io")
            .enable_all()
            .build()
            .map_err(|e| Error::Setup(format!("cannot start the I/O runtime: {e}")))?;
        let local = if config.local_recovery {
            let dir = config.local_copies_dir();
            let store = LocalStore::open(&dir).map_err(|e| {
                Error::Setup(format!(
                    "cannot create the local-copy directory {}: {e}",
                    dir.display()
                ))
            })?;
            Some(store.with_buffer_size(config.upload_buffer_size as usize))
        } else {
            None
        };
        let wasm = Wasm::new(config.max_writers, config.writer_memory_limit)
            .map_err(|e| Error::Setup(format!("cannot load the writer component: {e:#}")))?;
        let outstanding = Outstanding::default();
        let stores = Stores {
            remote: store.clone(),
            local: local.clone(),
        };
        let discarder = Discarder::new(config.discard_threads, outstanding.clone(), stores)
            .map_err(|e| Error::Setup(format!("cannot start the deletion threads: {e}")))?;
        let task_registry = TaskRegistry::new(discarder.clone());
        let metrics = Arc::new(Metrics::default());
        let closed = Arc::new(AtomicBool::new(false));
        let uploader = Arc::new(Uploader {
            store: store.clone(),
            local,
            compression: config.compression,
            metrics: metrics.clone(),
        });
        let local_registry = LocalRegistry::new(discarder.clone());
        let scheduler = Scheduler::new(
            config.persist_delay,
            config.persist_size_threshold,
            config.max_in_flight,
            RetryPolicy::from_config(&config),
            config.upload_threads,
            uploader,
            task_registry.clone(),
            local_registry.clone(),
            runtime.handle().clone(),
            outstanding.clone(),
            metrics.clone(),
        );
        Ok(Self {
            shared: Arc::new(Shared {
                files: FileSource::new(Some(config.s3.clone())),
                remote: store,
                config,
                wasm,
                scheduler,
                task_registry,
                local_registry,
                discarder,
                outstanding,
                metrics,
                next_writer: AtomicU64::new(1),
            }),
            closed,
            runtime: Some(runtime),
        })
    }

    /// Creates a writer (one sandboxed component instance) for an operator.
    pub fn create_writer(&self, name: &str, key_groups: KeyGroupRange) -> Result<Writer, Error> {
        self.create_writer_with(name, key_groups, WriterOptions::default())
    }

    /// Creates a writer with per-writer sandbox options.
    pub fn create_writer_with(
        &self,
        name: &str,
        key_groups: KeyGroupRange,
        options: WriterOptions,
    ) -> Result<Writer, Error> {
        if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
            return Err(Error::InvalidArgument(format!(
                "invalid writer name {name:?}: need 1 to 256 characters and no control characters"
            )));
        }
        if key_groups.start < 0 || key_groups.start > key_groups.end {
            return Err(Error::InvalidArgument(format!(
                "invalid key-group range [{}, {}] for writer {name}: need 0 <= start <= end",
                key_groups.start, key_groups.end
            )));
        }
        if let Some(limit) = options.memory_limit
            && limit > self.shared.config.writer_memory_limit
        {
            return Err(Error::InvalidArgument(format!(
                "memory limit {limit} of writer {name} exceeds the storage's dstl.writer.memory-limit {}",
                self.shared.config.writer_memory_limit
            )));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(format!(
                "cannot create writer {name}: the storage is closed"
            )));
        }
        let config = WriterConfig {
            name: name.to_string(),
            key_group_range: key_groups,
            preemptive_persist_threshold: self.shared.config.preemptive_persist_threshold,
            local_recovery: self.shared.config.local_recovery,
        };
        let id = self.shared.next_writer.fetch_add(1, Ordering::Relaxed);
        Writer::create(self.shared.clone(), id, config, options)
    }

    /// Compiles another build of the writer component for this storage's engine, for
    /// [`WriterOptions::component`]. It must implement the same WIT world
    /// (`dstl:changelog@0.1.0`); a component that does not is refused here.
    pub fn compile_component(&self, wasm: &[u8]) -> Result<WriterComponent, Error> {
        self.shared
            .wasm
            .compile(wasm)
            .map_err(|e| Error::Setup(format!("cannot load the writer component: {e:#}")))
    }

    /// A sandboxed instance of the component's own decoder (the `reader` export).
    pub fn component_decoder(&self) -> Result<crate::writer::ComponentDecoder, Error> {
        crate::writer::ComponentDecoder::new(&self.shared)
    }

    /// Reads a snapshot back (recovery).
    pub fn read(&self, handle: &ChangelogHandle) -> Result<Vec<Change>, ReadError> {
        crate::reader::read_handle(handle, &self.shared.files)
    }

    /// The store uploads go to.
    pub fn store(&self) -> &dyn Store {
        &*self.shared.remote
    }

    /// The effective configuration.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Upload metrics (spec §9.2).
    pub fn metrics(&self) -> MetricsSnapshot {
        let scheduler = &self.shared.scheduler;
        self.shared
            .metrics
            .snapshot(scheduler.queue_size(), scheduler.throttle.in_flight())
    }

    /// Whether uploads are accepted without blocking: an operator can wait on this
    /// instead of blocking in `persist` or in an append that triggers a pre-emptive
    /// persist.
    pub fn availability(&self) -> Availability {
        Availability::new(self.shared.scheduler.throttle.subscribe())
    }

    /// The task registry (reference counts of files not yet owned by a checkpoint).
    pub fn task_registry(&self) -> &TaskRegistry {
        &self.shared.task_registry
    }

    /// The local registry (local copies per checkpoint).
    pub fn local_registry(&self) -> &LocalRegistry {
        &self.shared.local_registry
    }

    /// Blocks until every upload and deletion started so far has finished and its
    /// outcome was handed to its writer.
    pub fn wait_idle(&self) {
        self.shared.outstanding.wait_idle();
    }

    /// Stops accepting uploads: queued tasks fail with a closed error, writers waiting
    /// for capacity are woken with one, and batches already running get up to
    /// `max-attempts × timeout` (at least 5 s) to finish and deliver. Batches still
    /// running after that are abandoned: their persists fail, and a file such an upload
    /// may still write is an orphan for `dstl gc`. Deletions queued so far get the same
    /// grace; later ones (writers that outlive the storage) run on their caller's thread.
    /// Writers still open get an upload error on their next persist.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.scheduler.close();
        let config = &self.shared.config;
        let grace =
            (config.upload_timeout * config.max_attempts).max(std::time::Duration::from_secs(5));
        let started = std::time::Instant::now();
        if !self.shared.outstanding.wait_idle_timeout(grace) {
            let abandoned = self.shared.scheduler.abandon_running();
            if abandoned > 0 {
                tracing::warn!(
                    ?grace,
                    abandoned,
                    "uploads still running at close were abandoned: their persists failed; a file one may still write is an orphan that `dstl gc` collects"
                );
            }
        }
        self.shared
            .discarder
            .close(grace.saturating_sub(started.elapsed()));
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for ChangelogStorage {
    fn drop(&mut self) {
        self.shutdown();
    }
}
