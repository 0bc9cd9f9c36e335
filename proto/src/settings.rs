//! The configuration every host shares: its keys, their defaults, Flink's value syntax
//! (`5mb`, `10 ms`), each key's checks and the words of a rejection.
//!
//! A host keeps its own configuration type and applies a parsed [`Setting`] to it (the
//! wasmtime host's `Config` matches on it exhaustively, so a key added here cannot be
//! forgotten there). Hosts that cannot link this crate call it through the rules
//! component (WIT interface `settings`), so a key reads, defaults and fails alike on
//! every host. What only a host can check stays with it: whether a base path is a usable
//! location, which keys it implements.

use std::time::Duration;

/// The accepted form of a size, for messages.
pub const MEMORY_FORM: &str = "a size such as `5mb`, `10 mb`, `512kb` or `1024` (bytes)";
/// The accepted form of a duration, for messages.
pub const DURATION_FORM: &str =
    "a duration of at most 1 d, such as `10 ms`, `1 s`, `2min` (no unit means ms)";
/// The prefix Flink's keys carry; every key is also accepted without it.
pub const FLINK_PREFIX: &str = "state.changelog.";
/// The longest duration any key takes: no dstl timer waits longer than a day, and every
/// instant a host computes from a duration (`now + delay`, `timeout × attempts`) stays
/// far inside its clock's range.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// The most threads a pool of dstl's may be given (`dstl.dfs.upload.num-threads`,
/// `dstl.dfs.discard.num-threads`).
pub const MAX_THREADS: u32 = 1024;
/// The most writers one storage may hold (`dstl.writer.max-writers`).
pub const MAX_WRITERS: u32 = 65536;

/// Every key, in the order `dstl config` lists them.
pub const KEYS: &[&str] = &[
    "dstl.dfs.base-path",
    "dstl.dfs.compression.enabled",
    "dstl.dfs.local.fsync",
    "dstl.dfs.local.direct-io",
    "dstl.dfs.preemptive-persist-threshold",
    "dstl.dfs.batch.persist-delay",
    "dstl.dfs.batch.persist-size-threshold",
    "dstl.dfs.upload.buffer-size",
    "dstl.dfs.upload.num-threads",
    "dstl.dfs.discard.num-threads",
    "dstl.dfs.upload.max-in-flight",
    "dstl.dfs.upload.retry-policy",
    "dstl.dfs.upload.timeout",
    "dstl.dfs.upload.max-attempts",
    "dstl.dfs.upload.next-attempt-delay",
    "dstl.dfs.download.local-cache.idle-timeout-ms",
    "dstl.recovery.cache-size",
    "dstl.job-id",
    "dstl.local-recovery.enabled",
    "dstl.local-recovery.dir",
    "dstl.writer.memory-limit",
    "dstl.writer.max-writers",
    "dstl.writer.call-timeout",
    "dstl.writer.signals-based-traps",
    "dstl.writer.engine",
    "dstl.s3.endpoint",
    "dstl.s3.region",
    "dstl.s3.access-key-id",
    "dstl.s3.secret-access-key",
    "dstl.s3.allow-http",
    "dstl.s3.request-timeout",
    "dstl.metrics.writer-label-limit",
];

/// A key or value that cannot be used; the message names the key and the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    /// A key dstl does not have (a typo, or a Flink key dstl does not implement).
    #[error(
        "unknown configuration key `{0}` (the keys, also with the prefix `state.changelog.`: {known})",
        known = KEYS.join(", ")
    )]
    UnknownKey(String),
    /// A value that does not parse as the key's type, or lies outside its range; also
    /// keys whose values contradict each other ([`check_batch_size`]).
    #[error("invalid value `{value}` for `{key}`: expected {expected}")]
    InvalidValue {
        /// The key, as given.
        key: String,
        /// The value given.
        value: String,
        /// The accepted form.
        expected: &'static str,
    },
}

/// The retry policies (Flink's `fixed` and `none`: Flink has no other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPolicyKind {
    /// Retry with a per-attempt timeout, `max_attempts` in all.
    Fixed,
    /// One attempt, no timeout.
    None,
}

/// One key's value, parsed and checked. Each variant is a key of [`KEYS`] (see
/// [`Setting::key`]); the host's configuration type documents what each does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Setting {
    BasePath(String),
    Compression(bool),
    LocalFsync(bool),
    LocalDirectIo(bool),
    PreemptivePersistThreshold(u64),
    PersistDelay(Duration),
    PersistSizeThreshold(u64),
    UploadBufferSize(u64),
    UploadThreads(u32),
    DiscardThreads(u32),
    MaxInFlight(u64),
    RetryPolicy(RetryPolicyKind),
    UploadTimeout(Duration),
    MaxAttempts(u32),
    NextAttemptDelay(Duration),
    CacheIdleTimeout(Duration),
    RecoveryCacheSize(u64),
    JobId(String),
    LocalRecovery(bool),
    LocalDir(String),
    WriterMemoryLimit(u64),
    MaxWriters(u32),
    WriterCallTimeout(Duration),
    SignalsBasedTraps(bool),
    /// `true` for `process` (one engine per process), `false` for `storage`.
    SharedEngine(bool),
    S3Endpoint(String),
    S3Region(String),
    S3AccessKeyId(String),
    S3SecretAccessKey(String),
    S3AllowHttp(bool),
    S3RequestTimeout(Duration),
    MetricsWriterLabelLimit(u32),
}

/// A setting's value by its type alone, for hosts that take settings across an interface
/// (WIT `settings`) and store them by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A boolean.
    Flag(bool),
    /// A size in bytes.
    Bytes(u64),
    /// A duration.
    Duration(Duration),
    /// A whole number.
    Count(u32),
    /// Text: a path, a name, an id, or one of a key's words (`fixed`, `process`).
    Text(String),
}

impl Setting {
    /// Its key, without the `state.changelog.` prefix.
    pub fn key(&self) -> &'static str {
        use Setting::*;
        match self {
            BasePath(_) => "dstl.dfs.base-path",
            Compression(_) => "dstl.dfs.compression.enabled",
            LocalFsync(_) => "dstl.dfs.local.fsync",
            LocalDirectIo(_) => "dstl.dfs.local.direct-io",
            PreemptivePersistThreshold(_) => "dstl.dfs.preemptive-persist-threshold",
            PersistDelay(_) => "dstl.dfs.batch.persist-delay",
            PersistSizeThreshold(_) => "dstl.dfs.batch.persist-size-threshold",
            UploadBufferSize(_) => "dstl.dfs.upload.buffer-size",
            UploadThreads(_) => "dstl.dfs.upload.num-threads",
            DiscardThreads(_) => "dstl.dfs.discard.num-threads",
            MaxInFlight(_) => "dstl.dfs.upload.max-in-flight",
            RetryPolicy(_) => "dstl.dfs.upload.retry-policy",
            UploadTimeout(_) => "dstl.dfs.upload.timeout",
            MaxAttempts(_) => "dstl.dfs.upload.max-attempts",
            NextAttemptDelay(_) => "dstl.dfs.upload.next-attempt-delay",
            CacheIdleTimeout(_) => "dstl.dfs.download.local-cache.idle-timeout-ms",
            RecoveryCacheSize(_) => "dstl.recovery.cache-size",
            JobId(_) => "dstl.job-id",
            LocalRecovery(_) => "dstl.local-recovery.enabled",
            LocalDir(_) => "dstl.local-recovery.dir",
            WriterMemoryLimit(_) => "dstl.writer.memory-limit",
            MaxWriters(_) => "dstl.writer.max-writers",
            WriterCallTimeout(_) => "dstl.writer.call-timeout",
            SignalsBasedTraps(_) => "dstl.writer.signals-based-traps",
            SharedEngine(_) => "dstl.writer.engine",
            S3Endpoint(_) => "dstl.s3.endpoint",
            S3Region(_) => "dstl.s3.region",
            S3AccessKeyId(_) => "dstl.s3.access-key-id",
            S3SecretAccessKey(_) => "dstl.s3.secret-access-key",
            S3AllowHttp(_) => "dstl.s3.allow-http",
            S3RequestTimeout(_) => "dstl.s3.request-timeout",
            MetricsWriterLabelLimit(_) => "dstl.metrics.writer-label-limit",
        }
    }

    /// Its value by type alone: enumerations as the word that sets them.
    pub fn value(&self) -> Value {
        use Setting::*;
        match self {
            Compression(b) | LocalFsync(b) | LocalDirectIo(b) | LocalRecovery(b)
            | SignalsBasedTraps(b) | S3AllowHttp(b) => Value::Flag(*b),
            PreemptivePersistThreshold(n)
            | PersistSizeThreshold(n)
            | UploadBufferSize(n)
            | MaxInFlight(n)
            | RecoveryCacheSize(n)
            | WriterMemoryLimit(n) => Value::Bytes(*n),
            PersistDelay(d) | UploadTimeout(d) | NextAttemptDelay(d) | CacheIdleTimeout(d)
            | WriterCallTimeout(d) | S3RequestTimeout(d) => Value::Duration(*d),
            UploadThreads(n)
            | DiscardThreads(n)
            | MaxAttempts(n)
            | MaxWriters(n)
            | MetricsWriterLabelLimit(n) => Value::Count(*n),
            BasePath(s) | JobId(s) | LocalDir(s) | S3Endpoint(s) | S3Region(s)
            | S3AccessKeyId(s) | S3SecretAccessKey(s) => Value::Text(s.clone()),
            RetryPolicy(RetryPolicyKind::Fixed) => Value::Text("fixed".into()),
            RetryPolicy(RetryPolicyKind::None) => Value::Text("none".into()),
            SharedEngine(shared) => Value::Text(if *shared { "process" } else { "storage" }.into()),
        }
    }
}

/// Parses `value` for `key` (with or without the `state.changelog.` prefix), in Flink's
/// syntax for the key's type (`5mb`, `10 ms`, `true`), and checks its range.
pub fn parse(key: &str, value: &str) -> Result<Setting, SettingError> {
    use Setting::*;
    let short = key.strip_prefix(FLINK_PREFIX).unwrap_or(key);
    let value = value.trim();
    let invalid = |expected| SettingError::InvalidValue {
        key: key.to_string(),
        value: value.to_string(),
        expected,
    };
    let memory = || parse_memory(value).ok_or_else(|| invalid(MEMORY_FORM));
    let duration = || {
        parse_duration(value)
            .filter(|d| *d <= MAX_DURATION)
            .ok_or_else(|| invalid(DURATION_FORM))
    };
    let boolean = || match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid("`true` or `false`")),
    };
    let positive = || {
        value
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| invalid("a whole number of at least 1"))
    };
    let threads = || {
        value
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_THREADS).contains(n))
            .ok_or_else(|| invalid("a whole number from 1 to 1024"))
    };
    Ok(match short {
        "dstl.dfs.base-path" => {
            if value.is_empty() {
                return Err(invalid("a directory path or s3://bucket/prefix"));
            }
            BasePath(value.to_string())
        }
        "dstl.dfs.compression.enabled" => Compression(boolean()?),
        "dstl.dfs.local.fsync" => LocalFsync(boolean()?),
        "dstl.dfs.local.direct-io" => LocalDirectIo(boolean()?),
        "dstl.dfs.preemptive-persist-threshold" => PreemptivePersistThreshold(memory()?),
        "dstl.dfs.batch.persist-delay" => PersistDelay(duration()?),
        "dstl.dfs.batch.persist-size-threshold" => PersistSizeThreshold(memory()?),
        "dstl.dfs.upload.buffer-size" => {
            let size = memory()?;
            if size == 0 || size > i32::MAX as u64 {
                return Err(invalid("a size from 1 byte to 2147483647 bytes"));
            }
            UploadBufferSize(size)
        }
        "dstl.dfs.upload.num-threads" => UploadThreads(threads()?),
        "dstl.dfs.discard.num-threads" => DiscardThreads(threads()?),
        "dstl.dfs.upload.max-in-flight" => {
            // Flink admits a task while the bytes in flight are below the limit: at 0
            // nothing would ever be admitted.
            let limit = memory()?;
            if limit == 0 {
                return Err(invalid("a size of at least 1 byte"));
            }
            MaxInFlight(limit)
        }
        "dstl.dfs.upload.retry-policy" => RetryPolicy(match value {
            "fixed" => RetryPolicyKind::Fixed,
            "none" => RetryPolicyKind::None,
            _ => return Err(invalid("`fixed` or `none`")),
        }),
        "dstl.dfs.upload.timeout" => UploadTimeout(duration()?),
        "dstl.dfs.upload.max-attempts" => MaxAttempts(positive()?),
        "dstl.dfs.upload.next-attempt-delay" => NextAttemptDelay(duration()?),
        "dstl.dfs.download.local-cache.idle-timeout-ms" => CacheIdleTimeout(duration()?),
        "dstl.recovery.cache-size" => RecoveryCacheSize(memory()?),
        "dstl.job-id" => {
            if value.len() != 32
                || !value
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(invalid("32 lowercase hexadecimal characters"));
            }
            JobId(value.to_string())
        }
        "dstl.local-recovery.enabled" => LocalRecovery(boolean()?),
        "dstl.local-recovery.dir" => {
            if value.is_empty() {
                return Err(invalid("a non-empty directory path"));
            }
            LocalDir(value.to_string())
        }
        "dstl.writer.memory-limit" => {
            let limit = memory()?;
            if !((2 << 20)..=(4 << 30)).contains(&limit) {
                return Err(invalid("a size from 2mb to 4gb"));
            }
            WriterMemoryLimit(limit)
        }
        "dstl.writer.max-writers" => MaxWriters(
            value
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_WRITERS).contains(n))
                .ok_or_else(|| invalid("a whole number from 1 to 65536"))?,
        ),
        "dstl.writer.call-timeout" => {
            let timeout = duration()?;
            if timeout < Duration::from_millis(1) {
                return Err(invalid("a duration from 1 ms to 1 d"));
            }
            WriterCallTimeout(timeout)
        }
        "dstl.writer.signals-based-traps" => SignalsBasedTraps(boolean()?),
        "dstl.writer.engine" => SharedEngine(match value.to_ascii_lowercase().as_str() {
            "storage" => false,
            "process" => true,
            _ => return Err(invalid("`storage` or `process`")),
        }),
        "dstl.s3.endpoint" => {
            if !(value.starts_with("http://") || value.starts_with("https://")) {
                return Err(invalid("an http:// or https:// URL"));
            }
            S3Endpoint(value.to_string())
        }
        "dstl.s3.region" => S3Region(value.to_string()),
        "dstl.s3.access-key-id" => S3AccessKeyId(value.to_string()),
        "dstl.s3.secret-access-key" => S3SecretAccessKey(value.to_string()),
        "dstl.s3.allow-http" => S3AllowHttp(boolean()?),
        "dstl.s3.request-timeout" => {
            let timeout = duration()?;
            if timeout < Duration::from_millis(1) {
                return Err(invalid("a duration from 1 ms to 1 d"));
            }
            S3RequestTimeout(timeout)
        }
        "dstl.metrics.writer-label-limit" => MetricsWriterLabelLimit(
            value
                .parse::<u32>()
                .map_err(|_| invalid("a whole number (0 labels no writer by name)"))?,
        ),
        _ => return Err(SettingError::UnknownKey(key.to_string())),
    })
}

/// The defaults (Flink's, where Flink has the key), in [`KEYS`] order. Keys without one
/// are left out: the job id (a host makes a random one), the local-copy directory (under
/// the base path), and the S3 keys (the environment's, or the SDK's).
pub fn defaults() -> Vec<Setting> {
    use Setting::*;
    vec![
        BasePath("dstl-data".into()),
        Compression(false),
        LocalFsync(true),
        LocalDirectIo(true),
        PreemptivePersistThreshold(5 << 20),
        PersistDelay(Duration::from_millis(10)),
        PersistSizeThreshold(10 << 20),
        UploadBufferSize(1 << 20),
        UploadThreads(5),
        DiscardThreads(1),
        MaxInFlight(100 << 20),
        RetryPolicy(RetryPolicyKind::Fixed),
        UploadTimeout(Duration::from_secs(1)),
        MaxAttempts(3),
        NextAttemptDelay(Duration::from_millis(500)),
        CacheIdleTimeout(Duration::from_secs(600)),
        RecoveryCacheSize(256 << 20),
        LocalRecovery(false),
        WriterMemoryLimit(256 << 20),
        MaxWriters(1024),
        WriterCallTimeout(Duration::from_secs(10)),
        SignalsBasedTraps(true),
        SharedEngine(false),
        MetricsWriterLabelLimit(100),
    ]
}

/// Checks the one relation between keys (Flink's scheduler constructor check): a batch
/// must fit within the in-flight limit.
pub fn check_batch_size(
    persist_size_threshold: u64,
    max_in_flight: u64,
) -> Result<(), SettingError> {
    if persist_size_threshold > max_in_flight {
        return Err(SettingError::InvalidValue {
            key: "dstl.dfs.batch.persist-size-threshold".into(),
            value: persist_size_threshold.to_string(),
            expected: "a size not above dstl.dfs.upload.max-in-flight",
        });
    }
    Ok(())
}

fn split_number(value: &str) -> Option<(u64, String)> {
    let digits = value.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let number = value[..digits].parse().ok()?;
    Some((number, value[digits..].trim().to_ascii_lowercase()))
}

/// Parses Flink's `MemorySize` syntax (units are powers of 1024).
pub fn parse_memory(value: &str) -> Option<u64> {
    let (n, unit) = split_number(value.trim())?;
    let shift = match unit.as_str() {
        "" | "b" | "bytes" => 0,
        "k" | "kb" | "kib" | "kibibytes" => 10,
        "m" | "mb" | "mib" | "mebibytes" => 20,
        "g" | "gb" | "gib" | "gibibytes" => 30,
        "t" | "tb" | "tib" | "tebibytes" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// Parses Flink's duration syntax; a bare number is milliseconds.
pub fn parse_duration(value: &str) -> Option<Duration> {
    let (n, unit) = split_number(value.trim())?;
    Some(match unit.as_str() {
        "" | "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => Duration::from_millis(n),
        "ns" | "nano" | "nanos" | "nanosecond" | "nanoseconds" => Duration::from_nanos(n),
        "us" | "µs" | "micro" | "micros" | "microsecond" | "microseconds" => {
            Duration::from_micros(n)
        }
        "s" | "sec" | "secs" | "second" | "seconds" => Duration::from_secs(n),
        "m" | "min" | "mins" | "minute" | "minutes" => Duration::from_secs(n.checked_mul(60)?),
        "h" | "hour" | "hours" => Duration::from_secs(n.checked_mul(3600)?),
        "d" | "day" | "days" => Duration::from_secs(n.checked_mul(86400)?),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flink_value_syntax() {
        assert_eq!(parse_memory("5mb"), Some(5 << 20));
        assert_eq!(parse_memory("10 mb"), Some(10 << 20));
        assert_eq!(parse_memory("600b"), Some(600));
        assert_eq!(parse_memory("1024"), Some(1024));
        assert_eq!(parse_memory("mb"), None);
        assert_eq!(parse_memory("5 parsecs"), None);
        assert_eq!(parse_memory("99999999999tb"), None, "overflow");
        assert_eq!(parse_duration("10 ms"), Some(Duration::from_millis(10)));
        assert_eq!(parse_duration("1 s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_duration("10 min"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("250"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("500us"), Some(Duration::from_micros(500)));
        assert_eq!(parse_duration("soon"), None);
    }

    #[test]
    fn every_key_parses_under_both_spellings_and_names_itself() {
        let samples = [
            "/x",
            "true",
            "true",
            "true",
            "1mb",
            "1 ms",
            "1mb",
            "1mb",
            "2",
            "2",
            "1mb",
            "none",
            "1 s",
            "2",
            "1 ms",
            "1 s",
            "1mb",
            "0123456789abcdef0123456789abcdef",
            "true",
            "/y",
            "2mb",
            "2",
            "1 s",
            "false",
            "process",
            "http://h",
            "r",
            "a",
            "s",
            "true",
            "1 s",
            "0",
        ];
        assert_eq!(samples.len(), KEYS.len());
        for (key, value) in KEYS.iter().zip(samples) {
            let plain = parse(key, value).unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_eq!(plain.key(), *key);
            let prefixed = parse(&format!("{FLINK_PREFIX}{key}"), value).unwrap();
            assert_eq!(prefixed, plain);
        }
    }

    #[test]
    fn the_defaults_are_values_a_key_can_take() {
        let defaults = defaults();
        let order: Vec<_> = defaults.iter().map(Setting::key).collect();
        let mut sorted = order.clone();
        sorted.sort_by_key(|k| KEYS.iter().position(|x| x == k));
        assert_eq!(order, sorted, "in KEYS order");
        for setting in defaults {
            let word = match setting.value() {
                Value::Flag(b) => b.to_string(),
                Value::Bytes(n) => format!("{n}b"),
                Value::Duration(d) => format!("{} ns", d.as_nanos()),
                Value::Count(n) => n.to_string(),
                Value::Text(s) => s,
            };
            assert_eq!(parse(setting.key(), &word), Ok(setting));
        }
    }

    #[test]
    fn errors_name_the_key_the_value_and_the_form() {
        assert_eq!(
            parse("dstl.dfs.nope", "1").unwrap_err().to_string(),
            format!(
                "unknown configuration key `dstl.dfs.nope` (the keys, also with the prefix `state.changelog.`: {})",
                KEYS.join(", ")
            )
        );
        assert_eq!(
            parse("state.changelog.dstl.dfs.upload.timeout", "soon")
                .unwrap_err()
                .to_string(),
            "invalid value `soon` for `state.changelog.dstl.dfs.upload.timeout`: expected a duration of at most 1 d, such as `10 ms`, `1 s`, `2min` (no unit means ms)"
        );
        for (key, value, form) in [
            ("dstl.dfs.upload.retry-policy", "Fixed", "`fixed` or `none`"),
            ("dstl.dfs.upload.num-threads", "0", "from 1 to 1024"),
            ("dstl.dfs.discard.num-threads", "1025", "from 1 to 1024"),
            ("dstl.dfs.upload.max-in-flight", "0", "at least 1 byte"),
            ("dstl.dfs.batch.persist-delay", "25h", "at most 1 d"),
            ("dstl.dfs.upload.timeout", "200000000000000d", "at most 1 d"),
            ("dstl.writer.max-writers", "65537", "from 1 to 65536"),
            ("dstl.s3.request-timeout", "0", "from 1 ms to 1 d"),
            ("dstl.dfs.upload.buffer-size", "3gb", "2147483647 bytes"),
            ("dstl.writer.memory-limit", "1mb", "from 2mb to 4gb"),
            ("dstl.writer.call-timeout", "500us", "from 1 ms to 1 d"),
            ("dstl.job-id", "ABC", "hexadecimal"),
            ("dstl.s3.endpoint", "ftp://x", "http://"),
            ("dstl.dfs.base-path", " ", "directory path"),
        ] {
            let e = parse(key, value).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(form), "{key}={value}: {e}");
        }
        assert!(check_batch_size(10, 10).is_ok());
        assert!(
            check_batch_size(11, 10)
                .unwrap_err()
                .to_string()
                .contains("not above dstl.dfs.upload.max-in-flight")
        );
    }
}
