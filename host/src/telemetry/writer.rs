//! Per-writer metrics and the bounded set of `writer` label values (see the module docs
//! of [`crate::telemetry`], "Writer labels and their cardinality").

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Instant;

use metrics::{Counter, Histogram, counter, histogram};

use crate::sync::LockExt;

use super::{
    OTHER_WRITERS, WRITER_APPENDED_BYTES, WRITER_APPENDS, WRITER_PERSIST_FAILURES,
    WRITER_PERSIST_LATENCY, WRITER_PERSISTS, WRITER_PREEMPTIVE_UPLOADS, WRITER_TRAPS,
};

/// The `writer` label values of one storage: the first `limit` distinct names get their
/// own, later ones [`OTHER_WRITERS`].
#[derive(Debug)]
pub(crate) struct WriterLabels {
    limit: usize,
    names: Mutex<HashSet<String>>,
}

impl WriterLabels {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            names: Mutex::new(HashSet::new()),
        }
    }

    /// The label of the writer named `name`; the same for the same name every time.
    pub fn label(&self, name: &str) -> String {
        let mut names = self.names.locked();
        if names.contains(name) {
            return name.to_string();
        }
        if names.len() < self.limit {
            names.insert(name.to_string());
            return name.to_string();
        }
        OTHER_WRITERS.to_string()
    }

    /// The metrics of the writer named `name`, registered with the recorder installed now.
    pub fn writer(&self, name: &str) -> WriterMetrics {
        WriterMetrics::new(self.label(name))
    }
}

/// How a persist call returned, for [`WriterMetrics::persisted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PersistReturned {
    /// Completed at once: nothing was left to upload.
    Completed,
    /// Waits for uploads.
    Pending,
    /// Failed at once.
    Failed,
}

/// Handles of one writer's metrics. Without a recorder each is empty and recording is a
/// branch; the default records nothing.
#[derive(Debug, Clone)]
pub(crate) struct WriterMetrics {
    appends: Counter,
    appended_bytes: Counter,
    persists: Counter,
    persist_failures: Counter,
    persist_latency: Histogram,
    traps: Counter,
    preemptive_uploads: Counter,
}

impl Default for WriterMetrics {
    fn default() -> Self {
        Self {
            appends: Counter::noop(),
            appended_bytes: Counter::noop(),
            persists: Counter::noop(),
            persist_failures: Counter::noop(),
            persist_latency: Histogram::noop(),
            traps: Counter::noop(),
            preemptive_uploads: Counter::noop(),
        }
    }
}

impl WriterMetrics {
    fn new(label: String) -> Self {
        // Registered now so that every family shows (at 0) from the writer's creation on.
        Self {
            appends: counter!(WRITER_APPENDS, "writer" => label.clone()),
            appended_bytes: counter!(WRITER_APPENDED_BYTES, "writer" => label.clone()),
            persists: counter!(WRITER_PERSISTS, "writer" => label.clone()),
            persist_failures: counter!(WRITER_PERSIST_FAILURES, "writer" => label.clone()),
            persist_latency: histogram!(WRITER_PERSIST_LATENCY, "writer" => label.clone()),
            traps: counter!(WRITER_TRAPS, "writer" => label.clone()),
            preemptive_uploads: counter!(WRITER_PREEMPTIVE_UPLOADS, "writer" => label),
        }
    }

    /// The pre-emptive upload counter, for the sandbox's imports, which see those uploads.
    pub fn preemptive_uploads(&self) -> Counter {
        self.preemptive_uploads.clone()
    }

    /// `changes` changes of `bytes` payload bytes were accepted.
    #[inline]
    pub fn appended(&self, changes: usize, bytes: usize) {
        self.appends.increment(changes as u64);
        self.appended_bytes.increment(bytes as u64);
    }

    /// A persist call made at `started` returned: one that completed at once (nothing
    /// left to upload) is a success now, one that failed at once a failure; a pending
    /// one is counted by [`WriterMetrics::persist_succeeded`] or
    /// [`WriterMetrics::persist_failed`] when it completes.
    #[inline]
    pub fn persisted(&self, started: Instant, returned: PersistReturned) {
        self.persists.increment(1);
        match returned {
            PersistReturned::Completed => self.persist_succeeded(started),
            PersistReturned::Pending => {}
            PersistReturned::Failed => self.persist_failed(),
        }
    }

    /// A persist called at `started` completed successfully.
    #[inline]
    pub fn persist_succeeded(&self, started: Instant) {
        self.persist_latency.record(started.elapsed().as_secs_f64());
    }

    /// A persist failed (at once or later).
    #[inline]
    pub fn persist_failed(&self) {
        self.persist_failures.increment(1);
    }

    /// The writer's sandbox trapped.
    pub fn trapped(&self) {
        self.traps.increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded_and_stable() {
        let labels = WriterLabels::new(2);
        assert_eq!(labels.label("a"), "a");
        assert_eq!(labels.label("b"), "b");
        assert_eq!(labels.label("c"), OTHER_WRITERS);
        assert_eq!(labels.label("a"), "a", "a name keeps its label");
        assert_eq!(labels.label("d"), OTHER_WRITERS);
        assert_eq!(labels.label("c"), OTHER_WRITERS, "and so does an overflow");
        let none = WriterLabels::new(0);
        assert_eq!(none.label("a"), OTHER_WRITERS);
    }
}
