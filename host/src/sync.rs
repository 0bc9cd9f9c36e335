//! Locks that a panic does not poison for good.
//!
//! A panic while a lock is held marks a `std` mutex poisoned, and `lock().unwrap()` then
//! panics in every later caller: one bug in one upload would fail every writer of the
//! storage, and a panic inside a destructor during unwinding aborts the process (a JVM
//! embedding dstl would die). The state behind these locks (queues, counters, maps of
//! files) stays usable after a panic elsewhere, so callers take the guard as it is. A
//! writer's own state is the exception: its lock is handled by `writer/core.rs`, which
//! fails the writer instead (a call interrupted half-way may have left the guest and the
//! host disagreeing).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// [`Mutex::lock`] that takes the guard of a poisoned lock.
pub(crate) trait LockExt<T> {
    /// The guard, whether or not a panic poisoned the lock.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Condvar`] waits that take the guard of a poisoned lock.
pub(crate) trait CondvarExt {
    /// [`Condvar::wait`], ignoring poison.
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;

    /// [`Condvar::wait_timeout`], ignoring poison; true if it timed out.
    fn wait_timeout_locked<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, bool);
}

impl CondvarExt for Condvar {
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_timeout_locked<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, bool) {
        let (guard, result) = self
            .wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner);
        (guard, result.timed_out())
    }
}

/// The message a panic was raised with, for errors that report it.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_guard() {
        let lock = std::sync::Arc::new(Mutex::new(1));
        let poisoner = lock.clone();
        let _ = std::thread::spawn(move || {
            let _guard = poisoner.locked();
            panic!("poison it");
        })
        .join();
        assert!(lock.is_poisoned());
        *lock.locked() += 1;
        assert_eq!(*lock.locked(), 2);
    }
}
