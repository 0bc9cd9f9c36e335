//! Lending a sandbox's memory to the uploads: `uploader.schedule` hands the host the
//! blocks where they lie in the guest's memory, and the upload writes them from there
//! into the file, so a value leaves the sandbox with one copy (into the page cache, the
//! `O_DIRECT` buffer or the object store's request body).
//!
//! Why this is sound:
//! - The memory does not move. The engine's pooling allocator gives each instance a fixed
//!   slot and `memory_may_move(false)`: growth stays in place or fails.
//! - The memory stays mapped, and no other writer gets it, while any block lent from it
//!   is on its way: each block holds a [`Lease`], and an instance dropped while leases
//!   remain hands its store to the [`Keeper`], which drops it with the last lease.
//! - The guest keeps the lent bytes as they are until the host returns them (WIT
//!   `uploader.schedule`): when the last attempt that may read them has ended, the
//!   task's lease ends and its id goes to the guest with the next outcome delivered
//!   ([`Keeper::returned`]); the scheduler ends the leases of a batch before it delivers
//!   the batch's outcomes, so unless an attempt that lost a race still runs, that is the
//!   task's own outcome. Bytes a lying guest changes after the host
//!   checked its block end up in that writer's own change sets only: where each block
//!   lies in the file, and how long it is, the host fixed when it checked it.
//! - A dropped instance's pool slot stays taken while its store is kept. A writer created
//!   while the pool is full of them waits for one to end ([`wait_for_retired`]): they end
//!   with their uploads.
//! - A guest keeps at most a quarter of its memory cap lent ([`Keeper::try_lend`]); past
//!   that the host copies the blocks out, as it did before lending, and the guest lets
//!   them go at once. The cap of the in-flight bytes is the storage's, not the writer's,
//!   so without this bound one writer's in-flight blocks could fill its sandbox.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crate::sync::LockExt;
use crate::upload::throttle::wait_interruptibly;

/// Stores of dropped instances kept for their leases, in this process, and a signal for
/// each one that ends.
static RETIRED: Mutex<Retired> = Mutex::new(Retired { kept: 0, ended: 0 });
static ENDED: Condvar = Condvar::new();

struct Retired {
    /// Kept now.
    kept: u64,
    /// Ended so far.
    ended: u64,
}

/// Waits until a store kept for its leases ends, or `deadline`; false if none is kept
/// (nothing to wait for), the deadline passed, or the thread's interrupt check
/// ([`crate::interruptible`]) says to give up.
pub(crate) fn wait_for_retired(deadline: Instant) -> bool {
    let mut retired = RETIRED.locked();
    if retired.kept == 0 {
        return false;
    }
    let before = retired.ended;
    while retired.ended == before {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return false;
        };
        let Some(guard) = wait_interruptibly(&ENDED, retired, Some(left)) else {
            return false;
        };
        retired = guard;
    }
    true
}

/// What keeps one sandbox's memory alive for the blocks lent from it.
#[derive(Default)]
pub(crate) struct Keeper {
    /// The store of a dropped instance, while leases remain.
    retired: Mutex<Option<Box<dyn Any + Send>>>,
    /// Bytes lent now.
    lent: AtomicU64,
    /// Counted in [`RETIRED`].
    counted: AtomicBool,
    /// Tasks whose leases ended since the guest last heard.
    returned: Mutex<Vec<u64>>,
}

impl Keeper {
    /// A lease on the `bytes` of task `task`, if the guest's lent bytes stay within a
    /// quarter of `memory_limit` with them.
    pub fn try_lend(self: &Arc<Self>, task: u64, bytes: u64, memory_limit: u64) -> Option<Lease> {
        let limit = memory_limit / 4;
        self.lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |lent| {
                lent.checked_add(bytes).filter(|&total| total <= limit)
            })
            .ok()?;
        Some(Lease {
            keeper: self.clone(),
            task,
            bytes,
        })
    }

    /// The tasks whose leases ended since the last call, for the guest.
    pub fn returned(&self) -> Vec<u64> {
        std::mem::take(&mut *self.returned.locked())
    }

    /// Takes the store of an instance being dropped: it lives on until the last lease on
    /// its memory ends, or ends here if there is none.
    pub fn retire(self: Arc<Self>, store: Box<dyn Any + Send>) {
        if Arc::strong_count(&self) > 1 {
            RETIRED.locked().kept += 1;
            self.counted.store(true, Ordering::Release);
            *self.retired.locked() = Some(store);
        }
        // Otherwise `store` drops here; and if the last lease ended meanwhile, dropping
        // `self` drops the keeper with the store in it.
    }

    /// Bytes lent now, for tests.
    #[cfg(test)]
    pub fn lent(&self) -> u64 {
        self.lent.load(Ordering::Acquire)
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // The store first: its pool slot is free when the waiters wake.
        drop(self.retired.get_mut().map(Option::take));
        if self.counted.load(Ordering::Acquire) {
            let mut retired = RETIRED.locked();
            retired.kept -= 1;
            retired.ended += 1;
            ENDED.notify_all();
        }
    }
}

/// Keeps a sandbox's memory mapped, and away from other writers, for one block.
pub(crate) struct Lease {
    keeper: Arc<Keeper>,
    task: u64,
    bytes: u64,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.returned.locked().push(self.task);
        self.keeper.lent.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dropped(Arc<AtomicU64>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_retired_store_lives_until_the_last_lease_ends() {
        let drops = Arc::new(AtomicU64::new(0));
        let keeper = Arc::new(Keeper::default());
        let a = keeper.try_lend(1, 10, 100).unwrap();
        let b = keeper.try_lend(2, 15, 100).unwrap();
        assert!(
            keeper.try_lend(3, 1, 100).is_none(),
            "a quarter of 100 is lent"
        );
        assert_eq!(keeper.lent(), 25);
        drop(a);
        assert_eq!(keeper.returned(), [1]);
        assert_eq!(keeper.returned(), [0u64; 0], "each task is returned once");
        let a = keeper.try_lend(4, 10, 100).unwrap();
        keeper.clone().retire(Box::new(Dropped(drops.clone())));
        drop(keeper);
        drop(a);
        assert_eq!(drops.load(Ordering::SeqCst), 0, "a lease remains");
        drop(b);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_store_without_leases_ends_at_once() {
        let drops = Arc::new(AtomicU64::new(0));
        let keeper = Arc::new(Keeper::default());
        drop(keeper.try_lend(7, 5, 100));
        assert_eq!(keeper.lent(), 0);
        assert_eq!(keeper.returned(), [7]);
        keeper.retire(Box::new(Dropped(drops.clone())));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
