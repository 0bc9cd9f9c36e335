//! Metrics of the upload machinery, after Flink's `ChangelogStorage.*` metrics:
//! counters, and histograms over a sliding window of the last 1000 samples.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

const WINDOW: usize = 1000;

/// A sliding window of samples.
#[derive(Debug, Default)]
pub(crate) struct Histogram(Mutex<(VecDeque<u64>, u64)>);

/// Summary of a histogram's window (and how many samples it ever saw).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
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
        let mut guard = self.0.lock().unwrap();
        let (window, count) = &mut *guard;
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(value);
        *count += 1;
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let guard = self.0.lock().unwrap();
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

/// Live metrics, shared by the scheduler, the uploader and the storage.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub upload_requests: AtomicU64,
    pub upload_failures: AtomicU64,
    pub uploaded_files: AtomicU64,
    pub written_bytes: AtomicU64,
    pub upload_sizes: Histogram,
    pub upload_latencies_nanos: Histogram,
    pub attempts_per_upload: Histogram,
    pub total_attempts_per_upload: Histogram,
    pub upload_batch_sizes: Histogram,
}

/// A copy of the metrics at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
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
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self, upload_queue_size: u64, bytes_in_flight: u64) -> MetricsSnapshot {
        MetricsSnapshot {
            upload_requests: self.upload_requests.load(Ordering::Relaxed),
            upload_failures: self.upload_failures.load(Ordering::Relaxed),
            uploaded_files: self.uploaded_files.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
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
