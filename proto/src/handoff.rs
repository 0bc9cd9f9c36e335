//! When a host hands buffered appends to the writer: the rule every host's append buffer
//! follows, so none of them repeats the writer's threshold arithmetic.
//!
//! A call into a writer's sandbox costs a fraction of a microsecond, a packed batch of a
//! thousand small changes about twenty (ARCHITECTURE.md, "Costs that shaped the design"),
//! so hosts gather single appends into packed batches. For the guest to see exactly what
//! it would see without buffering, a batch is handed over
//!
//! - before any other call of the writer (the host's part: it flushes first), or with a
//!   persist, which takes the batch along in the same call;
//! - when it reaches [`MAX_BYTES`] or [`MAX_CHANGES`];
//! - exactly when an append brings the writer's open change set to the pre-emptive
//!   threshold, which makes the writer upload it at that append, as it would unbuffered.
//!
//! For the last rule the hand-off keeps a mirror of the open change set's bytes: the
//! writer reports them after each batch; a rollover empties them.
//!
//! The kinds of methods: inputs ([`HandOff::append`], [`HandOff::handed_over`],
//! [`HandOff::rolled_over`], [`HandOff::persisted`]), whose return values are the
//! outputs, and queries ([`HandOff::open_bytes`], [`HandOff::budget`]). A host for which
//! a call per append is dear (one across WIT or JNI) reads the [`Budget`] after each
//! hand-off and counts down.

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

/// How much may be buffered before the next hand-off: the same decisions as
/// [`HandOff::append`], as numbers a host counts down. Valid until the next input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Buffered appends are handed over by the append that brings their bytes to this.
    pub bytes: u64,
    /// ... or their count to this.
    pub changes: u32,
    /// A value of this many bytes or more goes alone, after what is buffered.
    pub alone_at: u32,
}

impl Budget {
    /// The largest budget any writer gives: what a host's batch buffers must hold (values
    /// of `alone_at` bytes and more are never buffered).
    pub const MOST: Budget = Budget {
        bytes: MAX_BYTES as u64,
        changes: MAX_CHANGES as u32,
        alone_at: MAX_BYTES as u32,
    };
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
    ///
    /// An answer of open bytes replaces whatever earlier answers said, so a host that
    /// counts down a [`Budget`] may hold such answers back and pass only the latest one,
    /// before the next other input or budget it needs.
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
    /// that rolled over). What was buffered went to the writer first, so nothing is open
    /// or buffered now, whatever was answered before: a host that holds an answer of open
    /// bytes back (see [`HandOff::handed_over`]) may drop it instead of passing it first.
    pub fn rolled_over(&mut self) {
        self.open = 0;
        self.bytes = 0;
        self.changes = 0;
    }

    /// Input: the writer answered a persist, which took what was buffered along (its
    /// first step appends the batch): it rolled the open change set over unless the
    /// append or a precondition failed (`error`, other than a failed upload, which it
    /// reports after rolling over). After such a failure the host cannot tell whether a
    /// batch it sent along was appended, so it is answered as a failed hand-over: the
    /// next append hands over at once, and its answer tells the open bytes.
    pub fn persisted(&mut self, error: Option<&WriterError>) {
        match error {
            None | Some(WriterError::UploadFailed(_)) => self.rolled_over(),
            Some(e) => self.handed_over(Err(e)),
        }
    }

    /// Query: the open change set's bytes as last known, buffered appends included.
    pub fn open_bytes(&self) -> u64 {
        self.open
    }

    /// Query: the bytes the next batch handed over may bring before the writer's open
    /// change set reaches the threshold (what is buffered not counted, since it is that
    /// batch or goes first; 0 when the next append must hand over at once). A host that
    /// hands over batches the writer checks as a whole cuts them where this runs out, so
    /// the writer uploads at the same append as it would take them one by one.
    pub fn room(&self) -> u64 {
        let handed = self.open.saturating_sub(self.bytes as u64);
        self.threshold.saturating_sub(handed)
    }

    /// Query: what may be buffered from now on (see [`Budget`]).
    pub fn budget(&self) -> Budget {
        Budget {
            bytes: self
                .threshold
                .saturating_sub(self.open)
                .min(MAX_BYTES.saturating_sub(self.bytes) as u64),
            changes: MAX_CHANGES.saturating_sub(self.changes) as u32,
            alone_at: Budget::MOST.alone_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{AlreadyFailed, FailedTask, InvalidArgument, InvalidRange, UploadFailure};

    fn already_failed() -> WriterError {
        WriterError::AlreadyFailed(AlreadyFailed {
            failed: 0,
            cause: UploadFailure::Failed(FailedTask { task: 0 }),
        })
    }

    fn malformed() -> WriterError {
        WriterError::InvalidArgument(InvalidArgument::ValueTooLong(u64::MAX))
    }

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
    fn room_counts_what_was_handed_over_not_what_is_buffered() {
        let mut h = HandOff::new(100);
        assert_eq!(h.room(), 100);
        h.append(30);
        h.append(20);
        assert_eq!(
            h.room(),
            100,
            "the buffer is the next batch: all of it is room"
        );
        h.handed_over(Ok(50));
        assert_eq!(h.room(), 50);
        h.append(60);
        assert_eq!(
            h.room(),
            50,
            "the buffered 60 bytes reach the threshold at 50"
        );
        h.handed_over(Err(&already_failed()));
        assert_eq!(
            h.room(),
            0,
            "after a refused upload, the next append hands over"
        );
        h.rolled_over();
        assert_eq!(h.room(), 100);
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
        h.handed_over(Err(&already_failed()));
        assert_eq!(
            h.append(1),
            Append::BufferAndHandOver,
            "the next append tries again"
        );
        h.handed_over(Err(&malformed()));
        assert_eq!(
            h.open_bytes(),
            u64::MAX,
            "a malformed batch changes nothing"
        );
        h.rolled_over();
        assert_eq!(h.append(1), Append::Buffer);
    }

    #[test]
    fn the_latest_answer_of_open_bytes_replaces_earlier_ones() {
        let mut every = HandOff::new(100);
        let mut latest = HandOff::new(100);
        for open in [10, 120, 0, 40] {
            every.handed_over(Ok(open));
        }
        every.handed_over(Err(&already_failed()));
        every.handed_over(Ok(70));
        latest.handed_over(Ok(70));
        assert_eq!(every.budget(), latest.budget());
        assert_eq!(latest.budget().bytes, 30);
        // A rollover supersedes an answer not yet given.
        let mut dropped = HandOff::new(100);
        every.handed_over(Ok(90));
        every.rolled_over();
        dropped.rolled_over();
        assert_eq!(every.budget(), dropped.budget());
        every.handed_over(Ok(90));
        every.persisted(None);
        dropped.persisted(None);
        assert_eq!(every.budget(), dropped.budget());
    }

    #[test]
    fn a_persist_rolls_over_unless_its_append_or_a_precondition_failed() {
        let mut h = HandOff::new(100);
        h.append(50);
        h.persisted(Some(&WriterError::InvalidRange(InvalidRange {
            start: 7,
            end: 3,
            active: 3,
        })));
        // The batch sent along may or may not have been appended: the next append
        // hands over at once to learn the open bytes.
        assert_eq!((h.open_bytes(), h.budget().bytes), (u64::MAX, 0));
        h.persisted(Some(&WriterError::UploadFailed(UploadFailure::Failed(
            FailedTask { task: 1 },
        ))));
        assert_eq!(h.open_bytes(), 0);
        h.append(50);
        h.persisted(None);
        assert_eq!(h.open_bytes(), 0);
    }

    proptest::proptest! {
        /// Counting a budget down decides as `append` does, for any appends, answers
        /// and rollovers.
        #[test]
        fn a_budget_counted_down_decides_as_append(
            threshold in 0u64..2_000_000,
            ops in proptest::collection::vec((0usize..400_000, 0u8..12), 1..3000),
        ) {
            let mut rule = HandOff::new(threshold);
            let mut counted = HandOff::new(threshold);
            let (mut budget, mut bytes, mut changes) = (counted.budget(), 0u64, 0u32);
            for (len, what) in ops {
                if what == 1 {
                    // A malformed batch of the caller's own: what is buffered goes first,
                    // then the batch appends nothing.
                    if changes > 0 {
                        let open = Ok(rule.open_bytes());
                        rule.handed_over(open);
                        counted.handed_over(open);
                    }
                    let malformed = malformed();
                    rule.handed_over(Err(&malformed));
                    counted.handed_over(Err(&malformed));
                    (budget, bytes, changes) = (counted.budget(), 0, 0);
                    continue;
                }
                let len = if what < 9 { len % 5000 } else { len };
                let expected = rule.append(len);
                let decided = if len >= budget.alone_at as usize {
                    Append::Alone
                } else {
                    bytes += len as u64;
                    changes += 1;
                    if bytes >= budget.bytes || changes >= budget.changes {
                        Append::BufferAndHandOver
                    } else {
                        Append::Buffer
                    }
                };
                proptest::prop_assert_eq!(decided, expected);
                if decided == Append::Buffer {
                    continue;
                }
                // The writer answers: an open count (empty after a pre-emptive upload), a
                // refused upload, or it rolls over next.
                let open = rule.open_bytes();
                let refused = already_failed();
                let answer = match what {
                    0 => Err(&refused),
                    _ if open >= threshold => Ok(0),
                    _ => Ok(open),
                };
                rule.handed_over(answer);
                counted.handed_over(answer);
                if what == 2 {
                    rule.rolled_over();
                    counted.rolled_over();
                }
                (budget, bytes, changes) = (counted.budget(), 0, 0);
            }
        }
    }
}
