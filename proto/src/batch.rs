//! The batching decisions of a shared upload scheduler, as a sans-IO state machine: tasks of
//! every writer queue together and leave as one batch (one file) when the persist delay
//! has passed since the batch's first task or when the queued bytes reach the size
//! threshold (Flink's `BatchingStateChangeUploadScheduler`), or at once when a task of
//! half the threshold or more arrives: batching exists to put the small tasks of many
//! writers into one file, and a task that large is worth a file of its own, so holding
//! it for company only delays its checkpoint (Flink holds it).
//!
//! The kinds of methods, as in quinn-proto's `Connection`:
//!
//! - **inputs**: [`Batcher::push`] (a task arrives), [`Batcher::handle_timeout`] (the
//!   time [`Batcher::poll_timeout`] named has come), [`Batcher::close`] (the scheduler
//!   closes); each returns the batch that leaves, the output;
//! - **timers**: [`Batcher::poll_timeout`];
//! - **queries**: [`Batcher::len`], [`Batcher::is_empty`], [`Batcher::is_closed`].
//!
//! Once closed, a batcher refuses every task, and the tasks it held never leave: both
//! fail with a [`Closed`], worded here for every host.

use std::time::{Duration, Instant};

use crate::time::Time;

/// Why a task fails because its scheduler closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Closed {
    /// The task arrived after the scheduler closed: it was not accepted.
    #[error("the changelog storage is closed")]
    Refused,
    /// The task was queued when the scheduler closed: it never left.
    #[error("the changelog storage was closed before the upload started")]
    BeforeUpload,
}

/// Queued items of type `I` and when they must leave, on instants of type `T` (see
/// [`crate::time`]).
#[derive(Debug)]
pub struct Batcher<I, T: Time = Instant> {
    delay: Duration,
    size_threshold: u64,
    queue: Vec<I>,
    bytes: u64,
    deadline: Option<T>,
    closed: bool,
}

impl<I, T: Time> Batcher<I, T> {
    /// A batcher that holds a batch for `delay` after its first item, or until it holds
    /// `size_threshold` bytes, or until an item of half that arrives. A zero delay or
    /// threshold sends every item at once.
    pub fn new(delay: Duration, size_threshold: u64) -> Self {
        Self {
            delay,
            size_threshold,
            queue: Vec::new(),
            bytes: 0,
            deadline: None,
            closed: false,
        }
    }

    /// Input: queues `item` of `size` bytes at `now`; returns the batch if it must leave
    /// now. After [`Batcher::close`] the item is refused ([`Closed::Refused`]) and dropped.
    pub fn push(&mut self, item: I, size: u64, now: T) -> Result<Option<Vec<I>>, Closed> {
        self.queue_item(item, size, now, true)
    }

    /// Input: as [`Batcher::push`], for an item nobody waits for (a pre-emptive upload):
    /// it never leaves alone for its size, only with its batch at the size threshold or
    /// after the delay. Writers fill up at the same pace, so their pre-emptive uploads come
    /// close together; waiting the delay lets them share a file (one object-store request
    /// instead of one each) and delays no checkpoint.
    pub fn push_background(
        &mut self,
        item: I,
        size: u64,
        now: T,
    ) -> Result<Option<Vec<I>>, Closed> {
        self.queue_item(item, size, now, false)
    }

    fn queue_item(
        &mut self,
        item: I,
        size: u64,
        now: T,
        alone_when_large: bool,
    ) -> Result<Option<Vec<I>>, Closed> {
        if self.closed {
            return Err(Closed::Refused);
        }
        self.queue.push(item);
        self.bytes = self.bytes.saturating_add(size);
        if self.delay.is_zero()
            || self.bytes >= self.size_threshold
            || (alone_when_large && size.saturating_mul(2) >= self.size_threshold)
        {
            return Ok(Some(self.take()));
        }
        self.deadline.get_or_insert(now + self.delay);
        Ok(None)
    }

    /// Timer: when the queued batch must leave, if anything waits for the time.
    pub fn poll_timeout(&self) -> Option<T> {
        self.deadline
    }

    /// Input: the time is `now`; returns the batch if its delay has passed.
    pub fn handle_timeout(&mut self, now: T) -> Option<Vec<I>> {
        match self.deadline {
            Some(deadline) if now >= deadline => Some(self.take()),
            _ => None,
        }
    }

    /// Input: the scheduler closes. Returns what was queued, which never leaves: each
    /// fails with [`Closed::BeforeUpload`]; later items are refused.
    pub fn close(&mut self) -> Vec<I> {
        self.closed = true;
        self.take()
    }

    fn take(&mut self) -> Vec<I> {
        self.bytes = 0;
        self.deadline = None;
        std::mem::take(&mut self.queue)
    }

    /// Query: items waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Query: whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Query: whether [`Batcher::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Millis;

    fn at(start: Millis, ms: u64) -> Millis {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_batch_leaves_when_the_delay_since_its_first_item_has_passed() {
        let t0 = Millis(0);
        let mut b = Batcher::new(Duration::from_millis(10), 1000);
        assert_eq!(b.poll_timeout(), None);
        assert_eq!(b.push("a", 1, t0), Ok(None));
        assert_eq!(b.poll_timeout(), Some(at(t0, 10)));
        // A later item does not move the deadline.
        assert_eq!(b.push("b", 1, at(t0, 7)), Ok(None));
        assert_eq!(b.poll_timeout(), Some(at(t0, 10)));
        assert_eq!(b.handle_timeout(at(t0, 9)), None);
        assert_eq!(b.handle_timeout(at(t0, 10)), Some(vec!["a", "b"]));
        assert_eq!((b.poll_timeout(), b.len()), (None, 0));
        // The next batch starts its own delay.
        assert_eq!(b.push("c", 1, at(t0, 30)), Ok(None));
        assert_eq!(b.poll_timeout(), Some(at(t0, 40)));
    }

    #[test]
    fn a_batch_leaves_at_once_when_it_reaches_the_size_threshold() {
        let t0 = Millis(0);
        let mut b = Batcher::new(Duration::from_secs(3600), 10);
        assert_eq!(b.push(1, 4, t0), Ok(None));
        assert_eq!(b.push(2, 4, t0), Ok(None));
        assert_eq!(b.push(3, 2, t0), Ok(Some(vec![1, 2, 3])));
        assert_eq!(b.poll_timeout(), None);
        // One item above the threshold leaves alone.
        assert_eq!(b.push(4, 11, t0), Ok(Some(vec![4])));
    }

    #[test]
    fn an_item_of_half_the_threshold_does_not_wait_for_company() {
        let t0 = Millis(0);
        let mut b = Batcher::new(Duration::from_secs(3600), 10);
        assert_eq!(b.push(1, 1, t0), Ok(None));
        // Worth a file of its own: it leaves at once, with what waited.
        assert_eq!(b.push(2, 5, t0), Ok(Some(vec![1, 2])));
        assert_eq!(b.push(3, 4, t0), Ok(None));
    }

    #[test]
    fn a_large_background_item_waits_for_company() {
        let t0 = Millis(0);
        let mut b = Batcher::new(Duration::from_millis(10), 100);
        // A persist's task of half the threshold leaves at once ...
        assert_eq!(b.push('p', 50, t0), Ok(Some(vec!['p'])));
        // ... a pre-emptive one of the same size waits, and the next joins it.
        assert_eq!(b.push_background('a', 60, t0), Ok(None));
        assert_eq!(b.push_background('b', 30, at(t0, 3)), Ok(None));
        assert_eq!(b.handle_timeout(at(t0, 10)), Some(vec!['a', 'b']));
        // The threshold still sends a batch at once.
        assert_eq!(b.push_background('c', 60, at(t0, 11)), Ok(None));
        assert_eq!(
            b.push_background('d', 60, at(t0, 12)),
            Ok(Some(vec!['c', 'd']))
        );
    }

    #[test]
    fn zero_delay_or_threshold_sends_every_item_alone() {
        let t0 = Millis(0);
        let mut no_delay = Batcher::new(Duration::ZERO, 1 << 20);
        assert_eq!(no_delay.push('x', 1, t0), Ok(Some(vec!['x'])));
        let mut no_threshold = Batcher::new(Duration::from_secs(1), 0);
        assert_eq!(no_threshold.push('y', 0, t0), Ok(Some(vec!['y'])));
    }

    #[test]
    fn close_returns_what_waited_and_refuses_what_comes_after() {
        let t0 = Millis(0);
        let mut b = Batcher::new(Duration::from_millis(5), 100);
        assert_eq!(b.push(1, 1, t0), Ok(None));
        assert_eq!(b.push(2, 1, t0), Ok(None));
        assert_eq!(b.close(), vec![1, 2]);
        assert_eq!((b.len(), b.poll_timeout()), (0, None));
        assert_eq!(b.handle_timeout(at(t0, 100)), None);
        assert_eq!(b.push(3, 1, t0), Err(Closed::Refused));
        assert_eq!(b.push(4, 1000, t0), Err(Closed::Refused));
        assert!(b.is_empty() && b.is_closed());
        assert_eq!(
            Closed::Refused.to_string(),
            "the changelog storage is closed"
        );
        assert_eq!(
            Closed::BeforeUpload.to_string(),
            "the changelog storage was closed before the upload started"
        );
    }
}
