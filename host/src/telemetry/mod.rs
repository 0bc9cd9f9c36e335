//! What dstl reports to the monitoring of the process that embeds it: metrics through the
//! [`metrics`] crate's facade, and spans and events through [`tracing`].
//!
//! # Metrics
//!
//! dstl records into whatever recorder the process installed (`metrics::set_global_recorder`,
//! e.g. `metrics-exporter-prometheus`, which `dstl run --prometheus` uses). Install it
//! **before** opening a [`crate::ChangelogStorage`]: the storage registers its metric handles
//! when it opens, and each writer when it is created; handles registered while no recorder
//! was installed stay no-ops. Without a recorder every recording is one branch on an empty
//! handle (the overhead is measured in README.md, "Metrics and tracing").
//!
//! [`METRICS`] lists every family: its Prometheus name, kind, labels, meaning, the Flink
//! metric it corresponds to, and suggested histogram buckets. [`describe`] hands the
//! descriptions to the recorder (the storage calls it when it opens).
//! Each upload metric is recorded once, into a handle that feeds both the process's
//! recorder and the storage's own, which [`crate::ChangelogStorage::metrics`] reads
//! in-process with Flink's sliding-window histograms (`metrics.rs`).
//!
//! ## Writer labels and their cardinality
//!
//! Upload metrics belong to the storage (one batch holds the tasks of many writers) and
//! carry no label. Per-writer metrics carry `writer`, the writer's name. Operator names are
//! unbounded (a job can have thousands), so the first `dstl.metrics.writer-label-limit`
//! distinct names a storage sees (default 100) get a label of their own, and every later
//! one reports under [`OTHER_WRITERS`]. A name keeps its label for the storage's life,
//! also when its writer is closed and created again (as after a restart of the operator),
//! so a series never changes meaning; the number of series is bounded by the limit
//! whatever the job does. Limit 0 puts every writer under [`OTHER_WRITERS`].
//!
//! # Traces
//!
//! | span | level | fields |
//! | --- | --- | --- |
//! | `writer` | INFO | `writer` (name), `id`; entered by every call into the writer and by the delivery of its upload outcomes |
//! | `upload` | DEBUG | `batch` (number), `tasks`, `task_ids` (`writer-id/task-id` per task), `bytes`, then `attempts` and `outcome` (`ok`, `failed`, `abandoned`) |
//! | `upload_attempt` | DEBUG | `attempt` (1 for the first), `outcome` |
//! | `recovery_read` | DEBUG | `entries`, `files`, `state_size`, then `changes` and `outcome` |
//!
//! Each `upload` and `recovery_read` span ends with a DEBUG event carrying its outcome, so
//! `RUST_LOG=dstl=debug` shows one line per batch and per read.

mod writer;

pub(crate) use writer::{PersistReturned, WriterLabels, WriterMetrics};

/// The `writer` label of writers beyond `dstl.metrics.writer-label-limit`.
pub const OTHER_WRITERS: &str = "other";

/// What kind of metric a family is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of samples; [`MetricInfo::buckets`] suggests bucket bounds.
    Histogram,
}

/// The unit of a family's values (also the suffix of its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricUnit {
    /// A number of things.
    Count,
    /// Bytes.
    Bytes,
    /// Seconds.
    Seconds,
}

/// One metric family dstl reports.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct MetricInfo {
    /// The Prometheus-style name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// The unit of its values.
    pub unit: MetricUnit,
    /// Its labels (`writer` only for per-writer families).
    pub labels: &'static [&'static str],
    /// What it counts or measures.
    pub help: &'static str,
    /// The Flink metric it corresponds to (`ChangelogStorage.*`), if any.
    pub flink: Option<&'static str>,
    /// Suggested histogram bucket bounds (empty for counters and gauges).
    pub buckets: &'static [f64],
}

pub(crate) const UPLOAD_REQUESTS: &str = "dstl_upload_requests_total";
pub(crate) const UPLOAD_FAILURES: &str = "dstl_upload_failures_total";
pub(crate) const UPLOAD_SIZE: &str = "dstl_upload_size_bytes";
pub(crate) const UPLOAD_LATENCY: &str = "dstl_upload_latency_seconds";
pub(crate) const UPLOAD_ATTEMPTS: &str = "dstl_upload_attempts_per_upload";
pub(crate) const UPLOAD_TOTAL_ATTEMPTS: &str = "dstl_upload_total_attempts_per_upload";
pub(crate) const UPLOAD_BATCH_TASKS: &str = "dstl_upload_batch_tasks";
pub(crate) const UPLOAD_QUEUE: &str = "dstl_upload_queue_tasks";
pub(crate) const IN_FLIGHT: &str = "dstl_upload_in_flight_bytes";
pub(crate) const UPLOADED_FILES: &str = "dstl_uploaded_files_total";
pub(crate) const WRITTEN_BYTES: &str = "dstl_written_bytes_total";
pub(crate) const WRITER_APPENDS: &str = "dstl_writer_appends_total";
pub(crate) const WRITER_APPENDED_BYTES: &str = "dstl_writer_appended_bytes_total";
pub(crate) const WRITER_PERSISTS: &str = "dstl_writer_persists_total";
pub(crate) const WRITER_PERSIST_FAILURES: &str = "dstl_writer_persist_failures_total";
pub(crate) const WRITER_PERSIST_LATENCY: &str = "dstl_writer_persist_latency_seconds";
pub(crate) const WRITER_PREEMPTIVE_UPLOADS: &str = "dstl_writer_preemptive_uploads_total";
pub(crate) const WRITER_TRAPS: &str = "dstl_writer_traps_total";

const SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const BYTES: &[f64] = &[
    1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0,
];
const ATTEMPTS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 10.0];
const TASKS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];
const WRITER: &[&str] = &["writer"];

/// Every metric family dstl reports, storage-wide ones first. A row: name, kind, unit,
/// labels, suggested buckets, the Flink metric, help.
#[rustfmt::skip]
pub const METRICS: &[MetricInfo] = {
    use MetricKind::{Counter, Gauge, Histogram};
    use MetricUnit::{Bytes, Count, Seconds};
    &[
        family(UPLOAD_REQUESTS, Counter, Count, &[], &[], Some("ChangelogStorage.numberOfUploadRequests"),
            "Upload attempts started, retries included."),
        family(UPLOAD_FAILURES, Counter, Count, &[], &[], Some("ChangelogStorage.numberOfUploadFailures"),
            "Upload attempts that failed (an attempt that times out and is overtaken is not a failure)."),
        family(UPLOAD_SIZE, Histogram, Bytes, &[], BYTES, Some("ChangelogStorage.uploadSizes"),
            "Logical bytes of the file of each successful upload attempt."),
        family(UPLOAD_LATENCY, Histogram, Seconds, &[], SECONDS, Some("ChangelogStorage.uploadLatenciesNanos"),
            "Duration of each successful upload attempt."),
        family(UPLOAD_ATTEMPTS, Histogram, Count, &[], ATTEMPTS, Some("ChangelogStorage.attemptsPerUpload"),
            "Number of the attempt that won, per successful upload (1 = the first)."),
        family(UPLOAD_TOTAL_ATTEMPTS, Histogram, Count, &[], ATTEMPTS, Some("ChangelogStorage.totalAttemptsPerUpload"),
            "Attempts started by the time a successful upload won."),
        family(UPLOAD_BATCH_TASKS, Histogram, Count, &[], TASKS, Some("ChangelogStorage.uploadBatchSizes"),
            "Upload tasks (of one or more writers) per batch; a batch is one file."),
        family(UPLOAD_QUEUE, Gauge, Count, &[], &[], Some("ChangelogStorage.uploadQueueSize"),
            "Upload tasks waiting to be batched."),
        family(IN_FLIGHT, Gauge, Bytes, &[], &[], None,
            "Payload bytes admitted for upload and not yet completed (limited by dstl.dfs.upload.max-in-flight)."),
        family(UPLOADED_FILES, Counter, Count, &[], &[], None,
            "Files written by winning upload attempts and handed to writers."),
        family(WRITTEN_BYTES, Counter, Bytes, &[], &[], None,
            "Bytes on disk of those files (flag byte and compression included)."),
        family(WRITER_APPENDS, Counter, Count, WRITER, &[], None,
            "Changes (data and metadata) the writer accepted."),
        family(WRITER_APPENDED_BYTES, Counter, Bytes, WRITER, &[], None,
            "Payload bytes of the changes the writer accepted."),
        family(WRITER_PERSISTS, Counter, Count, WRITER, &[], None,
            "Persist calls (checkpoints)."),
        family(WRITER_PERSIST_FAILURES, Counter, Count, WRITER, &[], None,
            "Persist calls that failed, at once or when their upload failed, the writer closed or its sandbox trapped."),
        family(WRITER_PERSIST_LATENCY, Histogram, Seconds, WRITER, SECONDS, None,
            "Time from a persist call to its successful completion."),
        family(WRITER_PREEMPTIVE_UPLOADS, Counter, Count, WRITER, &[], None,
            "Uploads the writer started before any checkpoint because its open change set reached dstl.dfs.preemptive-persist-threshold."),
        family(WRITER_TRAPS, Counter, Count, WRITER, &[], None,
            "Traps of the writer's sandbox (deadline, memory limit, guest panic or fault); the writer is unusable after one."),
    ]
};

/// One row of [`METRICS`].
const fn family(
    name: &'static str,
    kind: MetricKind,
    unit: MetricUnit,
    labels: &'static [&'static str],
    buckets: &'static [f64],
    flink: Option<&'static str>,
    help: &'static str,
) -> MetricInfo {
    MetricInfo {
        name,
        kind,
        unit,
        labels,
        help,
        flink,
        buckets,
    }
}

/// Hands the description and unit of every family in [`METRICS`] to the installed recorder
/// (Prometheus's `# HELP` lines). [`crate::ChangelogStorage::open`] calls it; without a
/// recorder it does nothing.
pub fn describe() {
    for info in METRICS {
        let unit = match info.unit {
            MetricUnit::Count => metrics::Unit::Count,
            MetricUnit::Bytes => metrics::Unit::Bytes,
            MetricUnit::Seconds => metrics::Unit::Seconds,
        };
        match info.kind {
            MetricKind::Counter => metrics::describe_counter!(info.name, unit, info.help),
            MetricKind::Gauge => metrics::describe_gauge!(info.name, unit, info.help),
            MetricKind::Histogram => metrics::describe_histogram!(info.name, unit, info.help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let mut seen = std::collections::HashSet::new();
        for info in METRICS {
            assert!(seen.insert(info.name), "{} listed twice", info.name);
            assert!(info.name.starts_with("dstl_"), "{}", info.name);
            assert!(
                info.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                info.name
            );
            assert_eq!(
                info.kind == MetricKind::Counter,
                info.name.ends_with("_total"),
                "{}: counters and only counters end in _total",
                info.name
            );
            match info.unit {
                MetricUnit::Bytes => assert!(info.name.contains("_bytes"), "{}", info.name),
                MetricUnit::Seconds => assert!(info.name.ends_with("_seconds"), "{}", info.name),
                MetricUnit::Count => {}
            }
            assert_eq!(
                info.kind == MetricKind::Histogram,
                !info.buckets.is_empty(),
                "{}: histograms and only histograms have buckets",
                info.name
            );
            assert!(
                info.buckets.windows(2).all(|w| w[0] < w[1]),
                "{}: buckets ascend",
                info.name
            );
        }
    }
}
