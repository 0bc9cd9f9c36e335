//! [`ChangelogStorage`]: one per process or job. It owns the wasm engine, the upload
//! machinery and the registries that all its writers share.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dstl_proto::codec::Change;
use dstl_proto::types::{ChangelogHandle, KeyGroupRange, WriterConfig};

use crate::background::Outstanding;
use crate::config::Config;
use crate::error::Error;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::recovery::Recovery;
use crate::recovery::reader::{self, ReadError};
use crate::registry::{Discarder, LocalRegistry, Registries, TaskRegistry};
use crate::sandbox::{ComponentCodec, EngineSettings, Runtime, WriterComponent};
use crate::services::Services;
use crate::store::lease::Lease;
use crate::store::{FileSource, LocalStore, Location, S3Store, Store, Stores};
use crate::telemetry::WriterLabels;
use crate::upload::buffers::BlockPool;
use crate::upload::scheduler::SchedulerSettings;
use crate::upload::throttle::Availability;
use crate::upload::{RetryPolicy, Scheduler, Uploader};
use crate::writer::{Writer, WriterOptions};

/// The changelog storage of one job: creates writers and reads snapshots back.
pub struct ChangelogStorage {
    services: Arc<Services>,
    /// The engine and the pre-linked writer component.
    wasm: Arc<Runtime>,
    /// Where uploads go.
    remote: Arc<dyn Store>,
    /// Reads files named by handles.
    files: FileSource,
    next_writer: AtomicU64,
    closed: AtomicBool,
    /// Runs uploads and the batching timer.
    io: Option<tokio::runtime::Runtime>,
    /// Tells `dstl gc` that this storage is open and may hold files of the job that no
    /// manifest names yet; released at close.
    lease: Option<Lease>,
}

impl ChangelogStorage {
    /// Opens the storage described by `config`: creates `<base>/<job-id>/dstl/` (and the
    /// local-copy directory with local recovery on) and compiles the writer component.
    pub fn open(config: Config) -> Result<Self, Error> {
        let store: Arc<dyn Store> = match config.location() {
            Location::Local(_) => {
                let job_dir = config.job_dir();
                let store = LocalStore::open(&job_dir).map_err(|e| {
                    Error::setup(
                        format!(
                            "cannot create the changelog directory {}",
                            job_dir.display()
                        ),
                        e,
                    )
                })?;
                Arc::new(
                    store
                        .with_buffer_size(config.upload_buffer_size as usize)
                        .with_fsync(config.local_fsync),
                )
            }
            Location::S3 { bucket, prefix } => Arc::new(
                S3Store::open(&config.s3, &bucket, &prefix, &config.job_id).map_err(|e| {
                    Error::setup(format!("cannot open the object store s3://{bucket}"), e)
                })?,
            ),
        };
        Self::open_with_store(config, store)
    }

    /// Opens a storage whose uploads go to `store` instead of `<base>/<job-id>/dstl/`.
    pub fn open_with_store(config: Config, store: Arc<dyn Store>) -> Result<Self, Error> {
        config.validate()?;
        let lease = Lease::take(&config.location(), &config.s3, &config.job_id)
            .map_err(|e| Error::setup("cannot take the job's lease", e))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(config.upload_threads + 2)
            .thread_name("dstl-io")
            .enable_all()
            .build()
            .map_err(|e| Error::setup("cannot start the I/O runtime", e))?;
        let local = if config.local_recovery {
            let dir = config.local_copies_dir();
            let store = LocalStore::open(&dir).map_err(|e| {
                Error::setup(
                    format!("cannot create the local-copy directory {}", dir.display()),
                    e,
                )
            })?;
            Some(
                store
                    .with_buffer_size(config.upload_buffer_size as usize)
                    .with_fsync(config.local_fsync),
            )
        } else {
            None
        };
        let settings = EngineSettings {
            max_writers: config.max_writers,
            memory_limit: config.writer_memory_limit,
            signals_based_traps: config.signals_based_traps,
        };
        let wasm = if config.shared_engine {
            Runtime::shared(settings)
        } else {
            Runtime::new(settings).map(Arc::new)
        }
        .map_err(|e| Error::sandbox_setup("cannot load the writer component", &e))?;
        let outstanding = Outstanding::default();
        let stores = Stores {
            remote: store.clone(),
            local: local.clone(),
        };
        let discarder = Discarder::new(config.discard_threads, outstanding.clone(), stores)
            .map_err(|e| Error::setup("cannot start the deletion threads", e))?;
        let registries = Registries {
            task: TaskRegistry::new(discarder.clone()),
            local: LocalRegistry::new(discarder.clone()),
        };
        crate::telemetry::describe();
        let metrics = Arc::new(Metrics::default());
        let uploader = Arc::new(Uploader {
            // Enough spare buffers for a few batches' blocks and files.
            buffers: Arc::new(BlockPool::new(
                (config.persist_size_threshold.max(16 << 20) as usize).min(64 << 20),
            )),
            store: store.clone(),
            local,
            compression: config.compression,
            metrics: metrics.clone(),
        });
        let scheduler = Scheduler::new(
            SchedulerSettings {
                delay: config.persist_delay,
                size_threshold: config.persist_size_threshold,
                max_in_flight: config.max_in_flight,
                policy: RetryPolicy::from_config(&config),
                threads: config.upload_threads,
            },
            uploader,
            registries.clone(),
            runtime.handle().clone(),
            outstanding.clone(),
            metrics.clone(),
        );
        Ok(Self {
            files: FileSource::new(Some(config.s3.clone())),
            remote: store,
            wasm,
            services: Arc::new(Services {
                writer_labels: WriterLabels::new(config.metrics_writer_label_limit),
                config,
                scheduler,
                registries,
                discarder,
                outstanding,
                metrics,
            }),
            next_writer: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            io: Some(runtime),
            lease: Some(lease),
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
            && limit > self.services.config.writer_memory_limit
        {
            return Err(Error::InvalidArgument(format!(
                "memory limit {limit} of writer {name} exceeds the storage's dstl.writer.memory-limit {}",
                self.services.config.writer_memory_limit
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
            preemptive_persist_threshold: self.services.config.preemptive_persist_threshold,
            local_recovery: self.services.config.local_recovery,
        };
        let id = self.next_writer.fetch_add(1, Ordering::Relaxed);
        Writer::create(self.services.clone(), &self.wasm, id, config, options)
    }

    /// Compiles another build of the writer component for this storage's engine, for
    /// [`WriterOptions::component`]. It must implement the same WIT world
    /// (`dstl:changelog@0.1.0`); a component that does not is refused here.
    pub fn compile_component(&self, wasm: &[u8]) -> Result<WriterComponent, Error> {
        self.wasm
            .compile(wasm)
            .map_err(|e| Error::sandbox_setup("cannot load the writer component", &e))
    }

    /// A sandboxed instance of the component's own decoder (the `reader` export).
    pub fn component_codec(&self) -> Result<ComponentCodec, Error> {
        let config = &self.services.config;
        ComponentCodec::new(
            &self.wasm.pre,
            self.services.clone(),
            config.writer_memory_limit,
            config.writer_call_timeout,
        )
        .map_err(|trap| Error::Trapped {
            writer: "decoder".into(),
            kind: trap.kind,
            cause: trap.cause,
        })
    }

    /// Reads a snapshot back (recovery).
    pub fn read(&self, handle: &ChangelogHandle) -> Result<Vec<Change>, ReadError> {
        reader::read_handle(handle, &self.files)
    }

    /// A reader for recovering many snapshots, with this storage's settings (see
    /// [`Recovery`]).
    pub fn recovery(&self) -> Recovery {
        Recovery::new(&self.services.config)
    }

    /// The store uploads go to.
    pub fn store(&self) -> &dyn Store {
        &*self.remote
    }

    /// The effective configuration.
    pub fn config(&self) -> &Config {
        &self.services.config
    }

    /// Upload metrics (Flink's `ChangelogStorage.*`).
    pub fn metrics(&self) -> MetricsSnapshot {
        let scheduler = &self.services.scheduler;
        self.services
            .metrics
            .snapshot(scheduler.queue_size(), scheduler.throttle.in_flight())
    }

    /// Whether uploads are accepted without blocking: an operator can wait on this
    /// instead of blocking in `persist` or in an append that triggers a pre-emptive
    /// persist.
    pub fn availability(&self) -> Availability {
        Availability::new(self.services.scheduler.throttle.subscribe())
    }

    /// The task registry (reference counts of files not yet owned by a checkpoint).
    pub fn task_registry(&self) -> &TaskRegistry {
        &self.services.registries.task
    }

    /// The local registry (local copies per checkpoint).
    pub fn local_registry(&self) -> &LocalRegistry {
        &self.services.registries.local
    }

    /// Blocks until every upload and deletion started so far has finished and its
    /// outcome was handed to its writer.
    pub fn wait_idle(&self) {
        self.services.outstanding.wait_idle();
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
        let services = &self.services;
        services.scheduler.close();
        let config = &services.config;
        let grace =
            (config.upload_timeout * config.max_attempts).max(std::time::Duration::from_secs(5));
        let started = std::time::Instant::now();
        if !services.outstanding.wait_idle_timeout(grace) {
            let abandoned = services.scheduler.abandon_running();
            if abandoned > 0 {
                tracing::warn!(
                    ?grace,
                    abandoned,
                    "uploads still running at close were abandoned: their persists failed; a file one may still write is an orphan that `dstl gc` collects"
                );
            }
        }
        services
            .discarder
            .close(grace.saturating_sub(started.elapsed()));
        if let Some(runtime) = self.io.take() {
            runtime.shutdown_background();
        }
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
    }
}

impl Drop for ChangelogStorage {
    fn drop(&mut self) {
        self.shutdown();
    }
}
