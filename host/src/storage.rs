//! [`ChangelogStorage`]: one per process or job. It owns the wasm engine, the upload
//! machinery and the registries that all its writers share.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dstl_proto::codec::Change;
use dstl_proto::types::{ChangelogHandle, KeyGroupRange, WriterConfig};
use dstl_proto::writer_request::WriterRequest;

use crate::background::Outstanding;
use crate::config::{Config, WriterEngine};
use crate::error::Error;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::recovery::Recovery;
use crate::recovery::reader::{self, ReadError};
use crate::registry::{Discarder, LocalRegistry, Registries, TaskRegistry};
#[cfg(feature = "test-util")]
use crate::sandbox::ComponentCodec;
use crate::sandbox::{EngineSettings, Runtime, WriterComponent};
use crate::services::Services;
use crate::store::lease::Lease;
use crate::store::{FileSource, LocalStore, Location, S3Store, Store, Stores, job_key_prefix};
use crate::sync::LockExt;
use crate::telemetry::WriterLabels;
use crate::upload::buffers::BlockPool;
use crate::upload::scheduler::SchedulerSettings;
use crate::upload::throttle::Availability;
use crate::upload::{Scheduler, Uploader, retry};
use crate::writer::{Writer, WriterOptions};

/// The changelog storage of one job: creates writers and reads snapshots back.
///
/// Open one with [`ChangelogStorage::open`], or with [`ChangelogStorage::builder`] to
/// upload to a [`Store`] of your own or to run on your tokio runtime. Share it between
/// operators by reference or in an `Arc`; [`ChangelogStorage::close`] (or
/// [`ChangelogStorage::close_async`]) works through a shared reference.
pub struct ChangelogStorage {
    services: Arc<Services>,
    /// The engine and the pre-linked writer component.
    wasm: Arc<Runtime>,
    /// Where uploads go.
    remote: Arc<dyn Store>,
    /// Reads files named by handles.
    files: FileSource,
    next_writer: AtomicU64,
    /// What closing releases; shared with a close that runs on a thread of its own
    /// (`close_async`).
    closing: Arc<Closing>,
}

/// How to open a [`ChangelogStorage`]: its configuration, and optionally a store of the
/// caller's and a runtime of the caller's.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let config = dstl::Config::new().with("dstl.dfs.base-path", &dir.path().to_string_lossy())?;
/// let runtime = tokio::runtime::Runtime::new()?;
/// // Uploads, retries and the batching timer run on this runtime: no threads of dstl's own
/// // but the engine's epoch ticker, the deletion pool and the lease refresher.
/// let storage = dstl::ChangelogStorage::builder(config)
///     .runtime(runtime.handle().clone())
///     .open()?;
/// runtime.block_on(storage.close_async());
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `open` is called"]
pub struct StorageBuilder {
    config: Config,
    store: Option<Arc<dyn Store>>,
    runtime: Option<tokio::runtime::Handle>,
}

impl StorageBuilder {
    /// Uploads go to `store` instead of `<base>/<job-id>/dstl/` (the job's lease is still
    /// taken at the configured base, where `dstl gc` looks for it).
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Runs uploads, retries, the batching timer and the S3 client on `runtime` (a
    /// multi-threaded tokio runtime with I/O and time enabled; uploads use its blocking
    /// pool) instead of on runtimes of the storage's own. The runtime must outlive the
    /// storage's use: close the storage before shutting the runtime down.
    pub fn runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Opens the storage: validates the configuration, creates `<base>/<job-id>/dstl/`
    /// (and the local-copy directory with local recovery on), checks an object store's
    /// credentials, takes the job's lease and loads the writer component.
    pub fn open(self) -> Result<ChangelogStorage, Error> {
        ChangelogStorage::open_from(self)
    }
}

/// What [`ChangelogStorage::close`] releases, once.
struct Closing {
    closed: AtomicBool,
    services: Arc<Services>,
    /// The storage's own runtime, if it did not run on the caller's.
    io: Mutex<Option<tokio::runtime::Runtime>>,
    /// Tells `dstl gc` that this storage is open and may hold files of the job that no
    /// manifest names yet.
    lease: Mutex<Option<Lease>>,
}

/// The runtime uploads run on.
enum Io {
    Own(tokio::runtime::Runtime),
    Caller(tokio::runtime::Handle),
}

impl Io {
    fn handle(&self) -> tokio::runtime::Handle {
        match self {
            Io::Own(runtime) => runtime.handle().clone(),
            Io::Caller(handle) => handle.clone(),
        }
    }
}

impl ChangelogStorage {
    /// Opens the storage described by `config`, with runtimes of its own: see
    /// [`StorageBuilder::open`].
    pub fn open(config: Config) -> Result<Self, Error> {
        Self::builder(config).open()
    }

    /// A builder for a storage with a store or a runtime of the caller's.
    pub fn builder(config: Config) -> StorageBuilder {
        StorageBuilder {
            config,
            store: None,
            runtime: None,
        }
    }

    fn open_from(builder: StorageBuilder) -> Result<Self, Error> {
        let StorageBuilder {
            config,
            store,
            runtime,
        } = builder;
        config.validate()?;
        if let Some(handle) = &runtime
            && handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread
        {
            return Err(Error::InvalidArgument(
                "the runtime given to StorageBuilder::runtime must be a multi-threaded tokio \
                 runtime: uploads block on it from the writers' threads"
                    .into(),
            ));
        }
        let store = match store {
            Some(store) => store,
            None => Self::default_store(&config, runtime.clone())?,
        };
        let lease = Lease::take(
            &config.location(),
            &config.s3(),
            config.job_id(),
            runtime.clone(),
        )
        .map_err(|e| Error::setup("cannot take the job's lease", e))?;
        let io = match runtime {
            Some(handle) => Io::Caller(handle),
            None => Io::Own(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .max_blocking_threads(config.upload_threads as usize + 2)
                    .thread_name("dstl-io")
                    .enable_all()
                    .build()
                    .map_err(|e| Error::setup("cannot start the I/O runtime", e))?,
            ),
        };
        let local = if config.local_recovery {
            Some(local_store(
                &config,
                &config.local_copies_dir(),
                "local-copy directory",
            )?)
        } else {
            None
        };
        let settings = EngineSettings {
            max_writers: config.max_writers,
            memory_limit: config.writer_memory_limit,
            signals_based_traps: config.signals_based_traps,
        };
        let wasm = if config.engine == WriterEngine::Process {
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
        let discarder =
            Discarder::new(config.discard_threads as usize, outstanding.clone(), stores)
                .map_err(|e| Error::setup("cannot start the deletion threads", e))?;
        let registries = Registries {
            task: TaskRegistry::new(discarder.clone()),
            local: LocalRegistry::new(discarder.clone()),
        };
        crate::telemetry::describe();
        let metrics = Arc::new(Metrics::default());
        let uploader = Arc::new(Uploader {
            // Spare buffers for the blocks and files in flight at the high-water mark: a
            // buffer that misses the pool is fresh memory, whose pages the kernel zeroes
            // (for megabyte blocks that costs as much as their copy). The resident set
            // stays at what the in-flight limit let the uploads hold anyway.
            buffers: Arc::new(BlockPool::new(
                config.max_in_flight.clamp(16 << 20, 256 << 20) as usize,
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
                policy: retry::policy_from_config(&config),
                threads: config.upload_threads as usize,
            },
            uploader,
            registries.clone(),
            lease.watch(),
            io.handle(),
            outstanding.clone(),
            metrics.clone(),
        );
        let services = Arc::new(Services {
            writer_labels: WriterLabels::new(config.metrics_writer_label_limit as usize),
            config,
            scheduler,
            registries,
            lease: lease.watch(),
            discarder,
            outstanding,
            metrics,
        });
        Ok(Self {
            files: FileSource::new(Some(services.config.s3())),
            remote: store,
            wasm,
            next_writer: AtomicU64::new(1),
            closing: Arc::new(Closing {
                closed: AtomicBool::new(false),
                services: services.clone(),
                io: Mutex::new(match io {
                    Io::Own(runtime) => Some(runtime),
                    Io::Caller(_) => None,
                }),
                lease: Mutex::new(Some(lease)),
            }),
            services,
        })
    }

    /// The store `config` names: the job's directory under a local base, or its prefix in
    /// a bucket.
    fn default_store(
        config: &Config,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<Arc<dyn Store>, Error> {
        Ok(match config.location() {
            Location::Local(_) => Arc::new(local_store(
                config,
                &config.job_dir(),
                "changelog directory",
            )?),
            Location::S3 { bucket, prefix } => {
                let key_prefix = job_key_prefix(&prefix, config.job_id());
                Arc::new(
                    S3Store::open_at(&config.s3(), &bucket, &key_prefix, runtime).map_err(|e| {
                        Error::setup(format!("cannot open the object store s3://{bucket}"), e)
                    })?,
                )
            }
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
        WriterRequest {
            name,
            key_group_range: key_groups,
            memory_limit: options
                .memory_limit
                .unwrap_or(self.services.config.writer_memory_limit),
            call_timeout: options
                .call_timeout
                .unwrap_or(self.services.config.writer_call_timeout),
        }
        .check(self.services.config.writer_memory_limit)
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if self.closing.closed.load(Ordering::Acquire) {
            return Err(Error::StorageClosed {
                writer: name.to_string(),
            });
        }
        let config = WriterConfig {
            name: name.to_string(),
            key_group_range: key_groups,
            preemptive_persist_threshold: self.services.config.preemptive_persist_threshold,
            local_recovery: self.services.config.local_recovery,
            // The host reads a block's pieces in the guest's memory: large values are
            // copied out once.
            value_pieces: true,
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

    /// A sandboxed instance of the component's own decoder (the `reader` export), for
    /// dstl's tests that hold it against the host's codec (crate feature `test-util`;
    /// not a stable API).
    #[cfg(feature = "test-util")]
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

    /// The task registry (reference counts of files not yet owned by a checkpoint), for
    /// dstl's tests (crate feature `test-util`; not a stable API).
    #[cfg(feature = "test-util")]
    pub fn task_registry(&self) -> &TaskRegistry {
        &self.services.registries.task
    }

    /// The local registry (local copies per checkpoint), for dstl's tests (crate feature
    /// `test-util`; not a stable API).
    #[cfg(feature = "test-util")]
    pub fn local_registry(&self) -> &LocalRegistry {
        &self.services.registries.local
    }

    /// Makes the job's lease look unrefreshed for `gap`, as after the process was stopped
    /// that long, for dstl's tests of the lease's terms (crate feature `test-util`; not a
    /// stable API).
    #[cfg(feature = "test-util")]
    pub fn backdate_lease(&self, gap: std::time::Duration) {
        self.services.lease.backdate(gap);
    }

    /// Makes the next upload a writer schedules panic inside the scheduler, while the
    /// scheduler's queue and the writer are locked, as a defect of the host would: for
    /// dstl's tests that such a panic fails that writer alone, with a typed error, and
    /// breaks nothing else (crate feature `test-util`; not a stable API).
    #[cfg(feature = "test-util")]
    pub fn panic_in_next_schedule(&self) {
        self.services
            .scheduler
            .panic_next_submit
            .store(true, Ordering::SeqCst);
    }

    /// Refreshes the job's lease now (its refresher does every 30 s) and returns once
    /// that was tried, for dstl's tests (crate feature `test-util`; not a stable API).
    #[cfg(feature = "test-util")]
    pub fn refresh_lease_now(&self) {
        if let Some(lease) = self.closing.lease.locked().as_ref() {
            lease.refresh_now();
        }
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
    /// Writers still open get an upload error on their next persist. Releases the job's
    /// lease. Blocks while it waits; a second call returns at once. In async code, await
    /// [`ChangelogStorage::close_async`] instead.
    pub fn close(&self) {
        self.closing.close();
    }

    /// [`ChangelogStorage::close`] without blocking the calling task: the waiting runs
    /// on a thread of its own, and the returned future completes when it is done.
    pub fn close_async(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let closing = self.closing.clone();
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let on_thread = closing.clone();
        let spawned = std::thread::Builder::new()
            .name("dstl-close".into())
            .spawn(move || {
                on_thread.close();
                let _ = done.send(());
            });
        async move {
            match spawned {
                Ok(_) => {
                    let _ = finished.await;
                }
                // No thread to spare: close here, blocking, rather than not at all.
                Err(e) => {
                    tracing::warn!(error = %e, "no thread for an asynchronous close; closing on the caller's");
                    closing.close();
                }
            }
        }
    }
}

impl Closing {
    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let services = &self.services;
        services.scheduler.close();
        let config = &services.config;
        let grace = config
            .upload_timeout
            .saturating_mul(config.max_attempts)
            .max(std::time::Duration::from_secs(5));
        let started = std::time::Instant::now();
        if !services.outstanding.wait_idle_timeout(grace) {
            let abandoned = services.scheduler.abandon_running();
            if abandoned > 0 {
                tracing::warn!(
                    ?grace,
                    abandoned,
                    "uploads still running at close were abandoned: their persists failed; a file one may still write is an orphan for orphan collection (dstl::gc)"
                );
            }
        }
        services
            .discarder
            .close(grace.saturating_sub(started.elapsed()));
        if let Some(runtime) = self.io.locked().take() {
            runtime.shutdown_background();
        }
        if let Some(lease) = self.lease.locked().take() {
            // What is left of the grace (a moment at least: deleting a lease is one small
            // request), so a store that does not answer holds the close no longer.
            lease.release(
                grace
                    .saturating_sub(started.elapsed())
                    .max(std::time::Duration::from_millis(200)),
            );
        }
    }
}

/// A local store in `dir` (the `what` of errors) writing as `config` says.
fn local_store(config: &Config, dir: &std::path::Path, what: &str) -> Result<LocalStore, Error> {
    let store = LocalStore::open(dir)
        .map_err(|e| Error::setup(format!("cannot create the {what} {}", dir.display()), e))?;
    Ok(store
        .with_buffer_size(config.upload_buffer_size as usize)
        .with_fsync(config.local_fsync)
        .with_direct_io(config.local_direct_io))
}

impl Drop for ChangelogStorage {
    fn drop(&mut self) {
        self.closing.close();
    }
}
