//! Metrics of the upload machinery, after Flink's `ChangelogStorage.*` metrics:
//! counters, and histograms over a sliding window of the last 1000 samples, read
//! in-process with [`crate::ChangelogStorage::metrics`]. Every value is also recorded
//! through the `metrics` facade under the names of [`crate::telemetry::METRICS`].

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{counter, gauge, histogram};
use serde::Serialize;

use crate::sync::LockExt;
use crate::telemetry;

const WINDOW: usize = 1000;

/// A sliding window of samples.
#[derive(Debug, Default)]
pub(crate) struct Histogram(Mutex<(VecDeque<u64>, u64)>);

/// Summary of a histogram's window (and how many samples it ever saw).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct HistogramSnapshot {
    /// Samples recorded since the start.
    pub count: u64,
    /// Smallest sample in the window.
    pub min: u64,
    /// Largest sample in the window.
    pub max: u64,
    /// Mean of the window.
    pub mean: f64,
    /// Median of the window.
    pub p50: u64,
    /// 99th percentile of the window.
    pub p99: u64,
}

impl Histogram {
    pub fn record(&self, value: u64) {
        let mut guard = self.0.locked();
        let (window, count) = &mut *guard;
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(value);
        *count += 1;
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let guard = self.0.locked();
        let (window, count) = &*guard;
        if window.is_empty() {
            return HistogramSnapshot {
                count: *count,
                ..HistogramSnapshot::default()
            };
        }
        let mut sorted: Vec<u64> = window.iter().copied().collect();
        sorted.sort_unstable();
        let at =
            |p: f64| sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1];
        HistogramSnapshot {
            count: *count,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<u64>() as f64 / sorted.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

/// A counter read in-process and reported through the facade.
#[derive(Debug)]
pub(crate) struct Count {
    value: AtomicU64,
    exported: metrics::Counter,
}

impl Count {
    fn new(exported: metrics::Counter) -> Self {
        Self {
            value: AtomicU64::new(0),
            exported,
        }
    }

    fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// A sliding-window histogram reported through the facade, each sample multiplied by
/// `scale` (nanoseconds become seconds).
#[derive(Debug)]
pub(crate) struct Distribution {
    window: Histogram,
    exported: metrics::Histogram,
    scale: f64,
}

impl Distribution {
    fn new(exported: metrics::Histogram, scale: f64) -> Self {
        Self {
            window: Histogram::default(),
            exported,
            scale,
        }
    }

    pub fn record(&self, value: u64) {
        self.window.record(value);
        self.exported.record(value as f64 * self.scale);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        self.window.snapshot()
    }
}

/// Live metrics, shared by the scheduler, the uploader and the storage.
#[derive(Debug)]
pub(crate) struct Metrics {
    pub upload_requests: Count,
    pub upload_failures: Count,
    pub uploaded_files: Count,
    pub written_bytes: Count,
    pub upload_sizes: Distribution,
    pub upload_latencies_nanos: Distribution,
    pub attempts_per_upload: Distribution,
    pub total_attempts_per_upload: Distribution,
    pub upload_batch_sizes: Distribution,
    /// Tasks waiting to be batched (the in-process value is the batcher's length).
    pub upload_queue: metrics::Gauge,
}

impl Default for Metrics {
    /// Metrics registered with the recorder installed now (if any).
    fn default() -> Self {
        Self {
            upload_requests: Count::new(counter!(telemetry::UPLOAD_REQUESTS)),
            upload_failures: Count::new(counter!(telemetry::UPLOAD_FAILURES)),
            uploaded_files: Count::new(counter!(telemetry::UPLOADED_FILES)),
            written_bytes: Count::new(counter!(telemetry::WRITTEN_BYTES)),
            upload_sizes: Distribution::new(histogram!(telemetry::UPLOAD_SIZE), 1.0),
            upload_latencies_nanos: Distribution::new(histogram!(telemetry::UPLOAD_LATENCY), 1e-9),
            attempts_per_upload: Distribution::new(histogram!(telemetry::UPLOAD_ATTEMPTS), 1.0),
            total_attempts_per_upload: Distribution::new(
                histogram!(telemetry::UPLOAD_TOTAL_ATTEMPTS),
                1.0,
            ),
            upload_batch_sizes: Distribution::new(histogram!(telemetry::UPLOAD_BATCH_TASKS), 1.0),
            upload_queue: gauge!(telemetry::UPLOAD_QUEUE),
        }
    }
}

/// A copy of the metrics at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Upload attempts started, retries included (`numberOfUploadRequests`).
    pub upload_requests: u64,
    /// Attempts that failed (`numberOfUploadFailures`).
    pub upload_failures: u64,
    /// Files that won and were handed to writers.
    pub uploaded_files: u64,
    /// Bytes on disk of those files (flag byte and compression included).
    pub written_bytes: u64,
    /// Logical bytes per successful attempt (`uploadSizes`).
    pub upload_sizes: HistogramSnapshot,
    /// Duration of successful attempts (`uploadLatenciesNanos`).
    pub upload_latencies_nanos: HistogramSnapshot,
    /// Number of the winning attempt (`attemptsPerUpload`).
    pub attempts_per_upload: HistogramSnapshot,
    /// Attempts started when the upload won (`totalAttemptsPerUpload`).
    pub total_attempts_per_upload: HistogramSnapshot,
    /// Upload tasks per batch (`uploadBatchSizes`).
    pub upload_batch_sizes: HistogramSnapshot,
    /// Tasks waiting to be batched (`uploadQueueSize`).
    pub upload_queue_size: u64,
    /// Payload bytes admitted and not yet completed.
    pub bytes_in_flight: u64,
}

impl Metrics {
    pub fn add(counter: &Count, n: u64) {
        counter.value.fetch_add(n, Ordering::Relaxed);
        counter.exported.increment(n);
    }

    pub fn snapshot(&self, upload_queue_size: u64, bytes_in_flight: u64) -> MetricsSnapshot {
        MetricsSnapshot {
            upload_requests: self.upload_requests.get(),
            upload_failures: self.upload_failures.get(),
            uploaded_files: self.uploaded_files.get(),
            written_bytes: self.written_bytes.get(),
            upload_sizes: self.upload_sizes.snapshot(),
            upload_latencies_nanos: self.upload_latencies_nanos.snapshot(),
            attempts_per_upload: self.attempts_per_upload.snapshot(),
            total_attempts_per_upload: self.total_attempts_per_upload.snapshot(),
            upload_batch_sizes: self.upload_batch_sizes.snapshot(),
            upload_queue_size,
            bytes_in_flight,
        }
    }
}
