//! The in-flight byte limit and the availability signal.
//!
//! Flink's rule: a task is admitted while the bytes in flight are *below* the limit, even
//! if the task itself overshoots it; otherwise the caller waits until completions bring
//! the bytes back below. Availability flips off when an admission leaves no capacity and
//! back on when a release restores it, so an operator can stop pulling input instead of
//! blocking.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use dstl_proto::error::Refusal;

use crate::sync::{CondvarExt, LockExt};

/// How often a wait for capacity asks the thread's interrupt check.
const INTERRUPT_POLL: Duration = Duration::from_millis(20);

thread_local! {
    /// The check [`interruptible`] installed on this thread, if any: a pointer to a
    /// closure on the stack of `interruptible`, which removes it before returning.
    static INTERRUPT_CHECK: Cell<Option<*const (dyn Fn() -> bool + 'static)>> =
        const { Cell::new(None) };
}

/// Runs `f` on this thread with `interrupted` consulted while `f` waits for upload
/// capacity (the in-flight limit of `dstl.dfs.upload.max-in-flight`): a wait asks it
/// every 20 ms and gives up once it answers true, and the upload that waited fails with
/// [`crate::UploadError::Refused`] (`Refusal::Interrupted`): a pre-emptive upload fails
/// the append that triggered it, a persist fails. A writer's creation waiting for a slot
/// of the instance pool gives up the same way. An embedding whose threads are interrupted
/// by other means than dstl's own close (a JVM's `Thread.interrupt`, a cancelled task) passes its
/// way of asking here, so a back-pressured call never outlives the task that made it.
///
/// `interrupted` runs on this thread, under no lock of the writer's, and must not call
/// into dstl.
pub fn interruptible<R>(interrupted: &dyn Fn() -> bool, f: impl FnOnce() -> R) -> R {
    /// Puts back the check that was installed before, also when `f` unwinds.
    struct Restore(Option<*const (dyn Fn() -> bool + 'static)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            INTERRUPT_CHECK.with(|check| check.set(self.0));
        }
    }
    // SAFETY: only the lifetime is erased. The pointer is used only by `interrupted_now`
    // on this thread while `f` runs, and `Restore` removes it before `interrupted` goes
    // out of scope, on every path out of this function.
    let erased: *const (dyn Fn() -> bool + 'static) =
        unsafe { std::mem::transmute(interrupted as *const (dyn Fn() -> bool + '_)) };
    let _restore = Restore(INTERRUPT_CHECK.with(|check| check.replace(Some(erased))));
    f()
}

/// One wait on `changed` that the thread's [`interruptible`] check can end: for at most
/// `limit` (`None`: until notified), and while a check is installed at most
/// [`INTERRUPT_POLL`], the check asked first; `None` once it says to give up.
pub(crate) fn wait_interruptibly<'a, T>(
    changed: &Condvar,
    guard: MutexGuard<'a, T>,
    limit: Option<Duration>,
) -> Option<MutexGuard<'a, T>> {
    let poll = match interrupted_now() {
        Some(true) => return None,
        Some(false) => Some(INTERRUPT_POLL),
        None => None,
    };
    Some(match limit.into_iter().chain(poll).min() {
        Some(timeout) => changed.wait_timeout_locked(guard, timeout).0,
        None => changed.wait_locked(guard),
    })
}

/// Whether the check of this thread's [`interruptible`] says to give up; `None` without one.
fn interrupted_now() -> Option<bool> {
    INTERRUPT_CHECK.with(|check| check.get()).map(|check| {
        // SAFETY: see `interruptible`: the closure outlives its installation.
        let check = unsafe { &*check };
        check()
    })
}

/// Bytes in flight against a limit.
pub(crate) struct Throttle {
    max: u64,
    state: Mutex<ThrottleState>,
    changed: Condvar,
    available: watch::Sender<bool>,
    /// `dstl_upload_in_flight_bytes`, moved by admissions and releases.
    gauge: metrics::Gauge,
}

struct ThrottleState {
    in_flight: u64,
    closed: bool,
}

impl Throttle {
    pub fn new(max: u64) -> Self {
        Self {
            max,
            state: Mutex::new(ThrottleState {
                in_flight: 0,
                closed: false,
            }),
            changed: Condvar::new(),
            available: watch::channel(true).0,
            gauge: metrics::gauge!(crate::telemetry::IN_FLIGHT),
        }
    }

    /// Waits for capacity, then admits `size` bytes. Fails once the throttle is closed,
    /// and while waiting once `cancel` is set (and [`Throttle::wake`] called), or once the
    /// thread's [`interruptible`] check says so.
    pub fn admit(&self, size: u64, cancel: &AtomicBool) -> Result<(), Refusal> {
        let mut state = self.state.locked();
        while state.in_flight >= self.max && !state.closed {
            if cancel.load(Ordering::SeqCst) {
                return Err(Refusal::WriterClosed);
            }
            state = wait_interruptibly(&self.changed, state, None).ok_or(Refusal::Interrupted)?;
        }
        if state.closed {
            return Err(Refusal::StorageClosed);
        }
        // Sizes are the host's own sums of what it copied, but never wrap.
        state.in_flight = state.in_flight.saturating_add(size);
        self.gauge.increment(size as f64);
        if state.in_flight >= self.max {
            self.available.send_replace(false);
        }
        Ok(())
    }

    /// Returns `size` bytes; wakes waiters when capacity is back.
    pub fn release(&self, size: u64) {
        let mut state = self.state.locked();
        let had_capacity = state.in_flight < self.max;
        let released = size.min(state.in_flight);
        state.in_flight -= released;
        self.gauge.decrement(released as f64);
        if !had_capacity && state.in_flight < self.max {
            self.available.send_replace(true);
            self.changed.notify_all();
        }
    }

    /// Wakes every waiter to look at its cancel flag again (set it before calling).
    pub fn wake(&self) {
        // Taking the lock orders this after a waiter's check of its flag: the waiter is
        // either still to check (and sees the flag) or waiting (and is woken).
        drop(self.state.locked());
        self.changed.notify_all();
    }

    /// Wakes every waiter with an error; later admissions fail.
    pub fn close(&self) {
        self.state.locked().closed = true;
        self.changed.notify_all();
        self.available.send_replace(true);
    }

    pub fn in_flight(&self) -> u64 {
        self.state.locked().in_flight
    }

    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.available.subscribe()
    }
}

/// Whether the storage accepts uploads without blocking; obtained from
/// [`crate::ChangelogStorage::availability`].
#[derive(Clone)]
pub struct Availability {
    rx: watch::Receiver<bool>,
}

impl Availability {
    pub(crate) fn new(rx: watch::Receiver<bool>) -> Self {
        Self { rx }
    }

    /// True while bytes in flight are below the limit.
    pub fn is_available(&self) -> bool {
        *self.rx.borrow()
    }

    /// Completes once uploads are accepted without blocking.
    pub async fn available(&mut self) {
        // An error means the throttle is gone with its storage: nothing blocks any more.
        let _ = self.rx.wait_for(|available| *available).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    static GO: AtomicBool = AtomicBool::new(false);

    #[test]
    fn admits_below_the_limit_even_when_overshooting() {
        let t = Throttle::new(10_000);
        t.admit(10_001, &GO).unwrap();
        assert_eq!(t.in_flight(), 10_001);
        assert!(!*t.subscribe().borrow());
        t.release(10_001);
        assert!(*t.subscribe().borrow());
        t.admit(1, &GO).unwrap();
    }

    #[test]
    fn a_cancelled_waiter_gives_up_and_others_keep_waiting() {
        let t = Arc::new(Throttle::new(1));
        t.admit(1, &GO).unwrap();
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = {
            let (t, cancel) = (t.clone(), cancel.clone());
            std::thread::spawn(move || t.admit(1, &cancel))
        };
        let other = {
            let t = t.clone();
            std::thread::spawn(move || t.admit(1, &GO))
        };
        std::thread::sleep(Duration::from_millis(50));
        cancel.store(true, Ordering::SeqCst);
        t.wake();
        assert_eq!(cancelled.join().unwrap(), Err(Refusal::WriterClosed));
        assert!(!other.is_finished(), "an uncancelled waiter still waits");
        t.release(1);
        other.join().unwrap().unwrap();
        assert_eq!(t.in_flight(), 1);
    }

    #[test]
    fn a_full_throttle_blocks_until_release() {
        let t = Arc::new(Throttle::new(10));
        t.admit(10, &GO).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let t = t.clone();
            std::thread::spawn(move || {
                t.admit(1, &GO).unwrap();
                tx.send(()).unwrap();
            })
        };
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "must block while full"
        );
        t.release(10);
        rx.recv_timeout(Duration::from_secs(30))
            .expect("released waiter proceeds");
        waiter.join().unwrap();
        assert_eq!(t.in_flight(), 1);
    }

    #[test]
    fn an_interrupted_waiter_gives_up_and_one_without_a_check_waits_on() {
        let t = Arc::new(Throttle::new(1));
        t.admit(1, &GO).unwrap();
        let interrupt = Arc::new(AtomicBool::new(false));
        let interrupted = {
            let (t, interrupt) = (t.clone(), interrupt.clone());
            std::thread::spawn(move || {
                let check = || interrupt.load(Ordering::SeqCst);
                let result = interruptible(&check, || t.admit(1, &GO));
                // The check is gone once `interruptible` returns.
                (result, interrupted_now())
            })
        };
        let other = {
            let t = t.clone();
            std::thread::spawn(move || t.admit(1, &GO))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!interrupted.is_finished(), "waits until interrupted");
        interrupt.store(true, Ordering::SeqCst);
        let (result, check_after) = interrupted.join().unwrap();
        assert_eq!(result, Err(Refusal::Interrupted));
        assert_eq!(check_after, None);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!other.is_finished(), "a waiter without a check still waits");
        t.release(1);
        other.join().unwrap().unwrap();
    }

    #[test]
    fn close_fails_waiters() {
        let t = Arc::new(Throttle::new(1));
        t.admit(1, &GO).unwrap();
        let waiter = {
            let t = t.clone();
            std::thread::spawn(move || t.admit(1, &GO))
        };
        std::thread::sleep(Duration::from_millis(50));
        t.close();
        assert_eq!(waiter.join().unwrap(), Err(Refusal::StorageClosed));
    }
}
