//! The storage's metrics as they cross JNI: one table names each metric Flink reports
//! (its `ChangelogStorage.*` name, after Flink's own storage), its kind, and the value it
//! reads, so `DstlMetrics.java` registers what `metricNames` lists and reads `metrics` in
//! that order, holding no name or index of its own.

use dstl::{HistogramSnapshot, MetricsSnapshot};

/// What one metric reads from a snapshot.
enum Reading {
    /// A counter or gauge: one value.
    Value(fn(&MetricsSnapshot) -> u64),
    /// A histogram: `count, min, max, mean, p50, p99`.
    Histogram(fn(&MetricsSnapshot) -> &HistogramSnapshot),
}

/// Every metric the plugin reports, in the order `metrics` gives their values.
#[rustfmt::skip]
const METRICS: &[(&str, &str, Reading)] = &[
    ("counter", "numberOfUploadRequests", Reading::Value(|m| m.upload_requests)),
    ("counter", "numberOfUploadFailures", Reading::Value(|m| m.upload_failures)),
    ("gauge", "uploadQueueSize", Reading::Value(|m| m.upload_queue_size)),
    ("gauge", "inFlightBytes", Reading::Value(|m| m.bytes_in_flight)),
    ("histogram", "uploadSizes", Reading::Histogram(|m| &m.upload_sizes)),
    ("histogram", "uploadLatenciesNanos", Reading::Histogram(|m| &m.upload_latencies_nanos)),
    ("histogram", "attemptsPerUpload", Reading::Histogram(|m| &m.attempts_per_upload)),
    ("histogram", "totalAttemptsPerUpload", Reading::Histogram(|m| &m.total_attempts_per_upload)),
    ("histogram", "uploadBatchSizes", Reading::Histogram(|m| &m.upload_batch_sizes)),
];

/// The table for Java: a line `KIND NAME` per metric, in order (kind `counter`, `gauge` or
/// `histogram`).
pub(crate) fn names() -> String {
    METRICS
        .iter()
        .map(|(kind, name, _)| format!("{kind} {name}\n"))
        .collect()
}

/// The values of `snapshot` in the table's order: one per counter or gauge, six per
/// histogram (`count, min, max, mean, p50, p99`).
pub(crate) fn values(snapshot: &MetricsSnapshot) -> Vec<i64> {
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut values = Vec::with_capacity(METRICS.len() * 6);
    for (_, _, reading) in METRICS {
        match reading {
            Reading::Value(read) => values.push(as_i64(read(snapshot))),
            Reading::Histogram(read) => {
                let h = read(snapshot);
                values.extend([
                    as_i64(h.count),
                    as_i64(h.min),
                    as_i64(h.max),
                    h.mean.round() as i64,
                    as_i64(h.p50),
                    as_i64(h.p99),
                ]);
            }
        }
    }
    values
}
