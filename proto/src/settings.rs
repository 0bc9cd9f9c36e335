//! The configuration every host shares: its keys, their defaults, Flink's value syntax
//! (`5mb`, `10 ms`), each key's checks and the words of a rejection.
//!
//! Every key is declared once, in one table (the `settings!` invocation below, from
//! which come [`KEYS`], [`Setting`], [`Settings`], [`parse`] and [`defaults`]); the
//! wasmtime host's `Config` holds a [`Settings`]. Hosts that cannot link this crate call
//! it through the rules component (WIT interface `settings`), so a key reads, defaults and fails alike on
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

/// Which engine runs a storage's writers (`dstl.writer.engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterEngine {
    /// An engine of the storage's own (`storage`).
    Storage,
    /// One engine shared by every storage of the process opened with the same engine
    /// settings (`process`).
    Process,
}

/// A value that is never shown: [`Settings::entries`] and `Debug` print `(set)`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
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

/// The types a key's value can have: how each reads across WIT ([`Value`]) and how
/// `dstl config` prints it.
pub trait Kind {
    /// The value by its type alone.
    fn value(&self) -> Value;
    /// The value in the key's syntax.
    fn show(&self) -> String;
}

/// [`Kind`] for types whose [`Value`] case holds them as they are.
macro_rules! plain_kinds {
    ($($ty:ty => $case:ident, $show:expr;)*) => {$(
        impl Kind for $ty {
            fn value(&self) -> Value {
                Value::$case(self.clone())
            }
            fn show(&self) -> String {
                $show(self)
            }
        }
    )*};
}

plain_kinds! {
    bool => Flag, |v: &bool| v.to_string();
    // Sizes in bytes.
    u64 => Bytes, |v: &u64| format!("{v}b");
    // Counts.
    u32 => Count, |v: &u32| v.to_string();
    Duration => Duration, |v: &Duration| format!("{} ms", v.as_millis());
    String => Text, |v: &String| v.clone();
}

impl Kind for Secret {
    fn value(&self) -> Value {
        Value::Text(self.0.clone())
    }
    fn show(&self) -> String {
        "(set)".into()
    }
}

/// [`Kind`] for enumerations set by a word, and the word's value.
macro_rules! word_kinds {
    ($($ty:ident { $($variant:ident => $word:literal),* })*) => {$(
        impl Kind for $ty {
            fn value(&self) -> Value {
                Value::Text(self.show())
            }
            fn show(&self) -> String {
                match self { $($ty::$variant => $word,)* }.into()
            }
        }

        impl $ty {
            fn from_word(word: &str) -> Option<Self> {
                match word { $($word => Some($ty::$variant),)* _ => None }
            }
        }
    )*};
}

word_kinds! {
    RetryPolicyKind { Fixed => "fixed", None => "none" }
    WriterEngine { Storage => "storage", Process => "process" }
}

/// A key's parser: its value's text to the value, or the accepted form.
type Parser<T> = Box<dyn Fn(&str) -> Result<T, &'static str>>;

/// `true` or `false`, in any case.
fn flag() -> Parser<bool> {
    Box::new(|v| match v.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("`true` or `false`"),
    })
}

/// A size (Flink's `MemorySize`) in `lo..=hi`; `form` names the range.
fn bytes(lo: u64, hi: u64, form: &'static str) -> Parser<u64> {
    Box::new(move |v| {
        let n = parse_memory(v).ok_or(MEMORY_FORM)?;
        if (lo..=hi).contains(&n) {
            Ok(n)
        } else {
            Err(form)
        }
    })
}

/// Any size.
fn size() -> Parser<u64> {
    bytes(0, u64::MAX, MEMORY_FORM)
}

/// A duration of at least `min` (and at most [`MAX_DURATION`]); `form` names the range.
fn duration(min: Duration, form: &'static str) -> Parser<Duration> {
    Box::new(move |v| {
        let d = parse_duration(v)
            .filter(|d| *d <= MAX_DURATION)
            .ok_or(DURATION_FORM)?;
        if d >= min { Ok(d) } else { Err(form) }
    })
}

/// Any duration up to [`MAX_DURATION`].
fn any_duration() -> Parser<Duration> {
    duration(Duration::ZERO, DURATION_FORM)
}

/// A whole number in `lo..=hi`; `form` names the range.
fn count(lo: u32, hi: u32, form: &'static str) -> Parser<u32> {
    Box::new(move |v| {
        v.parse::<u32>()
            .ok()
            .filter(|n| (lo..=hi).contains(n))
            .ok_or(form)
    })
}

/// Text that passes `ok`; `form` names what passes.
fn text(ok: fn(&str) -> bool, form: &'static str) -> Parser<String> {
    Box::new(move |v| if ok(v) { Ok(v.to_string()) } else { Err(form) })
}

/// The shape of a duration of at least 1 ms.
const FROM_1_MS: &str = "a duration from 1 ms to 1 d";

/// Declares every key once: its [`Setting`] variant and value type, its field of
/// [`Settings`], its doc, its parser, and its default (or, for a key without one, what
/// `dstl config` prints while it is unset). From this come [`KEYS`], [`Setting`],
/// [`Settings`], [`parse`], [`defaults`] and [`Settings::entries`]: adding a key touches
/// this table and the code that uses the value.
macro_rules! settings {
    ($(
        $(#[$doc:meta])*
        $variant:ident($ty:ty) $field:ident {
            key: $key:literal,
            parse: $parse:expr,
            $(default: $default:expr,)?
            $(unset: $unset:literal,)?
        }
    )*) => {
        /// Every key, in the order `dstl config` lists them.
        pub const KEYS: &[&str] = &[$($key),*];

        /// One key's value, parsed and checked. Each variant is a key of [`KEYS`] (see
        /// [`Setting::key`]).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Setting {$(
            $(#[$doc])*
            $variant($ty),
        )*}

        /// The effective value of every key: the defaults, changed by [`Settings::apply`].
        /// A key without a default is `None` until set.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Settings {$(
            $(#[$doc])*
            #[doc = concat!("\n\n(`", $key, "`)")]
            pub $field: slot_type!($ty $(, $default)?),
        )*}

        impl Default for Settings {
            fn default() -> Self {
                Self {$($field: slot_init!($($default)?),)*}
            }
        }

        impl Setting {
            /// Its key, without the `state.changelog.` prefix.
            pub fn key(&self) -> &'static str {
                match self {$(Setting::$variant(_) => $key,)*}
            }

            /// Its value by type alone: enumerations as the word that sets them.
            pub fn value(&self) -> Value {
                match self {$(Setting::$variant(v) => Kind::value(v),)*}
            }
        }

        impl Settings {
            /// Takes a parsed setting.
            pub fn apply(&mut self, setting: Setting) {
                match setting {$(Setting::$variant(v) => slot_set!(self.$field, v $(, $default)?),)*}
            }

            /// Every key with its effective value in the key's syntax, in [`KEYS`] order.
            pub fn entries(&self) -> Vec<(&'static str, String)> {
                vec![$(($key, slot_show!(&self.$field $(, $unset)?)),)*]
            }
        }

        /// Parses `value` for `key` (with or without the `state.changelog.` prefix), in
        /// Flink's syntax for the key's type (`5mb`, `10 ms`, `true`), and checks its range.
        pub fn parse(key: &str, value: &str) -> Result<Setting, SettingError> {
            let short = key.strip_prefix(FLINK_PREFIX).unwrap_or(key);
            let value = value.trim();
            let invalid = |expected| SettingError::InvalidValue {
                key: key.to_string(),
                value: value.to_string(),
                expected,
            };
            match short {
                $($key => {
                    let parser: Parser<$ty> = $parse;
                    parser(value).map(Setting::$variant).map_err(invalid)
                })*
                _ => Err(SettingError::UnknownKey(key.to_string())),
            }
        }

        /// The defaults (Flink's, where Flink has the key), in [`KEYS`] order. Keys
        /// without one are left out: the job id (a host makes a random one), the
        /// local-copy directory (under the base path), and the S3 keys (the
        /// environment's, or the SDK's).
        pub fn defaults() -> Vec<Setting> {
            vec![$($(Setting::$variant($default),)?)*]
        }
    };
}

/// A field's type: the value's, or `Option` of it for a key without a default.
macro_rules! slot_type {
    ($ty:ty, $default:expr) => { $ty };
    ($ty:ty) => { Option<$ty> };
}

/// A field's starting value.
macro_rules! slot_init {
    ($default:expr) => {
        $default
    };
    () => {
        None
    };
}

/// Stores a value in its field.
macro_rules! slot_set {
    ($place:expr, $v:ident, $default:expr) => {
        $place = $v
    };
    ($place:expr, $v:ident) => {
        $place = Some($v)
    };
}

/// A field's value as `dstl config` prints it.
macro_rules! slot_show {
    ($value:expr, $unset:literal) => {
        ($value)
            .as_ref()
            .map_or_else(|| $unset.to_string(), Kind::show)
    };
    ($value:expr) => {
        Kind::show($value)
    };
}

settings! {
    /// Root directory (or `s3://bucket/prefix`) for changelog files.
    BasePath(String) base_path {
        key: "dstl.dfs.base-path",
        parse: text(|v| !v.is_empty(), "a directory path or s3://bucket/prefix"),
        default: "dstl-data".into(),
    }
    /// Snappy-frame files.
    Compression(bool) compression {
        key: "dstl.dfs.compression.enabled",
        parse: flag(),
        default: false,
    }
    /// Fsync every file and new directory of a local store before its upload counts.
    /// Off trades durability on power loss for speed, as Flink's local file system
    /// does; files still appear only whole.
    LocalFsync(bool) local_fsync {
        key: "dstl.dfs.local.fsync",
        parse: flag(),
        default: true,
    }
    /// Write fsync'd files of 256 KiB and more past the page cache with `O_DIRECT`,
    /// where the file system allows it.
    LocalDirectIo(bool) local_direct_io {
        key: "dstl.dfs.local.direct-io",
        parse: flag(),
        default: true,
    }
    /// Per-writer open bytes that trigger an upload.
    PreemptivePersistThreshold(u64) preemptive_persist_threshold {
        key: "dstl.dfs.preemptive-persist-threshold",
        parse: size(),
        default: 5 << 20,
    }
    /// Batching delay.
    PersistDelay(Duration) persist_delay {
        key: "dstl.dfs.batch.persist-delay",
        parse: any_duration(),
        default: Duration::from_millis(10),
    }
    /// Queued bytes that force a batch.
    PersistSizeThreshold(u64) persist_size_threshold {
        key: "dstl.dfs.batch.persist-size-threshold",
        parse: size(),
        default: 10 << 20,
    }
    /// Bytes of one write of an upload to a local directory: the blocks' pieces go
    /// into the file in `writev` calls of about this size, from where they lie. An
    /// object store receives a file in one request.
    UploadBufferSize(u64) upload_buffer_size {
        key: "dstl.dfs.upload.buffer-size",
        parse: bytes(1, i32::MAX as u64, "a size from 1 byte to 2147483647 bytes"),
        default: 1 << 20,
    }
    /// Concurrent uploads.
    UploadThreads(u32) upload_threads {
        key: "dstl.dfs.upload.num-threads",
        parse: count(1, MAX_THREADS, "a whole number from 1 to 1024"),
        default: 5,
    }
    /// Threads deleting unused files, so at most this many deletions run at once.
    DiscardThreads(u32) discard_threads {
        key: "dstl.dfs.discard.num-threads",
        parse: count(1, MAX_THREADS, "a whole number from 1 to 1024"),
        default: 1,
    }
    /// In-flight byte limit. Flink admits a task while the bytes in flight are below
    /// it: at 0 nothing would ever be admitted.
    MaxInFlight(u64) max_in_flight {
        key: "dstl.dfs.upload.max-in-flight",
        parse: bytes(1, u64::MAX, "a size of at least 1 byte"),
        default: 100 << 20,
    }
    /// `fixed` or `none`.
    RetryPolicy(RetryPolicyKind) retry_policy {
        key: "dstl.dfs.upload.retry-policy",
        parse: Box::new(|v| RetryPolicyKind::from_word(v).ok_or("`fixed` or `none`")),
        default: RetryPolicyKind::Fixed,
    }
    /// Per-attempt timeout (zero waits forever).
    UploadTimeout(Duration) upload_timeout {
        key: "dstl.dfs.upload.timeout",
        parse: any_duration(),
        default: Duration::from_secs(1),
    }
    /// Attempts including the first.
    MaxAttempts(u32) max_attempts {
        key: "dstl.dfs.upload.max-attempts",
        parse: count(1, u32::MAX, "a whole number of at least 1"),
        default: 3,
    }
    /// Pause after a failed attempt.
    NextAttemptDelay(Duration) next_attempt_delay {
        key: "dstl.dfs.upload.next-attempt-delay",
        parse: any_duration(),
        default: Duration::from_millis(500),
    }
    /// Idle time after which a recovery cache file is dropped; 0 turns the cache off.
    CacheIdleTimeout(Duration) cache_idle_timeout {
        key: "dstl.dfs.download.local-cache.idle-timeout-ms",
        parse: any_duration(),
        default: Duration::from_secs(600),
    }
    /// Bytes the recovery cache holds at most.
    RecoveryCacheSize(u64) recovery_cache_size {
        key: "dstl.recovery.cache-size",
        parse: size(),
        default: 256 << 20,
    }
    /// Job id, 32 lowercase hex characters (Flink's `JobID`); files go to
    /// `<base>/<job-id>/dstl/`. A host makes a random one.
    JobId(String) job_id {
        key: "dstl.job-id",
        parse: text(
            |v| v.len() == 32 && v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "32 lowercase hexadecimal characters",
        ),
        unset: "(random)",
    }
    /// Keep a local copy of every upload and build local handles.
    LocalRecovery(bool) local_recovery {
        key: "dstl.local-recovery.enabled",
        parse: flag(),
        default: false,
    }
    /// Where local copies go (by default `<base>/local`, or `./dstl-local` when the
    /// base is an object store).
    LocalDir(String) local_dir {
        key: "dstl.local-recovery.dir",
        parse: text(|v| !v.is_empty(), "a non-empty directory path"),
        unset: "(<base>/local)",
    }
    /// Linear-memory cap of one writer's sandbox.
    WriterMemoryLimit(u64) writer_memory_limit {
        key: "dstl.writer.memory-limit",
        parse: bytes(2 << 20, 4 << 30, "a size from 2mb to 4gb"),
        default: 256 << 20,
    }
    /// Writers one storage can hold at once; sizes the instance pool.
    MaxWriters(u32) max_writers {
        key: "dstl.writer.max-writers",
        parse: count(1, MAX_WRITERS, "a whole number from 1 to 65536"),
        default: 1024,
    }
    /// How long one call into a writer's sandbox may run before it is interrupted.
    WriterCallTimeout(Duration) writer_call_timeout {
        key: "dstl.writer.call-timeout",
        parse: duration(Duration::from_millis(1), FROM_1_MS),
        default: Duration::from_secs(10),
    }
    /// Whether the wasm engine turns faults in guest code into traps through signal
    /// handlers. Off, it checks bounds explicitly and installs no handler: what an
    /// embedding in a JVM needs, whose own SIGSEGV handler must stay in front.
    SignalsBasedTraps(bool) signals_based_traps {
        key: "dstl.writer.signals-based-traps",
        parse: flag(),
        default: true,
    }
    /// Whether writers run on an engine of this storage's own or on one shared by every
    /// storage of the process opened with the same engine settings. A shared engine
    /// reserves its instance pool (`dstl.writer.max-writers`) once per process, however
    /// many storages (jobs) are open, and `max-writers` then bounds them all together.
    Engine(WriterEngine) engine {
        key: "dstl.writer.engine",
        parse: Box::new(|v| {
            WriterEngine::from_word(&v.to_ascii_lowercase()).ok_or("`storage` or `process`")
        }),
        default: WriterEngine::Storage,
    }
    /// The S3-compatible endpoint's URL.
    S3Endpoint(String) s3_endpoint {
        key: "dstl.s3.endpoint",
        parse: text(
            |v| v.starts_with("http://") || v.starts_with("https://"),
            "an http:// or https:// URL",
        ),
        unset: "(AWS_ENDPOINT_URL)",
    }
    /// The S3 region.
    S3Region(String) s3_region {
        key: "dstl.s3.region",
        parse: text(|_| true, ""),
        unset: "(AWS_REGION, else us-east-1)",
    }
    /// The S3 access key id.
    S3AccessKeyId(String) s3_access_key_id {
        key: "dstl.s3.access-key-id",
        parse: text(|_| true, ""),
        unset: "(AWS_ACCESS_KEY_ID)",
    }
    /// The S3 secret access key.
    S3SecretAccessKey(Secret) s3_secret_access_key {
        key: "dstl.s3.secret-access-key",
        parse: Box::new(|v| Ok(Secret(v.to_string()))),
        unset: "(AWS_SECRET_ACCESS_KEY)",
    }
    /// Whether plain-HTTP endpoints are allowed (by default only loopback ones are).
    S3AllowHttp(bool) s3_allow_http {
        key: "dstl.s3.allow-http",
        parse: flag(),
        unset: "(loopback endpoints only)",
    }
    /// The timeout of one request to the object store.
    S3RequestTimeout(Duration) s3_request_timeout {
        key: "dstl.s3.request-timeout",
        parse: duration(Duration::from_millis(1), FROM_1_MS),
        unset: "30000 ms",
    }
    /// Distinct writer names that get a `writer` label of their own in the metrics;
    /// later ones report as `other`.
    MetricsWriterLabelLimit(u32) metrics_writer_label_limit {
        key: "dstl.metrics.writer-label-limit",
        parse: count(0, u32::MAX, "a whole number (0 labels no writer by name)"),
        default: 100,
    }
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
