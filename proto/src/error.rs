//! What a writer call or a pending persist fails with, as data: every case carries the
//! values it is about, so a caller reads `requested` or `truncated` instead of parsing a
//! message. The types mirror the WIT `writer-error` variant case for case and field for
//! field (`crate::wit` converts them); `Display` gives the words every host prints,
//! Flink's own where Flink has them, so the words live here only: a host that cannot link
//! this crate asks the component for them (`errors.describe`).
//!
//! The writer's name is no part of these errors: a host names the writer around them
//! (`writer W: ...`). Nor are the uploader's words for a failed upload: an upload task
//! that failed is named by its id ([`UploadFailure::Failed`]), the host keeps why it
//! failed, and [`WriterError::describe`] puts those words where Flink's message has them.

use crate::types::{CheckpointId, KeyGroupRange, SequenceNumber};

/// Precondition violations and failed persists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriterError {
    /// The writer was closed (`close`, `truncate-and-close`) or dropped: any later call
    /// but `confirm` and `reset` fails with it, and so do the persists still pending when
    /// it closed.
    #[error("{0}")]
    Closed(Closed),
    /// `persist(from, ..)` with `from` below the point `truncate` dropped changes to:
    /// they are gone.
    #[error("{0}")]
    Truncated(Truncated),
    /// `persist(from, ..)` with `from` beyond the current sequence number: nothing was
    /// appended there yet.
    #[error("{0}")]
    NotYetAppended(NotYetAppended),
    /// `persist(from, ..)` (or an append reaching the pre-emptive threshold) when the
    /// upload of a change set at or above `from` failed earlier: that range can never
    /// become durable; the checkpoint must start from a later materialization.
    #[error("{0}")]
    AlreadyFailed(AlreadyFailed),
    /// `confirm` with `start > end`, or a bound beyond the active sequence number.
    #[error("{0}")]
    InvalidRange(InvalidRange),
    /// An argument out of its domain.
    #[error("{0}")]
    InvalidArgument(InvalidArgument),
    /// A persist whose range holds a change set whose upload failed for good (after the
    /// retry policy's attempts), or whose upload the uploader refused.
    #[error("{0}")]
    UploadFailed(UploadFailure),
}

impl WriterError {
    /// The case's name in the WIT `writer-error` variant (`closed`, `truncated`,
    /// `not-yet-appended`, `already-failed`, `invalid-range`, `invalid-argument`,
    /// `upload-failed`): what the shared scenarios and the Node host call the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            WriterError::Closed(_) => "closed",
            WriterError::Truncated(_) => "truncated",
            WriterError::NotYetAppended(_) => "not-yet-appended",
            WriterError::AlreadyFailed(_) => "already-failed",
            WriterError::InvalidRange(_) => "invalid-range",
            WriterError::InvalidArgument(_) => "invalid-argument",
            WriterError::UploadFailed(_) => "upload-failed",
        }
    }

    /// The upload task whose failure this error reports or cites as its cause, if any:
    /// the host's words for it belong in the message ([`WriterError::describe`]).
    pub fn failed_task(&self) -> Option<u64> {
        match self {
            WriterError::UploadFailed(UploadFailure::Failed(failed))
            | WriterError::AlreadyFailed(AlreadyFailed {
                cause: UploadFailure::Failed(failed),
                ..
            }) => Some(failed.task),
            _ => None,
        }
    }

    /// The error's words, with `upload` the host's words for the failed upload task it
    /// names ([`WriterError::failed_task`]): in place of the task's id, the attempts and
    /// the store's last error. Without them, or for any other error, its `Display`.
    pub fn describe(&self, upload: Option<&str>) -> String {
        match self {
            WriterError::UploadFailed(failure) => failure.describe(upload),
            WriterError::AlreadyFailed(AlreadyFailed { failed, cause }) => {
                already_failed(*failed, cause.describe(upload))
            }
            _ => self.to_string(),
        }
    }
}

/// Flink's words for a persist of a range whose upload failed earlier.
fn already_failed(failed: SequenceNumber, cause: impl std::fmt::Display) -> String {
    format!("The upload for {failed} has already failed previously (cause: {cause})")
}

/// A writer call, as an error names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `append`.
    Append,
    /// `append-batch`.
    AppendBatch,
    /// `append-meta`.
    AppendMeta,
    /// `persist`.
    Persist,
    /// `truncate`.
    Truncate,
    /// `truncate-and-close`.
    TruncateAndClose,
    /// `close`.
    Close,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::Append => "append",
            Operation::AppendBatch => "append-batch",
            Operation::AppendMeta => "append-meta",
            Operation::Persist => "persist",
            Operation::Truncate => "truncate",
            Operation::TruncateAndClose => "truncate-and-close",
            Operation::Close => "close",
        })
    }
}

/// How a call or a pending persist met a closed writer. Flink ignores appends after close
/// with a warning (FLINK-30729) and returns persists that never complete (F1, F2); a typed
/// error tells the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Closed {
    /// The call came after the writer closed.
    #[error("{0} after the writer was closed")]
    AfterClose(Operation),
    /// The writer closed while this persist waited for its uploads.
    #[error("the writer was closed while persisting {0}")]
    WhilePersisting(PendingPersist),
    /// The host dropped the writer (before the call, or before the persist completed).
    #[error("the writer was dropped")]
    Dropped,
}

/// A persist of `[start, end)` for `checkpoint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("[{start}, {end}) for checkpoint {checkpoint}")]
pub struct PendingPersist {
    /// First sequence number.
    pub start: SequenceNumber,
    /// One past the last.
    pub end: SequenceNumber,
    /// The checkpoint.
    pub checkpoint: CheckpointId,
}

/// `persist(requested, ..)` below the lowest sequence number still held, in Flink's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Requested changes were truncated (requested: {requested}, truncated: {truncated})")]
pub struct Truncated {
    /// The `from` of the persist.
    pub requested: SequenceNumber,
    /// The lowest sequence number the writer still holds.
    pub truncated: SequenceNumber,
}

/// `persist(requested, ..)` beyond the active sequence number, in Flink's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Requested changes were not yet appended (requested: {requested}, appended: {appended})")]
pub struct NotYetAppended {
    /// The `from` of the persist.
    pub requested: SequenceNumber,
    /// The writer's active sequence number.
    pub appended: SequenceNumber,
}

/// A persist whose range holds a change set whose upload failed earlier, in Flink's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", already_failed(*failed, cause))]
pub struct AlreadyFailed {
    /// The highest sequence number whose upload failed.
    pub failed: SequenceNumber,
    /// Why it failed.
    pub cause: UploadFailure,
}

/// A `confirm` of `[start, end)` that is reversed or reaches beyond the active sequence
/// number, in Flink's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Invalid confirm range: [{start},{end}){}", self.beyond())]
pub struct InvalidRange {
    /// The range's first sequence number.
    pub start: SequenceNumber,
    /// One past its last.
    pub end: SequenceNumber,
    /// The writer's active sequence number.
    pub active: SequenceNumber,
}

impl InvalidRange {
    /// Flink names the active sequence number only when the range is not reversed.
    fn beyond(&self) -> String {
        if self.start > self.end {
            String::new()
        } else {
            format!(", active sqn: {}", self.active)
        }
    }
}

/// An argument out of its domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidArgument {
    /// A data change with a negative key group.
    #[error("key group {0} is negative; metadata changes go through append-meta")]
    NegativeKeyGroup(i32),
    /// A packed batch's change with a key group below -1.
    #[error("key group {0} in packed batch is negative (only -1, metadata, is allowed)")]
    NegativeBatchKeyGroup(i32),
    /// A key group outside the writer's range.
    #[error("{0}")]
    OutsideRange(OutsideRange),
    /// A value longer than the format's `i32` lengths allow, in bytes.
    #[error("value of {0} bytes exceeds the format's limit of {max} bytes", max = i32::MAX)]
    ValueTooLong(u64),
    /// A packed batch whose columns differ in length.
    #[error("{0}")]
    BatchColumns(BatchColumns),
    /// A packed batch whose lengths do not add up to its data.
    #[error("{0}")]
    BatchLengths(BatchLengths),
    /// `truncate` beyond the active sequence number.
    #[error("{0}")]
    TruncateBeyond(TruncateBeyond),
    /// A writer created with an empty key-group range or one starting below 0.
    #[error("invalid key-group range [{}, {}]: need 0 <= start <= end", .0.start, .0.end)]
    KeyGroupRange(KeyGroupRange),
}

/// A key group outside the writer's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "key group {key_group} is outside the writer's key-group range [{}, {}]",
    range.start,
    range.end
)]
pub struct OutsideRange {
    /// The key group given.
    pub key_group: i32,
    /// The writer's range.
    pub range: KeyGroupRange,
}

/// A packed batch whose columns differ in length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("packed batch has {key_groups} key groups but {lengths} lengths")]
pub struct BatchColumns {
    /// Entries of `key-groups`.
    pub key_groups: u64,
    /// Entries of `lengths`.
    pub lengths: u64,
}

/// A packed batch whose lengths do not add up to its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("packed batch lengths add up to {total} bytes but data holds {data}")]
pub struct BatchLengths {
    /// The sum of `lengths`.
    pub total: u64,
    /// Bytes of `data`.
    pub data: u64,
}

/// `truncate` beyond the active sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Cannot truncate to {to}: it is beyond the active sequence number {active}")]
pub struct TruncateBeyond {
    /// The `to` given.
    pub to: SequenceNumber,
    /// The writer's active sequence number.
    pub active: SequenceNumber,
}

/// Why the uploader did not accept a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The storage is closing or closed.
    #[error("{}", crate::batch::Closed::Refused)]
    StorageClosed,
    /// The writer was closed while its task waited for in-flight capacity.
    #[error("the writer was closed while its upload waited for in-flight capacity")]
    WriterClosed,
    /// The thread that waited for in-flight capacity was interrupted.
    #[error(
        "the thread waiting for in-flight capacity was interrupted; the upload was not accepted"
    )]
    Interrupted,
}

/// Why the upload of a persist's change sets failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UploadFailure {
    /// The uploader did not accept the task holding these change sets: they are lost,
    /// exactly as if their upload had failed.
    #[error("{0}")]
    Refused(Refused),
    /// The uploader reported the task succeeded but returned no result for some of its
    /// change sets (a host that lies): they count as failed.
    #[error("{0}")]
    NoResult(NoResult),
    /// The uploader accepted the task and it failed for good. Why (the attempts and the
    /// store's last error, or how the storage's close ended it) is the uploader's to say:
    /// the host keeps it under the task's id ([`WriterError::describe`]).
    #[error("{0}")]
    Failed(FailedTask),
}

impl UploadFailure {
    /// Its words, with `upload` the host's words for a failed task in place of the
    /// task's id; for a refusal or a missing result, its `Display`.
    pub fn describe(&self, upload: Option<&str>) -> String {
        match (self, upload) {
            (UploadFailure::Failed(_), Some(words)) => words.into(),
            _ => self.to_string(),
        }
    }
}

/// An upload task the uploader accepted that failed for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("upload task {task} failed")]
pub struct FailedTask {
    /// The task's id (what the writer scheduled it under).
    pub task: u64,
}

/// Change sets whose task the uploader did not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the uploader refused change sets {change_sets:?}: {refusal}")]
pub struct Refused {
    /// The task's sequence numbers.
    pub change_sets: Vec<SequenceNumber>,
    /// Why.
    pub refusal: Refusal,
}

/// Change sets of a task the uploader returned no result for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the upload of task {task} returned no result for change sets {change_sets:?}")]
pub struct NoResult {
    /// The task.
    pub task: u64,
    /// Its change sets without a result.
    pub change_sets: Vec<SequenceNumber>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words of every case, in one table: the writer's tests check typed values, the
    /// shared scenarios check these words through both hosts.
    #[test]
    fn every_case_has_its_words() {
        use InvalidArgument as A;
        let arg = WriterError::InvalidArgument;
        let range = KeyGroupRange { start: 0, end: 9 };
        let refused = UploadFailure::Refused(Refused {
            change_sets: vec![0, 1],
            refusal: Refusal::StorageClosed,
        });
        let cases: Vec<(WriterError, &str)> = vec![
            (
                WriterError::Closed(Closed::AfterClose(Operation::TruncateAndClose)),
                "truncate-and-close after the writer was closed",
            ),
            (
                WriterError::Closed(Closed::WhilePersisting(PendingPersist {
                    start: 0,
                    end: 1,
                    checkpoint: 7,
                })),
                "the writer was closed while persisting [0, 1) for checkpoint 7",
            ),
            (
                WriterError::Closed(Closed::Dropped),
                "the writer was dropped",
            ),
            (
                WriterError::Truncated(Truncated {
                    requested: 0,
                    truncated: 1,
                }),
                "Requested changes were truncated (requested: 0, truncated: 1)",
            ),
            (
                WriterError::NotYetAppended(NotYetAppended {
                    requested: 5,
                    appended: 0,
                }),
                "Requested changes were not yet appended (requested: 5, appended: 0)",
            ),
            (
                WriterError::AlreadyFailed(AlreadyFailed {
                    failed: 3,
                    cause: refused.clone(),
                }),
                "The upload for 3 has already failed previously (cause: the uploader refused \
                 change sets [0, 1]: the changelog storage is closed)",
            ),
            (
                WriterError::InvalidRange(InvalidRange {
                    start: 1,
                    end: 0,
                    active: 1,
                }),
                "Invalid confirm range: [1,0)",
            ),
            (
                WriterError::InvalidRange(InvalidRange {
                    start: 0,
                    end: 3,
                    active: 1,
                }),
                "Invalid confirm range: [0,3), active sqn: 1",
            ),
            (
                arg(A::NegativeKeyGroup(-3)),
                "key group -3 is negative; metadata changes go through append-meta",
            ),
            (
                arg(A::NegativeBatchKeyGroup(-2)),
                "key group -2 in packed batch is negative (only -1, metadata, is allowed)",
            ),
            (
                arg(A::OutsideRange(OutsideRange {
                    key_group: 10,
                    range,
                })),
                "key group 10 is outside the writer's key-group range [0, 9]",
            ),
            (
                arg(A::ValueTooLong(1 << 31)),
                "value of 2147483648 bytes exceeds the format's limit of 2147483647 bytes",
            ),
            (
                arg(A::BatchColumns(BatchColumns {
                    key_groups: 2,
                    lengths: 1,
                })),
                "packed batch has 2 key groups but 1 lengths",
            ),
            (
                arg(A::BatchLengths(BatchLengths { total: 3, data: 2 })),
                "packed batch lengths add up to 3 bytes but data holds 2",
            ),
            (
                arg(A::TruncateBeyond(TruncateBeyond { to: 2, active: 1 })),
                "Cannot truncate to 2: it is beyond the active sequence number 1",
            ),
            (
                arg(A::KeyGroupRange(KeyGroupRange { start: 6, end: 5 })),
                "invalid key-group range [6, 5]: need 0 <= start <= end",
            ),
            (
                WriterError::UploadFailed(refused),
                "the uploader refused change sets [0, 1]: the changelog storage is closed",
            ),
            (
                WriterError::UploadFailed(UploadFailure::Refused(Refused {
                    change_sets: vec![4],
                    refusal: Refusal::WriterClosed,
                })),
                "the uploader refused change sets [4]: the writer was closed while its upload \
                 waited for in-flight capacity",
            ),
            (
                WriterError::UploadFailed(UploadFailure::Refused(Refused {
                    change_sets: vec![4],
                    refusal: Refusal::Interrupted,
                })),
                "the uploader refused change sets [4]: the thread waiting for in-flight \
                 capacity was interrupted; the upload was not accepted",
            ),
            (
                WriterError::UploadFailed(UploadFailure::NoResult(NoResult {
                    task: 2,
                    change_sets: vec![1],
                })),
                "the upload of task 2 returned no result for change sets [1]",
            ),
            (
                WriterError::UploadFailed(UploadFailure::Failed(FailedTask { task: 4 })),
                "upload task 4 failed",
            ),
        ];
        for (error, words) in cases {
            assert_eq!(error.to_string(), words, "{error:?}");
            assert_eq!(error.describe(None), words, "{error:?}");
        }
    }

    /// A failed upload task is described in the host's words, also where an error cites
    /// it as the cause; an error that names no failed task ignores them.
    #[test]
    fn a_failed_task_is_described_in_the_hosts_words() {
        let failed = UploadFailure::Failed(FailedTask { task: 4 });
        let cases = [
            (
                WriterError::UploadFailed(failed.clone()),
                Some(4),
                "disk full",
            ),
            (
                WriterError::AlreadyFailed(AlreadyFailed {
                    failed: 2,
                    cause: failed,
                }),
                Some(4),
                "The upload for 2 has already failed previously (cause: disk full)",
            ),
            (
                WriterError::Truncated(Truncated {
                    requested: 0,
                    truncated: 1,
                }),
                None,
                "Requested changes were truncated (requested: 0, truncated: 1)",
            ),
        ];
        for (error, task, words) in cases {
            assert_eq!(error.failed_task(), task, "{error:?}");
            assert_eq!(error.describe(Some("disk full")), words, "{error:?}");
        }
    }
}
