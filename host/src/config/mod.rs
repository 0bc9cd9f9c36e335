//! Configuration: Flink's `state.changelog.dstl.dfs.*` keys (also accepted without the
//! `state.changelog.` prefix, as Flink's fallback keys) with Flink's defaults and value
//! syntax, plus dstl's own `dstl.*` keys.

use std::path::PathBuf;
use std::time::Duration;

use crate::store::Location;

mod syntax;

use dstl_proto::settings::{self, Setting, SettingError};
pub use dstl_proto::settings::{KEYS, RetryPolicyKind, parse_duration, parse_memory};
pub use dstl_proto::settings::{Settings, WriterEngine};
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
/// values. Its effective values are the fields of [`Settings`], read through `Deref`
/// (`config.upload_timeout`), each documented with its key.
///
/// ```
/// use std::time::Duration;
///
/// let config = dstl::Config::new()
///     .with("dstl.dfs.base-path", "/var/lib/dstl")?
///     .with("state.changelog.dstl.dfs.upload.timeout", "2 s")?;
/// assert_eq!(config.upload_timeout, Duration::from_secs(2));
/// assert!(dstl::Config::new().with("dstl.dfs.base-path", "ftp://x").is_err());
/// # Ok::<(), dstl::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Every key's value; `job_id` is always set (random by default).
    settings: Settings,
}

impl std::ops::Deref for Config {
    type Target = Settings;

    fn deref(&self) -> &Settings {
        &self.settings
    }
}

impl Default for Config {
    /// The defaults of `dstl_proto::settings` and a random job id.
    fn default() -> Self {
        let mut settings = Settings::default();
        settings.apply(Setting::JobId(uuid::Uuid::new_v4().simple().to_string()));
        Self { settings }
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
        self.settings.apply(Setting::Compression(enabled));
    }

    /// Sets whether local files are fsync'd before their upload counts
    /// (`dstl.dfs.local.fsync`).
    pub fn set_local_fsync(&mut self, enabled: bool) {
        self.settings.apply(Setting::LocalFsync(enabled));
    }

    /// Sets whether every upload also gets a local copy (`dstl.local-recovery.enabled`).
    pub fn set_local_recovery(&mut self, enabled: bool) {
        self.settings.apply(Setting::LocalRecovery(enabled));
    }

    /// Sets the open bytes per writer that trigger an upload before any checkpoint
    /// (`dstl.dfs.preemptive-persist-threshold`).
    pub fn set_preemptive_persist_threshold(&mut self, bytes: u64) {
        self.settings
            .apply(Setting::PreemptivePersistThreshold(bytes));
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
        if let Setting::BasePath(path) = &setting {
            Location::parse(path).map_err(|reason| ConfigError::InvalidLocation {
                key: key.to_string(),
                reason,
            })?;
        }
        self.settings.apply(setting);
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
        Location::parse(&self.base_path).expect("base path was validated when it was set")
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
            Location::Local(dir) => dir.join(self.job_id()).join("dstl"),
            Location::S3 { bucket, prefix } => {
                let prefix = if prefix.is_empty() {
                    String::new()
                } else {
                    format!("{prefix}/")
                };
                PathBuf::from(format!("s3://{bucket}/{prefix}{}/dstl", self.job_id()))
            }
        }
    }

    /// The directory holding local copies (Flink's `jid_<job>/taskowned`); by default
    /// under the base directory, or `./dstl-local` when the base is an object store.
    pub fn local_copies_dir(&self) -> PathBuf {
        self.local_copies_root()
            .join(format!("jid_{}", self.job_id()))
            .join("taskowned")
    }

    /// The directory holding every job's local copies (`dstl.local-recovery.dir`); by
    /// default `<base>/local`, or `./dstl-local` when the base is an object store.
    pub fn local_copies_root(&self) -> PathBuf {
        match (&self.local_dir, self.location()) {
            (Some(dir), _) => PathBuf::from(dir),
            (None, Location::Local(base)) => base.join("local"),
            (None, Location::S3 { .. }) => PathBuf::from("dstl-local"),
        }
    }

    /// The job id (`dstl.job-id`): the one set, or the random one of the defaults.
    pub fn job_id(&self) -> &str {
        self.settings
            .job_id
            .as_deref()
            .expect("a Config always holds a job id")
    }

    /// How to reach S3-compatible stores (`dstl.s3.*`).
    pub fn s3(&self) -> crate::store::S3Settings {
        let s = &self.settings;
        crate::store::S3Settings {
            endpoint: s.s3_endpoint.clone(),
            region: s.s3_region.clone(),
            access_key_id: s.s3_access_key_id.clone(),
            secret_access_key: s.s3_secret_access_key.as_ref().map(|k| k.0.clone()),
            allow_http: s.s3_allow_http,
            request_timeout: s.s3_request_timeout,
        }
    }

    /// Every key with its effective value, in [`KEYS`] order; the local-copy directory
    /// as it is derived when unset.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let local_dir = Setting::LocalDir(String::new()).key();
        let mut entries = self.settings.entries();
        for (key, value) in &mut entries {
            if *key == local_dir {
                *value = self.local_copies_dir().display().to_string();
            }
        }
        entries
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
            PathBuf::from(format!("s3://bucket/a/b/{}/dstl", c.job_id()))
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
