//! The batching decisions of the shared scheduler, as a pure state machine: tasks of
//! every writer queue together and leave as one batch (one file) when the persist delay
//! has passed since the batch's first task or when the queued bytes reach the size
//! threshold (Flink's `BatchingStateChangeUploadScheduler`), or at once when a task of
//! half the threshold or more arrives: batching exists to put the small tasks of many
//! writers into one file, and a task that large is worth a file of its own, so holding
//! it for company only delays its checkpoint (Flink holds it). Time is an input, as in
//! quinn-proto: the caller passes `now` and asks [`Batcher::poll_timeout`] when to call
//! [`Batcher::handle_timeout`], so the rules are tested on simulated time.

use std::time::{Duration, Instant};

/// Queued items of type `T` and when they must leave.
#[derive(Debug)]
pub(crate) struct Batcher<T> {
    delay: Duration,
    size_threshold: u64,
    queue: Vec<T>,
    bytes: u64,
    deadline: Option<Instant>,
}

impl<T> Batcher<T> {
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
        }
    }

    /// Queues `item` of `size` bytes; returns the batch if it must leave now.
    pub fn push(&mut self, item: T, size: u64, now: Instant) -> Option<Vec<T>> {
        self.queue.push(item);
        self.bytes = self.bytes.saturating_add(size);
        if self.delay.is_zero()
            || self.bytes >= self.size_threshold
            || size.saturating_mul(2) >= self.size_threshold
        {
            return Some(self.take());
        }
        self.deadline.get_or_insert(now + self.delay);
        None
    }

    /// When the queued batch must leave, if anything is queued.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// The batch, if its delay has passed by `now`.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Vec<T>> {
        match self.deadline {
            Some(deadline) if now >= deadline => Some(self.take()),
            _ => None,
        }
    }

    /// Takes everything queued (the storage is closing).
    pub fn take(&mut self) -> Vec<T> {
        self.bytes = 0;
        self.deadline = None;
        std::mem::take(&mut self.queue)
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_batch_leaves_when_the_delay_since_its_first_item_has_passed() {
        let t0 = Instant::now();
        let mut b = Batcher::new(Duration::from_millis(10), 1000);
        assert_eq!(b.poll_timeout(), None);
        assert_eq!(b.push("a", 1, t0), None);
        assert_eq!(b.poll_timeout(), Some(at(t0, 10)));
        // A later item does not move the deadline.
        assert_eq!(b.push("b", 1, at(t0, 7)), None);
        assert_eq!(b.poll_timeout(), Some(at(t0, 10)));
        assert_eq!(b.handle_timeout(at(t0, 9)), None);
        assert_eq!(b.handle_timeout(at(t0, 10)), Some(vec!["a", "b"]));
        assert_eq!((b.poll_timeout(), b.len()), (None, 0));
        // The next batch starts its own delay.
        assert_eq!(b.push("c", 1, at(t0, 30)), None);
        assert_eq!(b.poll_timeout(), Some(at(t0, 40)));
    }

    #[test]
    fn a_batch_leaves_at_once_when_it_reaches_the_size_threshold() {
        let t0 = Instant::now();
        let mut b = Batcher::new(Duration::from_secs(3600), 10);
        assert_eq!(b.push(1, 4, t0), None);
        assert_eq!(b.push(2, 4, t0), None);
        assert_eq!(b.push(3, 2, t0), Some(vec![1, 2, 3]));
        assert_eq!(b.poll_timeout(), None);
        // One item above the threshold leaves alone.
        assert_eq!(b.push(4, 11, t0), Some(vec![4]));
    }

    #[test]
    fn an_item_of_half_the_threshold_does_not_wait_for_company() {
        let t0 = Instant::now();
        let mut b = Batcher::new(Duration::from_secs(3600), 10);
        assert_eq!(b.push(1, 1, t0), None);
        // Worth a file of its own: it leaves at once, with what waited.
        assert_eq!(b.push(2, 5, t0), Some(vec![1, 2]));
        assert_eq!(b.push(3, 4, t0), None);
    }

    #[test]
    fn zero_delay_or_threshold_sends_every_item_alone() {
        let t0 = Instant::now();
        let mut no_delay = Batcher::new(Duration::ZERO, 1 << 20);
        assert_eq!(no_delay.push('x', 1, t0), Some(vec!['x']));
        let mut no_threshold = Batcher::new(Duration::from_secs(1), 0);
        assert_eq!(no_threshold.push('y', 0, t0), Some(vec!['y']));
    }

    #[test]
    fn take_empties_the_queue() {
        let t0 = Instant::now();
        let mut b = Batcher::new(Duration::from_millis(5), 100);
        b.push(1, 1, t0);
        b.push(2, 1, t0);
        assert_eq!(b.take(), vec![1, 2]);
        assert_eq!((b.len(), b.poll_timeout()), (0, None));
        assert_eq!(b.handle_timeout(at(t0, 100)), None);
    }
}
