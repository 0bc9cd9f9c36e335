//! Counters of the upload machinery (names after Flink's `ChangelogStorage.*` metrics).

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters, shared by the uploader and the storage.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    upload_requests: AtomicU64,
    upload_failures: AtomicU64,
    uploaded_files: AtomicU64,
    uploaded_logical_bytes: AtomicU64,
    written_bytes: AtomicU64,
    upload_latency_nanos: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetricsSnapshot {
    /// Upload attempts started (`numberOfUploadRequests`).
    pub upload_requests: u64,
    /// Attempts that failed (`numberOfUploadFailures`).
    pub upload_failures: u64,
    /// Files written.
    pub uploaded_files: u64,
    /// Logical bytes of the files written (sum of `uploadSizes`).
    pub uploaded_logical_bytes: u64,
    /// Bytes on disk, flag byte and compression included.
    pub written_bytes: u64,
    /// Sum of successful upload latencies (`uploadLatenciesNanos`).
    pub upload_latency_nanos: u64,
}

impl Metrics {
    pub fn request(&self) {
        self.upload_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub fn failure(&self) {
        self.upload_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn success(&self, logical: u64, written: u64, nanos: u64) {
        self.uploaded_files.fetch_add(1, Ordering::Relaxed);
        self.uploaded_logical_bytes
            .fetch_add(logical, Ordering::Relaxed);
        self.written_bytes.fetch_add(written, Ordering::Relaxed);
        self.upload_latency_nanos
            .fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            upload_requests: self.upload_requests.load(Ordering::Relaxed),
            upload_failures: self.upload_failures.load(Ordering::Relaxed),
            uploaded_files: self.uploaded_files.load(Ordering::Relaxed),
            uploaded_logical_bytes: self.uploaded_logical_bytes.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
            upload_latency_nanos: self.upload_latency_nanos.load(Ordering::Relaxed),
        }
    }
}
