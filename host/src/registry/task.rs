//! Reference counts of uploaded files that no confirmed checkpoint owns yet: the rules
//! are `dstl_proto::ownership::TaskRefs`'; this shares them between threads and deletes
//! what they give up.

use std::sync::{Arc, Mutex};

use dstl_proto::ownership::{Released, TaskRefs, Tracking};

use super::Discarder;

/// Reference counts per file (Flink's `TaskChangelogRegistry`).
#[derive(Clone)]
pub struct TaskRegistry {
    refs: Arc<Mutex<TaskRefs>>,
    discarder: Discarder,
}

impl TaskRegistry {
    pub(crate) fn new(discarder: Discarder) -> Self {
        Self {
            refs: Arc::default(),
            discarder,
        }
    }

    /// Starts tracking a new file used by `count` change sets. A file no change set uses
    /// is nobody's: it is deleted at once (the host refuses empty upload tasks, so this
    /// is a bug, reported, never a panic on an upload thread).
    pub fn start_tracking(&self, path: &str, count: u64) {
        let tracking = self.refs.lock().unwrap().start_tracking(path, count);
        match tracking {
            Tracking::Started => {}
            Tracking::Replaced => {
                tracing::warn!(%path, "file was already tracked; its count was replaced")
            }
            Tracking::Empty => {
                tracing::error!(%path, "a new file holds no change set; deleting it");
                self.discarder.discard(path.to_string());
            }
        }
    }

    /// Ownership moved to a confirmed checkpoint: never delete the file here.
    pub fn stop_tracking(&self, path: &str) {
        self.refs.lock().unwrap().stop_tracking(path);
    }

    /// One change set no longer needs the file; at zero it is deleted.
    pub fn release(&self, path: &str) {
        let released = self.refs.lock().unwrap().release(path);
        match released {
            Released::Kept => {}
            Released::Delete => self.discarder.discard(path.to_string()),
            Released::Untracked => {
                tracing::debug!(%path, "release of an untracked file (confirmed or already discarded)")
            }
        }
    }

    /// The count of a tracked file, `None` if untracked.
    #[cfg(feature = "test-util")]
    pub fn count(&self, path: &str) -> Option<u64> {
        self.refs.lock().unwrap().count(path)
    }

    /// Number of tracked files.
    #[cfg(feature = "test-util")]
    pub fn tracked(&self) -> usize {
        self.refs.lock().unwrap().tracked()
    }
}
