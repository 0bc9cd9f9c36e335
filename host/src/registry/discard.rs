//! Deletions off the callers' threads, on a bounded pool.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::background::{Job, Outstanding};
use crate::store::{Holder, Stores};
use crate::sync::{CondvarExt, LockExt};

/// Deletes files on `dstl.dfs.discard.num-threads` threads, off the callers' threads.
/// After [`Discarder::close`] deletions run on the caller's thread, so none is lost.
#[derive(Clone)]
pub(crate) struct Discarder {
    inner: Arc<DiscardPool>,
}

struct DiscardPool {
    queue: Mutex<DiscardQueue>,
    wake: Condvar,
    stores: Stores,
    outstanding: Outstanding,
}

#[derive(Default)]
struct DiscardQueue {
    paths: VecDeque<(Holder, String, Job)>,
    /// Deletions running on a pool thread.
    running: usize,
    closed: bool,
}

impl Discarder {
    /// Starts `threads` deletion threads.
    pub fn new(threads: usize, outstanding: Outstanding, stores: Stores) -> std::io::Result<Self> {
        let inner = Arc::new(DiscardPool {
            queue: Mutex::new(DiscardQueue::default()),
            wake: Condvar::new(),
            stores,
            outstanding,
        });
        for n in 0..threads.max(1) {
            let pool = inner.clone();
            std::thread::Builder::new()
                .name(format!("dstl-discard-{n}"))
                .spawn(move || pool.work())?;
        }
        Ok(Self { inner })
    }

    /// Deletes `path` from the store that holds it soon (at once, on this thread, once
    /// the pool is closed).
    pub fn discard(&self, holder: Holder, path: String) {
        let mut queue = self.inner.queue.locked();
        if queue.closed {
            drop(queue);
            self.inner.delete(holder, &path);
            return;
        }
        queue
            .paths
            .push_back((holder, path, self.inner.outstanding.start()));
        drop(queue);
        self.inner.wake.notify_one();
    }

    /// Lets the pool finish the deletions queued so far, for up to `grace`, and stops it.
    /// Returns the paths it could not delete in time: each is reported here, and
    /// `dstl gc` collects them. Later deletions run on their caller's thread.
    pub fn close(&self, grace: Duration) -> Vec<String> {
        let deadline = Instant::now() + grace;
        let mut queue = self.inner.queue.locked();
        queue.closed = true;
        self.inner.wake.notify_all();
        while !queue.paths.is_empty() || queue.running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            queue = self.inner.wake.wait_timeout_locked(queue, left).0;
        }
        let abandoned: Vec<String> = queue.paths.drain(..).map(|(_, path, _job)| path).collect();
        for path in &abandoned {
            tracing::warn!(%path, "file not deleted before the storage closed; orphan collection (dstl::gc) removes it");
        }
        abandoned
    }
}

impl DiscardPool {
    fn work(&self) {
        let mut queue = self.queue.locked();
        loop {
            if let Some((holder, path, job)) = queue.paths.pop_front() {
                queue.running += 1;
                drop(queue);
                self.delete(holder, &path);
                drop(job);
                queue = self.queue.locked();
                queue.running -= 1;
                // `close` waits for the queue to run dry.
                self.wake.notify_all();
            } else if queue.closed {
                return;
            } else {
                queue = self.wake.wait_locked(queue);
            }
        }
    }

    fn delete(&self, holder: Holder, path: &str) {
        match self.stores.delete(holder, path) {
            Ok(()) => tracing::debug!(%path, "discarded changelog file"),
            Err(e) => tracing::warn!(%path, error = %e, "could not discard changelog file"),
        }
    }
}
