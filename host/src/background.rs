//! Deletions and uploads run off the writers' call paths; this counts them so a caller
//! can wait until everything started has finished (tests, and the end of `dstl run`).

use std::sync::{Arc, Condvar, Mutex};

use crate::sync::{CondvarExt, LockExt};

/// A count of outstanding background jobs.
#[derive(Clone, Default)]
pub(crate) struct Outstanding(Arc<(Mutex<usize>, Condvar)>);

/// Held while a job runs; dropping it marks the job done.
pub(crate) struct Job(Outstanding);

impl Outstanding {
    /// Marks a job started.
    pub fn start(&self) -> Job {
        *self.0.0.locked() += 1;
        Job(self.clone())
    }

    /// Blocks until no job is outstanding.
    pub fn wait_idle(&self) {
        let (count, cv) = &*self.0;
        let mut n = count.locked();
        while *n > 0 {
            n = cv.wait_locked(n);
        }
    }
}

impl Outstanding {
    /// Like [`Outstanding::wait_idle`], but gives up after `limit`; true if idle.
    pub fn wait_idle_timeout(&self, limit: std::time::Duration) -> bool {
        let (count, cv) = &*self.0;
        let n = count.locked();
        let (n, _) = cv
            .wait_timeout_while(n, limit, |n| *n > 0)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *n == 0
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let (count, cv) = &*self.0.0;
        let mut n = count.locked();
        *n -= 1;
        if *n == 0 {
            cv.notify_all();
        }
    }
}
