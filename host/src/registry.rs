//! File ownership (spec §8): the task registry reference-counts uploaded files that no
//! confirmed checkpoint owns yet, and the local registry owns local copies per checkpoint.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::background::Outstanding;
use crate::store::Stores;

/// Deletes files off the caller's thread.
#[derive(Clone)]
pub(crate) struct Discarder {
    runtime: tokio::runtime::Handle,
    outstanding: Outstanding,
    stores: Stores,
}

impl Discarder {
    pub fn new(runtime: tokio::runtime::Handle, outstanding: Outstanding, stores: Stores) -> Self {
        Self {
            runtime,
            outstanding,
            stores,
        }
    }

    pub fn discard(&self, path: String) {
        let job = self.outstanding.start();
        let stores = self.stores.clone();
        self.runtime.spawn_blocking(move || {
            let _job = job;
            match stores.delete(&path) {
                Ok(()) => tracing::debug!(%path, "discarded changelog file"),
                Err(e) => tracing::warn!(%path, error = %e, "could not discard changelog file"),
            }
        });
    }
}

/// Reference counts per file (Flink's `TaskChangelogRegistry`).
#[derive(Clone)]
pub struct TaskRegistry {
    counts: Arc<Mutex<HashMap<String, u64>>>,
    discarder: Discarder,
}

impl TaskRegistry {
    pub(crate) fn new(discarder: Discarder) -> Self {
        Self {
            counts: Arc::default(),
            discarder,
        }
    }

    /// Starts tracking a new file used by `count` change sets.
    pub fn start_tracking(&self, path: &str, count: u64) {
        assert!(
            count > 0,
            "initial reference count of {path} must be above zero"
        );
        let previous = self.counts.lock().unwrap().insert(path.to_string(), count);
        if previous.is_some() {
            tracing::warn!(%path, "file was already tracked; its count was replaced");
        }
    }

    /// Ownership moved to a confirmed checkpoint: never delete the file here.
    pub fn stop_tracking(&self, path: &str) {
        self.counts.lock().unwrap().remove(path);
    }

    /// One change set no longer needs the file; at zero it is deleted.
    pub fn release(&self, path: &str) {
        let mut counts = self.counts.lock().unwrap();
        let Some(count) = counts.get_mut(path) else {
            tracing::debug!(%path, "release of an untracked file (confirmed or already discarded)");
            return;
        };
        *count -= 1;
        if *count == 0 {
            counts.remove(path);
            drop(counts);
            self.discarder.discard(path.to_string());
        }
    }

    /// The count of a tracked file, `None` if untracked.
    pub fn count(&self, path: &str) -> Option<u64> {
        self.counts.lock().unwrap().get(path).copied()
    }

    /// Number of tracked files.
    pub fn tracked(&self) -> usize {
        self.counts.lock().unwrap().len()
    }
}

/// Local copies and the highest checkpoint that uses each (Flink's `LocalChangelogRegistry`).
#[derive(Clone)]
pub struct LocalRegistry {
    entries: Arc<Mutex<HashMap<String, i64>>>,
    discarder: Discarder,
}

impl LocalRegistry {
    pub(crate) fn new(discarder: Discarder) -> Self {
        Self {
            entries: Arc::default(),
            discarder,
        }
    }

    /// Marks `path` as used by `checkpoint`, keeping the highest id.
    pub fn register(&self, path: &str, checkpoint: i64) {
        let mut entries = self.entries.lock().unwrap();
        let last = entries.entry(path.to_string()).or_insert(checkpoint);
        *last = (*last).max(checkpoint);
    }

    /// Deletes every local file last used by a checkpoint below `checkpoint` and returns
    /// their paths.
    pub fn discard_up_to(&self, checkpoint: i64) -> Vec<String> {
        let mut discarded = Vec::new();
        self.entries.lock().unwrap().retain(|path, last| {
            let keep = *last >= checkpoint;
            if !keep {
                discarded.push(path.clone());
            }
            keep
        });
        for path in &discarded {
            self.discarder.discard(path.clone());
        }
        discarded
    }

    /// The last checkpoint that uses `path`.
    pub fn last_used(&self, path: &str) -> Option<i64> {
        self.entries.lock().unwrap().get(path).copied()
    }
}
