//! When a host hands buffered appends to the writer: the rule every host's append buffer
//! follows, so none of them repeats the writer's threshold arithmetic.
//!
//! A call into a writer's sandbox costs a fraction of a microsecond, a packed batch of a
//! thousand small changes about twenty (ARCHITECTURE.md, "Costs that shaped the design"),
//! so hosts gather single appends into packed batches. For the guest to see exactly what
//! it would see without buffering, a batch is handed over
//!
//! - before any other call of the writer (the host's part: it flushes first);
//! - when it reaches [`MAX_BYTES`] or [`MAX_CHANGES`];
//! - exactly when an append brings the writer's open change set to the pre-emptive
//!   threshold, which makes the writer upload it at that append, as it would unbuffered.
//!
//! For the last rule the hand-off keeps a mirror of the open change set's bytes: the
//! writer reports them after each batch; a rollover empties them.
//!
//! The kinds of methods: inputs ([`HandOff::append`], [`HandOff::handed_over`],
//! [`HandOff::rolled_over`]), whose return values are the outputs, and queries
//! ([`HandOff::open_bytes`]).

use crate::types::WriterError;

/// Bytes a buffered batch holds at most before it is handed over.
pub const MAX_BYTES: usize = 256 << 10;
/// Changes a buffered batch holds at most before it is handed over.
pub const MAX_CHANGES: usize = 4096;

/// What to do with an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Append {
    /// Buffer it; nothing to hand over yet.
    Buffer,
    /// Buffer it, then hand the batch over now.
    BufferAndHandOver,
    /// Hand over what is buffered, then this value alone: it is as large as a batch, and
    /// buffering it would only copy it once more.
    Alone,
}

/// The hand-off state of one writer's append buffer.
#[derive(Debug, Clone)]
pub struct HandOff {
    threshold: u64,
    /// The writer's open change-set bytes, buffered appends included.
    open: u64,
    bytes: usize,
    changes: usize,
}

impl HandOff {
    /// The state of a new writer whose pre-emptive threshold is `threshold` bytes.
    pub fn new(threshold: u64) -> Self {
        Self {
            threshold,
            open: 0,
            bytes: 0,
            changes: 0,
        }
    }

    /// Input: a value of `len` bytes is appended (after the host checked it).
    pub fn append(&mut self, len: usize) -> Append {
        if len >= MAX_BYTES {
            return Append::Alone;
        }
        self.bytes += len;
        self.changes += 1;
        self.open = self.open.saturating_add(len as u64);
        if self.open >= self.threshold || self.bytes >= MAX_BYTES || self.changes >= MAX_CHANGES {
            Append::BufferAndHandOver
        } else {
            Append::Buffer
        }
    }

    /// Input: a batch (what was buffered, or a value appended alone) was handed over and
    /// the writer answered `result`: its open bytes, or an error. A malformed batch
    /// appended nothing; any other error (a pre-emptive upload refused) leaves the set open
    /// and over the threshold, so the next append hands over again, as the writer would
    /// try again.
    pub fn handed_over(&mut self, result: Result<u64, &WriterError>) {
        self.bytes = 0;
        self.changes = 0;
        match result {
            Ok(open) => self.open = open,
            Err(WriterError::InvalidArgument(_)) => {}
            Err(_) => self.open = u64::MAX,
        }
    }

    /// Input: the writer closed its open change set (a new sequence number, or a persist
    /// that rolled over).
    pub fn rolled_over(&mut self) {
        self.open = 0;
    }

    /// Query: the open change set's bytes as last known, buffered appends included.
    pub fn open_bytes(&self) -> u64 {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_handed_over_exactly_at_the_threshold() {
        let mut h = HandOff::new(100);
        assert_eq!(h.append(60), Append::Buffer);
        assert_eq!(h.append(39), Append::Buffer);
        assert_eq!(
            h.append(1),
            Append::BufferAndHandOver,
            "at 100 bytes, inclusive"
        );
        // The writer uploaded pre-emptively: nothing open.
        h.handed_over(Ok(0));
        assert_eq!(h.append(10), Append::Buffer);
    }

    #[test]
    fn full_batches_are_handed_over_and_large_values_go_alone() {
        let mut h = HandOff::new(u64::MAX);
        for _ in 0..MAX_CHANGES - 1 {
            assert_eq!(h.append(1), Append::Buffer);
        }
        assert_eq!(h.append(1), Append::BufferAndHandOver);
        h.handed_over(Ok(MAX_CHANGES as u64));
        assert_eq!(h.append(MAX_BYTES - 1), Append::Buffer);
        assert_eq!(h.append(1), Append::BufferAndHandOver);
        h.handed_over(Ok(0));
        assert_eq!(h.append(MAX_BYTES), Append::Alone);
    }

    #[test]
    fn a_refused_upload_leaves_the_set_over_the_threshold_and_a_rollover_empties_it() {
        let mut h = HandOff::new(100);
        h.append(100);
        h.handed_over(Err(&WriterError::AlreadyFailed("x".into())));
        assert_eq!(
            h.append(1),
            Append::BufferAndHandOver,
            "the next append tries again"
        );
        h.handed_over(Err(&WriterError::InvalidArgument("bad batch".into())));
        assert_eq!(
            h.open_bytes(),
            u64::MAX,
            "a malformed batch changes nothing"
        );
        h.rolled_over();
        assert_eq!(h.append(1), Append::Buffer);
    }
}
