//! Reference counts of uploaded files that no confirmed checkpoint owns yet: the rules
//! are `dstl_proto::ownership::TaskRefs`'; this shares them between threads and deletes
//! what they give up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dstl_proto::ownership::{Released, TaskRefs, Tracking};

use crate::sync::LockExt;

use super::Discarder;
use crate::store::Holder;

/// Reference counts per file (Flink's `TaskChangelogRegistry`).
#[derive(Clone)]
pub struct TaskRegistry {
    inner: Arc<Mutex<Inner>>,
    discarder: Discarder,
}

#[derive(Default)]
struct Inner {
    refs: TaskRefs,
    /// The lease generation each tracked file was written in (`store::lease::LeaseWatch`):
    /// a checkpoint may name a tracked file only if no lapse of the lease came between.
    written: HashMap<String, u64>,
}

impl TaskRegistry {
    pub(crate) fn new(discarder: Discarder) -> Self {
        Self {
            inner: Arc::default(),
            discarder,
        }
    }

    /// Starts tracking a new file used by `count` change sets, as written in the lease's
    /// first generation (see [`TaskRegistry::track`]).
    #[cfg(feature = "test-util")]
    pub fn start_tracking(&self, path: &str, count: u64) {
        self.track(path, count, 0);
    }

    /// Starts tracking a new file used by `count` change sets, written in lease
    /// generation `generation`. A file no change set uses is nobody's: it is deleted at
    /// once (the host refuses empty upload tasks, so this is a bug, reported, never a
    /// panic on an upload thread).
    pub(crate) fn track(&self, path: &str, count: u64, generation: u64) {
        let tracking = {
            let mut inner = self.inner.locked();
            let tracking = inner.refs.start_tracking(path, count);
            if tracking != Tracking::Empty {
                inner.written.insert(path.to_string(), generation);
            }
            tracking
        };
        match tracking {
            Tracking::Started => {}
            Tracking::Replaced => {
                tracing::warn!(%path, "file was already tracked; its count was replaced")
            }
            Tracking::Empty => {
                tracing::error!(%path, "a new file holds no change set; deleting it");
                self.discarder.discard(Holder::Remote, path.to_string());
            }
        }
    }

    /// Ownership moved to a confirmed checkpoint: never delete the file here.
    pub fn stop_tracking(&self, path: &str) {
        let mut inner = self.inner.locked();
        inner.refs.stop_tracking(path);
        inner.written.remove(path);
    }

    /// The lease generation a tracked file was written in; `None` for a file a confirmed
    /// checkpoint owns (or one never tracked).
    pub(crate) fn written_in(&self, path: &str) -> Option<u64> {
        self.inner.locked().written.get(path).copied()
    }

    /// One change set no longer needs the file; at zero it is deleted.
    pub fn release(&self, path: &str) {
        let released = {
            let mut inner = self.inner.locked();
            let released = inner.refs.release(path);
            if released == Released::Delete {
                inner.written.remove(path);
            }
            released
        };
        match released {
            Released::Kept => {}
            Released::Delete => self.discarder.discard(Holder::Remote, path.to_string()),
            Released::Untracked => {
                tracing::debug!(%path, "release of an untracked file (confirmed or already discarded)")
            }
        }
    }

    /// The count of a tracked file, `None` if untracked.
    #[cfg(feature = "test-util")]
    pub fn count(&self, path: &str) -> Option<u64> {
        self.inner.locked().refs.count(path)
    }

    /// Number of tracked files.
    #[cfg(feature = "test-util")]
    pub fn tracked(&self) -> usize {
        self.inner.locked().refs.tracked()
    }
}
