//! Metrics of the upload machinery, after Flink's `ChangelogStorage.*` metrics, recorded
//! once each through the `metrics` facade. Every handle a storage records into feeds two
//! recorders: the process's (whatever `metrics::set_global_recorder` installed, under the
//! names of [`crate::telemetry::METRICS`]), and the storage's own [`Kept`] values, which
//! [`crate::ChangelogStorage::metrics`] reads in-process: a counter's total, and a
//! histogram's last 1000 samples (the sliding window of Flink's histograms), from which
//! its percentiles are computed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, CounterFn, Gauge, Histogram, HistogramFn, counter, gauge, histogram};
use serde::Serialize;

use crate::sync::LockExt;
use crate::telemetry::{
    UPLOAD_ATTEMPTS, UPLOAD_BATCH_TASKS, UPLOAD_FAILURES, UPLOAD_LATENCY, UPLOAD_QUEUE,
    UPLOAD_REQUESTS, UPLOAD_SIZE, UPLOAD_TOTAL_ATTEMPTS, UPLOADED_FILES, WRITTEN_BYTES,
};

/// Samples a histogram's window holds (Flink's `DescriptiveStatisticsHistogram` size).
const WINDOW: usize = 1000;

/// The storage's own recorder behind one handle: a counter's total (a histogram's sample
/// count) and a histogram's last [`WINDOW`] samples. Every recording also goes on to
/// `process`, the process recorder's handle for the same name.
#[derive(Debug)]
struct Kept<H> {
    total: AtomicU64,
    window: Mutex<VecDeque<f64>>,
    process: H,
}

impl<H> Kept<H> {
    fn new(process: H) -> Arc<Self> {
        Arc::new(Self {
            total: AtomicU64::new(0),
            window: Mutex::default(),
            process,
        })
    }

    fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

impl CounterFn for Kept<Counter> {
    fn increment(&self, value: u64) {
        self.total.fetch_add(value, Ordering::Relaxed);
        self.process.increment(value);
    }

    fn absolute(&self, value: u64) {
        self.total.fetch_max(value, Ordering::Relaxed);
        self.process.absolute(value);
    }
}

impl HistogramFn for Kept<Histogram> {
    fn record(&self, value: f64) {
        let mut window = self.window.locked();
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(value);
        drop(window);
        self.total.fetch_add(1, Ordering::Relaxed);
        self.process.record(value);
    }
}

impl Kept<Histogram> {
    /// The window's summary, each sample multiplied by `scale` (seconds back to the
    /// nanoseconds Flink reports).
    fn snapshot(&self, scale: f64) -> HistogramSnapshot {
        let mut sorted: Vec<u64> = self
            .window
            .locked()
            .iter()
            .map(|v| (v * scale).round() as u64)
            .collect();
        let count = self.total();
        if sorted.is_empty() {
            return HistogramSnapshot {
                count,
                ..HistogramSnapshot::default()
            };
        }
        sorted.sort_unstable();
        let at =
            |p: f64| sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1];
        HistogramSnapshot {
            count,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<u64>() as f64 / sorted.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

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

/// Live metrics, shared by the scheduler, the uploader and the storage: the handles they
/// record into, and the storage's side of each, by name.
#[derive(Debug)]
pub(crate) struct Metrics {
    pub upload_requests: Counter,
    pub upload_failures: Counter,
    pub uploaded_files: Counter,
    pub written_bytes: Counter,
    pub upload_sizes: Histogram,
    /// In seconds.
    pub upload_latency: Histogram,
    pub attempts_per_upload: Histogram,
    pub total_attempts_per_upload: Histogram,
    pub upload_batch_sizes: Histogram,
    /// Tasks waiting to be batched (the in-process value is the batcher's length).
    pub upload_queue: Gauge,
    counters: HashMap<&'static str, Arc<Kept<Counter>>>,
    histograms: HashMap<&'static str, Arc<Kept<Histogram>>>,
}

impl Default for Metrics {
    /// Metrics registered with the process's recorder installed now (if any).
    fn default() -> Self {
        let mut counters = HashMap::new();
        let mut kept_counter = |name: &'static str| {
            let kept = Kept::new(counter!(name));
            counters.insert(name, kept.clone());
            Counter::from_arc(kept)
        };
        let (upload_requests, upload_failures, uploaded_files, written_bytes) = (
            kept_counter(UPLOAD_REQUESTS),
            kept_counter(UPLOAD_FAILURES),
            kept_counter(UPLOADED_FILES),
            kept_counter(WRITTEN_BYTES),
        );
        let mut histograms = HashMap::new();
        let mut kept_histogram = |name: &'static str| {
            let kept = Kept::new(histogram!(name));
            histograms.insert(name, kept.clone());
            Histogram::from_arc(kept)
        };
        Self {
            upload_sizes: kept_histogram(UPLOAD_SIZE),
            upload_latency: kept_histogram(UPLOAD_LATENCY),
            attempts_per_upload: kept_histogram(UPLOAD_ATTEMPTS),
            total_attempts_per_upload: kept_histogram(UPLOAD_TOTAL_ATTEMPTS),
            upload_batch_sizes: kept_histogram(UPLOAD_BATCH_TASKS),
            upload_requests,
            upload_failures,
            uploaded_files,
            written_bytes,
            upload_queue: gauge!(UPLOAD_QUEUE),
            counters,
            histograms,
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
    pub fn snapshot(&self, upload_queue_size: u64, bytes_in_flight: u64) -> MetricsSnapshot {
        let total = |name| self.counters[name].total();
        let window = |name| self.histograms[name].snapshot(1.0);
        MetricsSnapshot {
            upload_requests: total(UPLOAD_REQUESTS),
            upload_failures: total(UPLOAD_FAILURES),
            uploaded_files: total(UPLOADED_FILES),
            written_bytes: total(WRITTEN_BYTES),
            upload_sizes: window(UPLOAD_SIZE),
            upload_latencies_nanos: self.histograms[UPLOAD_LATENCY].snapshot(1e9),
            attempts_per_upload: window(UPLOAD_ATTEMPTS),
            total_attempts_per_upload: window(UPLOAD_TOTAL_ATTEMPTS),
            upload_batch_sizes: window(UPLOAD_BATCH_TASKS),
            upload_queue_size,
            bytes_in_flight,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_summarizes_its_last_thousand_samples_and_counts_all() {
        let metrics = Metrics::default();
        for v in 1..=1500u32 {
            metrics.upload_sizes.record(v);
        }
        metrics
            .upload_latency
            .record(std::time::Duration::from_nanos(1_234_567));
        metrics.upload_requests.increment(3);
        let m = metrics.snapshot(0, 0);
        let sizes = m.upload_sizes;
        assert_eq!(
            (sizes.count, sizes.min, sizes.max, sizes.p50, sizes.p99),
            (1500, 501, 1500, 1000, 1490)
        );
        assert_eq!(sizes.mean, 1000.5);
        // Recorded in seconds for the process's recorder, read back in nanoseconds.
        assert_eq!(m.upload_latencies_nanos.max, 1_234_567);
        assert_eq!(m.upload_requests, 3);
        assert_eq!(m.upload_batch_sizes, HistogramSnapshot::default());
    }
}
