//! The in-flight byte limit and the availability signal.
//!
//! Flink's rule: a task is admitted while the bytes in flight are *below* the limit, even
//! if the task itself overshoots it; otherwise the caller waits until completions bring
//! the bytes back below. Availability flips off when an admission leaves no capacity and
//! back on when a release restores it, so an operator can stop pulling input instead of
//! blocking.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use tokio::sync::watch;

/// Why a task was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The throttle was closed with its storage: nothing is admitted any more.
    Closed,
    /// The waiting writer is closing.
    Cancelled,
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
    /// and while waiting once `cancel` is set (and [`Throttle::wake`] called).
    pub fn admit(&self, size: u64, cancel: &AtomicBool) -> Result<(), Refused> {
        let mut state = self.state.lock().unwrap();
        while state.in_flight >= self.max && !state.closed {
            if cancel.load(Ordering::SeqCst) {
                return Err(Refused::Cancelled);
            }
            state = self.changed.wait(state).unwrap();
        }
        if state.closed {
            return Err(Refused::Closed);
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
        let mut state = self.state.lock().unwrap();
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
        drop(self.state.lock().unwrap());
        self.changed.notify_all();
    }

    /// Wakes every waiter with an error; later admissions fail.
    pub fn close(&self) {
        self.state.lock().unwrap().closed = true;
        self.changed.notify_all();
        self.available.send_replace(true);
    }

    pub fn in_flight(&self) -> u64 {
        self.state.lock().unwrap().in_flight
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
        assert_eq!(cancelled.join().unwrap(), Err(Refused::Cancelled));
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
    fn close_fails_waiters() {
        let t = Arc::new(Throttle::new(1));
        t.admit(1, &GO).unwrap();
        let waiter = {
            let t = t.clone();
            std::thread::spawn(move || t.admit(1, &GO))
        };
        std::thread::sleep(Duration::from_millis(50));
        t.close();
        assert_eq!(waiter.join().unwrap(), Err(Refused::Closed));
    }
}
