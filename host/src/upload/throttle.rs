//! The in-flight byte limit and the availability signal.
//!
//! Flink's rule: a task is admitted while the bytes in flight are *below* the limit, even
//! if the task itself overshoots it; otherwise the caller waits until completions bring
//! the bytes back below. Availability flips off when an admission leaves no capacity and
//! back on when a release restores it, so an operator can stop pulling input instead of
//! blocking.

use std::sync::{Condvar, Mutex};

use tokio::sync::watch;

/// The throttle was closed with its storage: nothing is admitted any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the changelog storage is closed")]
pub(crate) struct ThrottleClosed;

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

    /// Waits for capacity, then admits `size` bytes. Fails once the throttle is closed.
    pub fn admit(&self, size: u64) -> Result<(), ThrottleClosed> {
        let mut state = self.state.lock().unwrap();
        while state.in_flight >= self.max && !state.closed {
            state = self.changed.wait(state).unwrap();
        }
        if state.closed {
            return Err(ThrottleClosed);
        }
        state.in_flight += size;
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

    /// Wakes every waiter with an error; later seizes fail.
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

    #[test]
    fn admits_below_the_limit_even_when_overshooting() {
        let t = Throttle::new(10_000);
        t.admit(10_001).unwrap();
        assert_eq!(t.in_flight(), 10_001);
        assert!(!*t.subscribe().borrow());
        t.release(10_001);
        assert!(*t.subscribe().borrow());
        t.admit(1).unwrap();
    }

    #[test]
    fn a_full_throttle_blocks_until_release() {
        let t = Arc::new(Throttle::new(10));
        t.admit(10).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let t = t.clone();
            std::thread::spawn(move || {
                t.admit(1).unwrap();
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
        t.admit(1).unwrap();
        let waiter = {
            let t = t.clone();
            std::thread::spawn(move || t.admit(1))
        };
        std::thread::sleep(Duration::from_millis(50));
        t.close();
        assert_eq!(waiter.join().unwrap(), Err(ThrottleClosed));
    }
}
