//! Configuration: Flink's `state.changelog.dstl.dfs.*` keys (also accepted without the
//! `state.changelog.` prefix, as Flink's fallback keys) with Flink's defaults and value
//! syntax, plus dstl's own `dstl.*` keys.

use std::path::PathBuf;
use std::time::Duration;

use crate::store::Location;

mod syntax;

use dstl_proto::settings::{self, Setting, SettingError};
pub use dstl_proto::settings::{KEYS, RetryPolicyKind, parse_duration, parse_memory};
use syntax::flatten;

/// A key or value that cannot be used; the message names the key and the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// [`Config::set`] (and the files and pairs built on it) got a key dstl does not have
    /// (a typo, or a Flink key dstl does not implement). Worded by `dstl_proto::settings`,
    /// as on every host.
    #[error("{}", SettingError::UnknownKey(.0.clone()))]
    UnknownKey(String),
    /// A value that does not parse as the key's type, or lies outside its range;
    /// [`Config::validate`] also reports keys whose values contradict each other. Worded
    /// by `dstl_proto::settings`, as on every host.
    #[error("{}", invalid_value(key, value, expected))]
    InvalidValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// The accepted form.
        expected: &'static str,
    },
    /// [`Config::apply_pairs`] (`--conf`) got an item without `=`.
    #[error("`{0}` is not of the form key=value")]
    NotAPair(String),
    /// `dstl.dfs.base-path` is neither a directory nor a valid `s3://bucket/prefix` URL.
    #[error("invalid value for `{key}`: {reason}")]
    InvalidLocation {
        /// The key.
        key: String,
        /// What is wrong.
        #[source]
        reason: crate::store::LocationError,
    },
    /// [`Config::apply_file`]: the file cannot be read, is not TOML, holds a value of
    /// another type than string, number or boolean, or holds a key or value that
    /// [`Config::set`] rejects.
    #[error("configuration file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Effective configuration of a [`crate::ChangelogStorage`]: Flink's keys with Flink's
/// defaults ([`Config::default`]), changed only through [`Config::set`] (and what is
/// built on it: [`Config::with`], [`Config::apply_pairs`], [`Config::apply_file`] and the
/// typed setters), each of which validates the value, so a `Config` always holds usable
/// values. The getters read the effective values.
///
/// ```
/// use std::time::Duration;
///
/// let config = dstl::Config::new()
///     .with("dstl.dfs.base-path", "/var/lib/dstl")?
///     .with("state.changelog.dstl.dfs.upload.timeout", "2 s")?;
/// assert_eq!(config.upload_timeout(), Duration::from_secs(2));
/// assert!(dstl::Config::new().with("dstl.dfs.base-path", "ftp://x").is_err());
/// # Ok::<(), dstl::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Root directory for changelog files (`dstl.dfs.base-path`).
    pub(crate) base_path: PathBuf,
    /// Snappy-frame files (`dstl.dfs.compression.enabled`).
    pub(crate) compression: bool,
    /// Fsync every file and new directory of a local store before its upload counts
    /// (`dstl.dfs.local.fsync`). Off trades durability on power loss for speed, as
    /// Flink's local file system does; files still appear only whole.
    pub(crate) local_fsync: bool,
    /// Write fsync'd files of 256 KiB and more past the page cache with `O_DIRECT`
    /// (`dstl.dfs.local.direct-io`), where the file system allows it.
    pub(crate) local_direct_io: bool,
    /// Per-writer open bytes that trigger an upload (`dstl.dfs.preemptive-persist-threshold`).
    pub(crate) preemptive_persist_threshold: u64,
    /// Batching delay (`dstl.dfs.batch.persist-delay`).
    pub(crate) persist_delay: Duration,
    /// Queued bytes that force a batch (`dstl.dfs.batch.persist-size-threshold`).
    pub(crate) persist_size_threshold: u64,
    /// Write buffer of one upload to a local directory: change-set blocks are gathered into
    /// writes of this size (`dstl.dfs.upload.buffer-size`). An object store receives a
    /// file in one request.
    pub(crate) upload_buffer_size: u64,
    /// Concurrent uploads (`dstl.dfs.upload.num-threads`).
    pub(crate) upload_threads: usize,
    /// Threads deleting unused files, so at most this many deletions run at once
    /// (`dstl.dfs.discard.num-threads`).
    pub(crate) discard_threads: usize,
    /// In-flight byte limit (`dstl.dfs.upload.max-in-flight`).
    pub(crate) max_in_flight: u64,
    /// `fixed` or `none` (`dstl.dfs.upload.retry-policy`).
    pub(crate) retry_policy: RetryPolicyKind,
    /// Per-attempt timeout (`dstl.dfs.upload.timeout`).
    pub(crate) upload_timeout: Duration,
    /// Attempts including the first (`dstl.dfs.upload.max-attempts`).
    pub(crate) max_attempts: u32,
    /// Pause after a failed attempt (`dstl.dfs.upload.next-attempt-delay`).
    pub(crate) next_attempt_delay: Duration,
    /// Idle time after which a recovery cache file is dropped; 0 turns the cache off
    /// (`dstl.dfs.download.local-cache.idle-timeout-ms`).
    pub(crate) cache_idle_timeout: Duration,
    /// Bytes the recovery cache holds at most (`dstl.recovery.cache-size`).
    pub(crate) recovery_cache_size: u64,
    /// Job id, 32 lowercase hex characters; files go to `<base>/<job-id>/dstl/`
    /// (`dstl.job-id`, random by default).
    pub(crate) job_id: String,
    /// Keep a local copy of every upload and build local handles (`dstl.local-recovery.enabled`).
    pub(crate) local_recovery: bool,
    /// Where local copies go (`dstl.local-recovery.dir`, default `<base>/local`).
    pub(crate) local_dir: Option<PathBuf>,
    /// Linear-memory cap of one writer's sandbox (`dstl.writer.memory-limit`).
    pub(crate) writer_memory_limit: u64,
    /// Writers one storage can hold at once; sizes the instance pool (`dstl.writer.max-writers`).
    pub(crate) max_writers: u32,
    /// How long one call into a writer's sandbox may run before it is interrupted
    /// (`dstl.writer.call-timeout`).
    pub(crate) writer_call_timeout: Duration,
    /// Whether the wasm engine turns faults in guest code into traps through signal
    /// handlers (`dstl.writer.signals-based-traps`). Off, it checks bounds explicitly and
    /// installs no handler: what an embedding in a JVM needs, whose own SIGSEGV handler
    /// must stay in front.
    pub(crate) signals_based_traps: bool,
    /// Whether writers run on an engine of this storage's own or on one shared by every
    /// storage of the process opened with the same engine settings
    /// (`dstl.writer.engine`: `storage` or `process`). A shared engine reserves its
    /// instance pool (`dstl.writer.max-writers`) once per process, however many
    /// storages (jobs) are open, and `max-writers` then bounds them all together.
    pub(crate) shared_engine: bool,
    /// How to reach S3-compatible stores (`dstl.s3.*`).
    pub(crate) s3: crate::store::S3Settings,
    /// Distinct writer names that get a `writer` label of their own in the metrics; later
    /// ones report as `other` (`dstl.metrics.writer-label-limit`; see
    /// [`crate::telemetry`]).
    pub(crate) metrics_writer_label_limit: usize,
}

/// The effective values.
impl Config {
    /// Root directory for changelog files (`dstl.dfs.base-path`).
    pub fn base_path(&self) -> &std::path::Path {
        &self.base_path
    }

    /// Snappy-frame files (`dstl.dfs.compression.enabled`).
    pub fn compression(&self) -> bool {
        self.compression
    }

    /// Fsync every file and new directory of a local store before its upload counts
    /// (`dstl.dfs.local.fsync`). Off trades durability on power loss for speed, as
    /// Flink's local file system does; files still appear only whole.
    pub fn local_fsync(&self) -> bool {
        self.local_fsync
    }
    /// Write fsync'd files of 256 KiB and more past the page cache with `O_DIRECT`
    /// (`dstl.dfs.local.direct-io`), where the file system allows it.
    pub fn local_direct_io(&self) -> bool {
        self.local_direct_io
    }

    /// Per-writer open bytes that trigger an upload (`dstl.dfs.preemptive-persist-threshold`).
    pub fn preemptive_persist_threshold(&self) -> u64 {
        self.preemptive_persist_threshold
    }

    /// Batching delay (`dstl.dfs.batch.persist-delay`).
    pub fn persist_delay(&self) -> Duration {
        self.persist_delay
    }

    /// Queued bytes that force a batch (`dstl.dfs.batch.persist-size-threshold`).
    pub fn persist_size_threshold(&self) -> u64 {
        self.persist_size_threshold
    }

    /// Write buffer of one upload to a local directory: change-set blocks are gathered into
    /// writes of this size (`dstl.dfs.upload.buffer-size`). An object store receives a
    /// file in one request.
    pub fn upload_buffer_size(&self) -> u64 {
        self.upload_buffer_size
    }

    /// Concurrent uploads (`dstl.dfs.upload.num-threads`).
    pub fn upload_threads(&self) -> usize {
        self.upload_threads
    }

    /// Threads deleting unused files, so at most this many deletions run at once
    /// (`dstl.dfs.discard.num-threads`).
    pub fn discard_threads(&self) -> usize {
        self.discard_threads
    }

    /// In-flight byte limit (`dstl.dfs.upload.max-in-flight`).
    pub fn max_in_flight(&self) -> u64 {
        self.max_in_flight
    }

    /// `fixed` or `none` (`dstl.dfs.upload.retry-policy`).
    pub fn retry_policy(&self) -> RetryPolicyKind {
        self.retry_policy
    }

    /// Per-attempt timeout (`dstl.dfs.upload.timeout`).
    pub fn upload_timeout(&self) -> Duration {
        self.upload_timeout
    }

    /// Attempts including the first (`dstl.dfs.upload.max-attempts`).
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Pause after a failed attempt (`dstl.dfs.upload.next-attempt-delay`).
    pub fn next_attempt_delay(&self) -> Duration {
        self.next_attempt_delay
    }

    /// Idle time after which a recovery cache file is dropped; 0 turns the cache off
    /// (`dstl.dfs.download.local-cache.idle-timeout-ms`).
    pub fn cache_idle_timeout(&self) -> Duration {
        self.cache_idle_timeout
    }

    /// Bytes the recovery cache holds at most (`dstl.recovery.cache-size`).
    pub fn recovery_cache_size(&self) -> u64 {
        self.recovery_cache_size
    }

    /// Job id, 32 lowercase hex characters; files go to `<base>/<job-id>/dstl/`
    /// (`dstl.job-id`, random by default).
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// Keep a local copy of every upload and build local handles (`dstl.local-recovery.enabled`).
    pub fn local_recovery(&self) -> bool {
        self.local_recovery
    }

    /// Where local copies go (`dstl.local-recovery.dir`, default `<base>/local`).
    pub fn local_dir(&self) -> Option<&std::path::Path> {
        self.local_dir.as_deref()
    }

    /// Linear-memory cap of one writer's sandbox (`dstl.writer.memory-limit`).
    pub fn writer_memory_limit(&self) -> u64 {
        self.writer_memory_limit
    }

    /// Writers one storage can hold at once; sizes the instance pool (`dstl.writer.max-writers`).
    pub fn max_writers(&self) -> u32 {
        self.max_writers
    }

    /// How long one call into a writer's sandbox may run before it is interrupted
    /// (`dstl.writer.call-timeout`).
    pub fn writer_call_timeout(&self) -> Duration {
        self.writer_call_timeout
    }

    /// Whether the wasm engine turns faults in guest code into traps through signal
    /// handlers (`dstl.writer.signals-based-traps`). Off, it checks bounds explicitly and
    /// installs no handler: what an embedding in a JVM needs, whose own SIGSEGV handler
    /// must stay in front.
    pub fn signals_based_traps(&self) -> bool {
        self.signals_based_traps
    }

    /// Whether writers run on an engine of this storage's own or on one shared by every
    /// storage of the process opened with the same engine settings
    /// (`dstl.writer.engine`: `storage` or `process`). A shared engine reserves its
    /// instance pool (`dstl.writer.max-writers`) once per process, however many
    /// storages (jobs) are open, and `max-writers` then bounds them all together.
    pub fn shared_engine(&self) -> bool {
        self.shared_engine
    }

    /// How to reach S3-compatible stores (`dstl.s3.*`).
    pub fn s3(&self) -> &crate::store::S3Settings {
        &self.s3
    }

    /// Distinct writer names that get a `writer` label of their own in the metrics; later
    /// ones report as `other` (`dstl.metrics.writer-label-limit`; see
    /// [`crate::telemetry`]).
    pub fn metrics_writer_label_limit(&self) -> usize {
        self.metrics_writer_label_limit
    }
}

impl Default for Config {
    /// The defaults of `dstl_proto::settings` and a random job id.
    fn default() -> Self {
        let mut config = Self {
            base_path: PathBuf::new(),
            compression: false,
            local_fsync: false,
            local_direct_io: false,
            preemptive_persist_threshold: 0,
            persist_delay: Duration::ZERO,
            persist_size_threshold: 0,
            upload_buffer_size: 0,
            upload_threads: 0,
            discard_threads: 0,
            max_in_flight: 0,
            retry_policy: RetryPolicyKind::Fixed,
            upload_timeout: Duration::ZERO,
            max_attempts: 0,
            next_attempt_delay: Duration::ZERO,
            cache_idle_timeout: Duration::ZERO,
            recovery_cache_size: 0,
            job_id: uuid::Uuid::new_v4().simple().to_string(),
            local_recovery: false,
            local_dir: None,
            writer_memory_limit: 0,
            max_writers: 0,
            writer_call_timeout: Duration::ZERO,
            signals_based_traps: false,
            shared_engine: false,
            s3: crate::store::S3Settings::default(),
            metrics_writer_label_limit: 0,
        };
        for setting in settings::defaults() {
            let key = setting.key();
            config
                .apply(key, setting)
                .expect("the defaults are valid settings");
        }
        config
    }
}

/// The shared wording of [`ConfigError::InvalidValue`].
fn invalid_value(key: &str, value: &str, expected: &'static str) -> SettingError {
    SettingError::InvalidValue {
        key: key.to_string(),
        value: value.to_string(),
        expected,
    }
}

/// `d` in the key syntax, exactly (nanoseconds), for the typed setters: a typed value
/// passes the same checks as its text.
fn nanos(d: Duration) -> String {
    format!("{} ns", d.as_nanos())
}

impl From<SettingError> for ConfigError {
    fn from(e: SettingError) -> Self {
        match e {
            SettingError::UnknownKey(key) => ConfigError::UnknownKey(key),
            SettingError::InvalidValue {
                key,
                value,
                expected,
            } => ConfigError::InvalidValue {
                key,
                value,
                expected,
            },
        }
    }
}

impl Config {
    /// The defaults (Flink's), with a random job id: the same as [`Config::default`].
    pub fn new() -> Self {
        Self::default()
    }

    /// This configuration with `key` set to `value` (see [`Config::set`]), for chaining.
    pub fn with(mut self, key: &str, value: &str) -> Result<Self, ConfigError> {
        self.set(key, value)?;
        Ok(self)
    }

    /// Sets where files go (`dstl.dfs.base-path`): a directory, or `s3://bucket/prefix`
    /// (crate feature `s3`). A path that is not UTF-8 is refused.
    pub fn set_base_path(&mut self, base: impl AsRef<std::path::Path>) -> Result<(), ConfigError> {
        let base = base.as_ref();
        let text = base.to_str().ok_or_else(|| ConfigError::InvalidValue {
            key: "dstl.dfs.base-path".into(),
            value: base.display().to_string(),
            expected: "a UTF-8 directory path or s3://bucket/prefix",
        })?;
        self.set("dstl.dfs.base-path", text)
    }

    /// Sets the job id (`dstl.job-id`): 32 lowercase hexadecimal characters (Flink's
    /// `JobID`), which names the job's directory.
    pub fn set_job_id(&mut self, job_id: &str) -> Result<(), ConfigError> {
        self.set("dstl.job-id", job_id)
    }

    /// Sets whether files are Snappy-framed (`dstl.dfs.compression.enabled`).
    pub fn set_compression(&mut self, enabled: bool) {
        self.compression = enabled;
    }

    /// Sets whether local files are fsync'd before their upload counts
    /// (`dstl.dfs.local.fsync`).
    pub fn set_local_fsync(&mut self, enabled: bool) {
        self.local_fsync = enabled;
    }

    /// Sets whether every upload also gets a local copy (`dstl.local-recovery.enabled`).
    pub fn set_local_recovery(&mut self, enabled: bool) {
        self.local_recovery = enabled;
    }

    /// Sets the open bytes per writer that trigger an upload before any checkpoint
    /// (`dstl.dfs.preemptive-persist-threshold`).
    pub fn set_preemptive_persist_threshold(&mut self, bytes: u64) {
        self.preemptive_persist_threshold = bytes;
    }

    /// Sets the batching delay (`dstl.dfs.batch.persist-delay`): at most 1 day.
    pub fn set_persist_delay(&mut self, delay: Duration) -> Result<(), ConfigError> {
        self.set("dstl.dfs.batch.persist-delay", &nanos(delay))
    }

    /// Sets the in-flight byte limit (`dstl.dfs.upload.max-in-flight`): at least 1 byte.
    pub fn set_max_in_flight(&mut self, bytes: u64) -> Result<(), ConfigError> {
        self.set("dstl.dfs.upload.max-in-flight", &bytes.to_string())
    }

    /// Sets the per-attempt upload timeout (`dstl.dfs.upload.timeout`; zero waits
    /// forever): at most 1 day.
    pub fn set_upload_timeout(&mut self, timeout: Duration) -> Result<(), ConfigError> {
        self.set("dstl.dfs.upload.timeout", &nanos(timeout))
    }

    /// Sets the attempts per upload, the first included (`dstl.dfs.upload.max-attempts`):
    /// at least 1.
    pub fn set_max_attempts(&mut self, attempts: u32) -> Result<(), ConfigError> {
        self.set("dstl.dfs.upload.max-attempts", &attempts.to_string())
    }

    /// Applies one `key=value` setting: `key` is one of [`KEYS`] (also with the prefix
    /// `state.changelog.`), `value` in Flink's syntax for the key's type (`5mb`,
    /// `10 ms`, `true`). Rejected keys and values leave the configuration unchanged.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let setting = settings::parse(key, value)?;
        self.apply(key, setting)
    }

    /// Takes a parsed setting (`key` as given, for messages); only the base path has a
    /// check of this host's (whether it is a location it can use).
    fn apply(&mut self, key: &str, setting: Setting) -> Result<(), ConfigError> {
        match setting {
            Setting::BasePath(path) => {
                Location::parse(&path).map_err(|reason| ConfigError::InvalidLocation {
                    key: key.to_string(),
                    reason,
                })?;
                self.base_path = PathBuf::from(path);
            }
            Setting::Compression(on) => self.compression = on,
            Setting::LocalFsync(on) => self.local_fsync = on,
            Setting::LocalDirectIo(on) => self.local_direct_io = on,
            Setting::PreemptivePersistThreshold(n) => self.preemptive_persist_threshold = n,
            Setting::PersistDelay(d) => self.persist_delay = d,
            Setting::PersistSizeThreshold(n) => self.persist_size_threshold = n,
            Setting::UploadBufferSize(n) => self.upload_buffer_size = n,
            Setting::UploadThreads(n) => self.upload_threads = n as usize,
            Setting::DiscardThreads(n) => self.discard_threads = n as usize,
            Setting::MaxInFlight(n) => self.max_in_flight = n,
            Setting::RetryPolicy(kind) => self.retry_policy = kind,
            Setting::UploadTimeout(d) => self.upload_timeout = d,
            Setting::MaxAttempts(n) => self.max_attempts = n,
            Setting::NextAttemptDelay(d) => self.next_attempt_delay = d,
            Setting::CacheIdleTimeout(d) => self.cache_idle_timeout = d,
            Setting::RecoveryCacheSize(n) => self.recovery_cache_size = n,
            Setting::JobId(id) => self.job_id = id,
            Setting::LocalRecovery(on) => self.local_recovery = on,
            Setting::LocalDir(dir) => self.local_dir = Some(PathBuf::from(dir)),
            Setting::WriterMemoryLimit(n) => self.writer_memory_limit = n,
            Setting::MaxWriters(n) => self.max_writers = n,
            Setting::WriterCallTimeout(d) => self.writer_call_timeout = d,
            Setting::SignalsBasedTraps(on) => self.signals_based_traps = on,
            Setting::SharedEngine(shared) => self.shared_engine = shared,
            Setting::S3Endpoint(url) => self.s3.endpoint = Some(url),
            Setting::S3Region(region) => self.s3.region = Some(region),
            Setting::S3AccessKeyId(id) => self.s3.access_key_id = Some(id),
            Setting::S3SecretAccessKey(secret) => self.s3.secret_access_key = Some(secret),
            Setting::S3AllowHttp(on) => self.s3.allow_http = Some(on),
            Setting::S3RequestTimeout(d) => self.s3.request_timeout = Some(d),
            Setting::MetricsWriterLabelLimit(n) => self.metrics_writer_label_limit = n as usize,
        }
        Ok(())
    }

    /// Applies `key=value` pairs in order.
    pub fn apply_pairs<'a>(
        &mut self,
        pairs: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ConfigError> {
        for pair in pairs {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| ConfigError::NotAPair(pair.to_string()))?;
            self.set(key.trim(), value)?;
        }
        Ok(())
    }

    /// Reads a TOML file of settings and applies them. Keys may be written dotted
    /// (`"dstl.dfs.compression.enabled" = true`) or as tables (`[dstl.dfs]`,
    /// `compression.enabled = true`); values may be strings, numbers or booleans.
    pub fn apply_file(&mut self, path: &std::path::Path) -> Result<(), ConfigError> {
        let file_error = |reason: String| ConfigError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| file_error(e.to_string()))?;
        let mut pairs = Vec::new();
        flatten("", &toml::Value::Table(table), &mut pairs)
            .map_err(|e| file_error(e.to_string()))?;
        for (key, value) in pairs {
            self.set(&key, &value)
                .map_err(|e| file_error(e.to_string()))?;
        }
        Ok(())
    }

    /// Where the files go.
    pub fn location(&self) -> Location {
        Location::parse(&self.base_path.to_string_lossy())
            .expect("base path was validated when it was set")
    }

    /// Checks relations between keys: Flink's scheduler constructor check (a batch fits
    /// within the in-flight limit), and that the writers' instance pool fits in the
    /// address space (`dstl.writer.max-writers` memories of up to
    /// `dstl.writer.memory-limit` each, two per writer, reserved up front).
    pub fn validate(&self) -> Result<(), ConfigError> {
        settings::check_batch_size(self.persist_size_threshold, self.max_in_flight)?;
        let reserved = crate::sandbox::pool_reservation(
            self.max_writers,
            self.writer_memory_limit,
            self.signals_based_traps,
        );
        if reserved > crate::sandbox::MAX_POOL_RESERVATION {
            return Err(ConfigError::InvalidValue {
                key: "dstl.writer.max-writers".into(),
                value: self.max_writers.to_string(),
                expected: "fewer writers: with dstl.writer.memory-limit (and, with \
                    dstl.writer.signals-based-traps=true, 4 GiB of guarded address space per \
                    memory), the instance pool would reserve more than 24 TiB of address space",
            });
        }
        Ok(())
    }

    /// The directory (or URL) holding this job's changelog files.
    pub fn job_dir(&self) -> PathBuf {
        match self.location() {
            Location::Local(dir) => dir.join(&self.job_id).join("dstl"),
            Location::S3 { bucket, prefix } => {
                let prefix = if prefix.is_empty() {
                    String::new()
                } else {
                    format!("{prefix}/")
                };
                PathBuf::from(format!("s3://{bucket}/{prefix}{}/dstl", self.job_id))
            }
        }
    }

    /// The directory holding local copies (Flink's `jid_<job>/taskowned`); by default
    /// under the base directory, or `./dstl-local` when the base is an object store.
    pub fn local_copies_dir(&self) -> PathBuf {
        let default = match self.location() {
            Location::Local(dir) => dir.join("local"),
            Location::S3 { .. } => PathBuf::from("dstl-local"),
        };
        self.local_dir
            .clone()
            .unwrap_or(default)
            .join(format!("jid_{}", self.job_id))
            .join("taskowned")
    }

    /// Every key with its effective value, in [`KEYS`] order.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| format!("{} ms", d.as_millis());
        let values = [
            self.base_path.display().to_string(),
            self.compression.to_string(),
            self.local_fsync.to_string(),
            self.local_direct_io.to_string(),
            format!("{}b", self.preemptive_persist_threshold),
            ms(self.persist_delay),
            format!("{}b", self.persist_size_threshold),
            format!("{}b", self.upload_buffer_size),
            self.upload_threads.to_string(),
            self.discard_threads.to_string(),
            format!("{}b", self.max_in_flight),
            match self.retry_policy {
                RetryPolicyKind::Fixed => "fixed".into(),
                RetryPolicyKind::None => "none".into(),
            },
            ms(self.upload_timeout),
            self.max_attempts.to_string(),
            ms(self.next_attempt_delay),
            ms(self.cache_idle_timeout),
            format!("{}b", self.recovery_cache_size),
            self.job_id.clone(),
            self.local_recovery.to_string(),
            self.local_copies_dir().display().to_string(),
            format!("{}b", self.writer_memory_limit),
            self.max_writers.to_string(),
            ms(self.writer_call_timeout),
            self.signals_based_traps.to_string(),
            if self.shared_engine {
                "process"
            } else {
                "storage"
            }
            .into(),
            self.s3
                .endpoint
                .clone()
                .unwrap_or_else(|| "(AWS_ENDPOINT_URL)".into()),
            self.s3
                .region
                .clone()
                .unwrap_or_else(|| "(AWS_REGION, else us-east-1)".into()),
            self.s3
                .access_key_id
                .clone()
                .unwrap_or_else(|| "(AWS_ACCESS_KEY_ID)".into()),
            match self.s3.secret_access_key {
                Some(_) => "(set)".into(),
                None => "(AWS_SECRET_ACCESS_KEY)".into(),
            },
            self.s3
                .allow_http
                .map_or_else(|| "(loopback endpoints only)".into(), |b| b.to_string()),
            self.s3
                .request_timeout
                .map_or_else(|| "30000 ms".into(), ms),
            self.metrics_writer_label_limit.to_string(),
        ];
        KEYS.iter().copied().zip(values).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_with_and_without_prefix() {
        let mut c = Config::default();
        c.apply_pairs([
            "state.changelog.dstl.dfs.compression.enabled=true",
            "dstl.dfs.preemptive-persist-threshold=600b",
        ])
        .unwrap();
        assert!(c.compression);
        assert_eq!(c.preemptive_persist_threshold, 600);
    }

    #[test]
    fn toml_file_dotted_and_nested() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dstl.toml");
        std::fs::write(
            &file,
            "\"state.changelog.dstl.dfs.upload.timeout\" = \"2 s\"\n[dstl.dfs]\ncompression.enabled = true\nupload.max-attempts = 4\n",
        )
        .unwrap();
        let mut c = Config::default();
        c.apply_file(&file).unwrap();
        assert_eq!(c.upload_timeout, Duration::from_secs(2));
        assert!(c.compression);
        assert_eq!(c.max_attempts, 4);
        std::fs::write(&file, "[dstl.dfs]\nupload.timeot = \"1s\"\n").unwrap();
        let e = Config::default().apply_file(&file).unwrap_err().to_string();
        assert!(
            e.contains("dstl.toml") && e.contains("`dstl.dfs.upload.timeot`"),
            "{e}"
        );
        std::fs::write(&file, "[dstl.dfs\n").unwrap();
        assert!(Config::default().apply_file(&file).is_err());
    }

    #[test]
    #[cfg(not(feature = "s3"))]
    fn store_urls_need_the_s3_feature() {
        let e = Config::new()
            .with("dstl.dfs.base-path", "s3://bucket/a")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dstl.dfs.base-path") && e.contains("crate feature `s3`"),
            "{e}"
        );
    }

    #[test]
    #[cfg(feature = "s3")]
    fn store_urls_are_validated() {
        let mut c = Config::default();
        c.set("dstl.dfs.base-path", "s3://bucket/a/b").unwrap();
        assert_eq!(
            c.location(),
            Location::S3 {
                bucket: "bucket".into(),
                prefix: "a/b".into()
            }
        );
        assert_eq!(
            c.job_dir(),
            PathBuf::from(format!("s3://bucket/a/b/{}/dstl", c.job_id))
        );
        for bad in [
            "s3://bucket/../x",
            "s3://bucket/a//b",
            "s3://B/x",
            "s3://bucket/a\\b",
            "gs://x/y",
            "s3://bucket/a\u{0}b",
        ] {
            let e = c.set("dstl.dfs.base-path", bad).unwrap_err().to_string();
            assert!(e.contains("dstl.dfs.base-path"), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_the_key() {
        let mut c = Config::default();
        let e = c.set("dstl.dfs.nope", "1").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "unknown configuration key `dstl.dfs.nope` (the keys, also with the prefix `state.changelog.`: {})",
                KEYS.join(", ")
            )
        );
        let e = c.set("dstl.dfs.upload.timeout", "soon").unwrap_err();
        assert!(e.to_string().contains("`dstl.dfs.upload.timeout`"), "{e}");
        let e = c.set("dstl.dfs.upload.retry-policy", "Fixed").unwrap_err();
        assert!(e.to_string().contains("`fixed` or `none`"), "{e}");
        assert!(matches!(
            c.apply_pairs(["novalue"]),
            Err(ConfigError::NotAPair(_))
        ));
        c.set("dstl.dfs.batch.persist-size-threshold", "200mb")
            .unwrap();
        assert!(c.validate().is_err());
        c.set(
            "state.changelog.dstl.dfs.download.local-cache.idle-timeout-ms",
            "1 min",
        )
        .unwrap();
        assert_eq!(c.cache_idle_timeout, Duration::from_secs(60));
    }
}
