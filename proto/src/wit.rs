//! Conversions between [`crate::types`] and the types a WIT binding generator makes from
//! the `types` interface (wit-bindgen in the component, wasmtime's bindgen in the host):
//! the generated types differ by crate but have the same names and fields, so one macro
//! writes the conversions for both sides.

/// Defines, in the calling module, `from_wit_*` and `to_wit_*` conversions between
/// `dstl_proto::types` and the generated types of the WIT `types` interface, which must
/// be in scope as the module `$wit`: stream handles, key-group ranges, writer
/// configurations, upload results, changelog handles, snapshot results, writer errors,
/// the uploader's refusals,
/// persist replies and persist completions. A side uses the directions it needs.
#[macro_export]
macro_rules! wit_conversions {
    ($wit:ident) => {
        #[allow(dead_code)]
        pub(crate) fn from_wit_stream(h: $wit::StreamHandle) -> $crate::types::StreamHandle {
            $crate::types::StreamHandle {
                path: h.path,
                file_size: h.file_size,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_stream(h: $crate::types::StreamHandle) -> $wit::StreamHandle {
            $wit::StreamHandle {
                path: h.path,
                file_size: h.file_size,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn from_wit_range(r: $wit::KeyGroupRange) -> $crate::types::KeyGroupRange {
            $crate::types::KeyGroupRange {
                start: r.start,
                end: r.end,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_range(r: $crate::types::KeyGroupRange) -> $wit::KeyGroupRange {
            $wit::KeyGroupRange {
                start: r.start,
                end: r.end,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn from_wit_config(c: $wit::WriterConfig) -> $crate::types::WriterConfig {
            $crate::types::WriterConfig {
                name: c.name,
                key_group_range: from_wit_range(c.key_group_range),
                preemptive_persist_threshold: c.preemptive_persist_threshold,
                local_recovery: c.local_recovery,
                value_pieces: c.value_pieces,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_config(c: $crate::types::WriterConfig) -> $wit::WriterConfig {
            $wit::WriterConfig {
                name: c.name,
                key_group_range: to_wit_range(c.key_group_range),
                preemptive_persist_threshold: c.preemptive_persist_threshold,
                local_recovery: c.local_recovery,
                value_pieces: c.value_pieces,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn from_wit_result(r: $wit::UploadResult) -> $crate::types::UploadResult {
            $crate::types::UploadResult {
                sequence_number: r.sequence_number,
                remote: from_wit_stream(r.remote),
                offset: r.offset,
                local: r.local.map(|l| $crate::types::LocalCopy {
                    handle: from_wit_stream(l.handle),
                    offset: l.offset,
                }),
                size: r.size,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_result(r: $crate::types::UploadResult) -> $wit::UploadResult {
            $wit::UploadResult {
                sequence_number: r.sequence_number,
                remote: to_wit_stream(r.remote),
                offset: r.offset,
                local: r.local.map(|l| $wit::LocalCopy {
                    handle: to_wit_stream(l.handle),
                    offset: l.offset,
                }),
                size: r.size,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn from_wit_handle(h: $wit::ChangelogHandle) -> $crate::types::ChangelogHandle {
            $crate::types::ChangelogHandle {
                entries: h
                    .entries
                    .into_iter()
                    .map(|e| $crate::types::HandleEntry {
                        handle: from_wit_stream(e.handle),
                        offset: e.offset,
                        size: e.size,
                    })
                    .collect(),
                key_group_range: from_wit_range(h.key_group_range),
                state_size: h.state_size,
                incremental_size: h.incremental_size,
                storage_id: h.storage_id,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_handle(h: $crate::types::ChangelogHandle) -> $wit::ChangelogHandle {
            $wit::ChangelogHandle {
                entries: h
                    .entries
                    .into_iter()
                    .map(|e| $wit::HandleEntry {
                        handle: to_wit_stream(e.handle),
                        offset: e.offset,
                        size: e.size,
                    })
                    .collect(),
                key_group_range: to_wit_range(h.key_group_range),
                state_size: h.state_size,
                incremental_size: h.incremental_size,
                storage_id: h.storage_id,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn from_wit_snapshot(s: $wit::SnapshotResult) -> $crate::types::SnapshotResult {
            $crate::types::SnapshotResult {
                remote: from_wit_handle(s.remote),
                local: s.local.map(from_wit_handle),
            }
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_snapshot(s: $crate::types::SnapshotResult) -> $wit::SnapshotResult {
            $wit::SnapshotResult {
                remote: to_wit_handle(s.remote),
                local: s.local.map(to_wit_handle),
            }
        }

        #[allow(dead_code)]
        pub(crate) fn from_wit_error(e: $wit::WriterError) -> $crate::types::WriterError {
            use $crate::wit::domain as D;
            use $wit as W;
            $crate::map_writer_error!(e, W => D)
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_error(e: $crate::types::WriterError) -> $wit::WriterError {
            use $crate::wit::domain as D;
            use $wit as W;
            $crate::map_writer_error!(e, D => W)
        }

        #[allow(dead_code)]
        pub(crate) fn from_wit_refusal(r: $wit::Refusal) -> $crate::error::Refusal {
            use $crate::wit::domain as D;
            use $wit as W;
            $crate::map_refusal!(r, W => D)
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_refusal(r: $crate::error::Refusal) -> $wit::Refusal {
            use $crate::wit::domain as D;
            use $wit as W;
            $crate::map_refusal!(r, D => W)
        }

        #[allow(dead_code)]
        pub(crate) fn from_wit_reply(r: $wit::PersistReply) -> $crate::types::PersistReply {
            match r {
                $wit::PersistReply::Ready(s) => {
                    $crate::types::PersistReply::Ready(from_wit_snapshot(s))
                }
                $wit::PersistReply::Pending(t) => $crate::types::PersistReply::Pending(t),
            }
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_reply(r: $crate::types::PersistReply) -> $wit::PersistReply {
            match r {
                $crate::types::PersistReply::Ready(s) => {
                    $wit::PersistReply::Ready(to_wit_snapshot(s))
                }
                $crate::types::PersistReply::Pending(t) => $wit::PersistReply::Pending(t),
            }
        }

        #[allow(dead_code)]
        pub(crate) fn from_wit_completions(
            list: Vec<$wit::PersistCompletion>,
        ) -> Vec<$crate::types::PersistCompletion> {
            list.into_iter()
                .map(|c| $crate::types::PersistCompletion {
                    ticket: c.ticket,
                    outcome: c.outcome.map(from_wit_snapshot).map_err(from_wit_error),
                })
                .collect()
        }

        #[allow(dead_code)]
        pub(crate) fn to_wit_completions(
            list: Vec<$crate::types::PersistCompletion>,
        ) -> Vec<$wit::PersistCompletion> {
            list.into_iter()
                .map(|c| $wit::PersistCompletion {
                    ticket: c.ticket,
                    outcome: c.outcome.map(to_wit_snapshot).map_err(to_wit_error),
                })
                .collect()
        }
    };
}

/// The domain's names for the types of the WIT `writer-error`, gathered in one module as
/// the generated bindings have them, so `map_writer_error!` names both sides alike.
#[doc(hidden)]
pub mod domain {
    pub use crate::error::*;
    pub use crate::types::KeyGroupRange;
}

/// Maps writer error `$e` from module `$f`'s types to module `$t`'s, which have the same
/// names, cases and fields (`dstl_proto::wit::domain` and the generated bindings): the
/// shapes are listed here once, for both directions of [`wit_conversions!`].
#[doc(hidden)]
#[macro_export]
macro_rules! map_writer_error {
    ($e:expr, $f:ident => $t:ident) => {
        match $e {
            $f::WriterError::Closed(c) => $t::WriterError::Closed(match c {
                $f::Closed::AfterClose(op) => $t::Closed::AfterClose(match op {
                    $f::Operation::Append => $t::Operation::Append,
                    $f::Operation::AppendBatch => $t::Operation::AppendBatch,
                    $f::Operation::AppendMeta => $t::Operation::AppendMeta,
                    $f::Operation::Persist => $t::Operation::Persist,
                    $f::Operation::Truncate => $t::Operation::Truncate,
                    $f::Operation::TruncateAndClose => $t::Operation::TruncateAndClose,
                    $f::Operation::Close => $t::Operation::Close,
                }),
                $f::Closed::WhilePersisting($f::PendingPersist {
                    start,
                    end,
                    checkpoint,
                }) => $t::Closed::WhilePersisting($t::PendingPersist {
                    start,
                    end,
                    checkpoint,
                }),
                $f::Closed::Dropped => $t::Closed::Dropped,
            }),
            $f::WriterError::Truncated($f::Truncated {
                requested,
                truncated,
            }) => $t::WriterError::Truncated($t::Truncated {
                requested,
                truncated,
            }),
            $f::WriterError::NotYetAppended($f::NotYetAppended {
                requested,
                appended,
            }) => $t::WriterError::NotYetAppended($t::NotYetAppended {
                requested,
                appended,
            }),
            $f::WriterError::AlreadyFailed($f::AlreadyFailed { failed, cause }) => {
                $t::WriterError::AlreadyFailed($t::AlreadyFailed {
                    failed,
                    cause: $crate::map_upload_failure!(cause, $f => $t),
                })
            }
            $f::WriterError::InvalidRange($f::InvalidRange { start, end, active }) => {
                $t::WriterError::InvalidRange($t::InvalidRange { start, end, active })
            }
            $f::WriterError::InvalidArgument(a) => $t::WriterError::InvalidArgument(match a {
                $f::InvalidArgument::NegativeKeyGroup(k) => $t::InvalidArgument::NegativeKeyGroup(k),
                $f::InvalidArgument::NegativeBatchKeyGroup(k) => {
                    $t::InvalidArgument::NegativeBatchKeyGroup(k)
                }
                $f::InvalidArgument::OutsideRange($f::OutsideRange { key_group, range }) => {
                    $t::InvalidArgument::OutsideRange($t::OutsideRange {
                        key_group,
                        range: $t::KeyGroupRange {
                            start: range.start,
                            end: range.end,
                        },
                    })
                }
                $f::InvalidArgument::ValueTooLong(n) => $t::InvalidArgument::ValueTooLong(n),
                $f::InvalidArgument::BatchColumns($f::BatchColumns { key_groups, lengths }) => {
                    $t::InvalidArgument::BatchColumns($t::BatchColumns {
                        key_groups,
                        lengths,
                    })
                }
                $f::InvalidArgument::BatchLengths($f::BatchLengths { total, data }) => {
                    $t::InvalidArgument::BatchLengths($t::BatchLengths { total, data })
                }
                $f::InvalidArgument::TruncateBeyond($f::TruncateBeyond { to, active }) => {
                    $t::InvalidArgument::TruncateBeyond($t::TruncateBeyond { to, active })
                }
                $f::InvalidArgument::KeyGroupRange(r) => {
                    $t::InvalidArgument::KeyGroupRange($t::KeyGroupRange {
                        start: r.start,
                        end: r.end,
                    })
                }
            }),
            $f::WriterError::UploadFailed(cause) => {
                $t::WriterError::UploadFailed($crate::map_upload_failure!(cause, $f => $t))
            }
        }
    };
}

/// Maps an upload failure between modules, as [`map_writer_error!`] does writer errors.
#[doc(hidden)]
#[macro_export]
macro_rules! map_upload_failure {
    ($e:expr, $f:ident => $t:ident) => {
        match $e {
            $f::UploadFailure::Refused($f::Refused {
                change_sets,
                refusal,
            }) => $t::UploadFailure::Refused($t::Refused {
                change_sets,
                refusal: $crate::map_refusal!(refusal, $f => $t),
            }),
            $f::UploadFailure::NoResult($f::NoResult { task, change_sets }) => {
                $t::UploadFailure::NoResult($t::NoResult { task, change_sets })
            }
            $f::UploadFailure::Failed(text) => $t::UploadFailure::Failed(text),
        }
    };
}

/// Maps an uploader's refusal between modules, as [`map_writer_error!`] does writer errors.
#[doc(hidden)]
#[macro_export]
macro_rules! map_refusal {
    ($e:expr, $f:ident => $t:ident) => {
        match $e {
            $f::Refusal::StorageClosed => $t::Refusal::StorageClosed,
            $f::Refusal::WriterClosed => $t::Refusal::WriterClosed,
            $f::Refusal::Interrupted => $t::Refusal::Interrupted,
        }
    };
}
