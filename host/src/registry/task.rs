//! Reference counts of uploaded files that no confirmed checkpoint owns yet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Discarder;

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

    /// Starts tracking a new file used by `count` change sets. A file no change set uses
    /// is nobody's: it is deleted at once (the host refuses empty upload tasks, so this
    /// is a bug, reported, never a panic on an upload thread).
    pub fn start_tracking(&self, path: &str, count: u64) {
        if count == 0 {
            tracing::error!(%path, "a new file holds no change set; deleting it");
            self.discarder.discard(path.to_string());
            return;
        }
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
    #[cfg(feature = "test-util")]
    pub fn count(&self, path: &str) -> Option<u64> {
        self.counts.lock().unwrap().get(path).copied()
    }

    /// Number of tracked files.
    #[cfg(feature = "test-util")]
    pub fn tracked(&self) -> usize {
        self.counts.lock().unwrap().len()
    }
}
