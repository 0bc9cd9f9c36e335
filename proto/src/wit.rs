//! Conversions between [`crate::types`] and the types a WIT binding generator makes from
//! the `types` interface (wit-bindgen in the component, wasmtime's bindgen in the host):
//! the generated types differ by crate but have the same names and fields, so one macro
//! writes the conversions for both sides.

/// Defines, in the calling module, `from_wit_*` and `to_wit_*` conversions between
/// `dstl_proto::types` and the generated types of the WIT `types` interface, which must
/// be in scope as the module `$wit`: stream handles, key-group ranges, writer
/// configurations, upload results, changelog handles, snapshot results, writer errors,
/// the uploader's refusals, persist replies and persist completions. Each is written once,
/// for both directions (the two sides have the same names and fields); a side uses the
/// directions it needs.
#[macro_export]
macro_rules! wit_conversions {
    ($wit:ident) => {
        #[allow(unused_imports)]
        use $crate::wit::domain as __dstl_domain;
        $crate::wit_conversions!(@direction $wit => __dstl_domain:
            from_wit_stream from_wit_range from_wit_config from_wit_result from_wit_handle
            from_wit_snapshot from_wit_error from_wit_refusal from_wit_reply
            from_wit_completions);
        $crate::wit_conversions!(@direction __dstl_domain => $wit:
            to_wit_stream to_wit_range to_wit_config to_wit_result to_wit_handle
            to_wit_snapshot to_wit_error to_wit_refusal to_wit_reply to_wit_completions);
    };
    (@direction $f:ident => $t:ident:
        $stream:ident $range:ident $config:ident $result:ident $handle:ident
        $snapshot:ident $error:ident $refusal:ident $reply:ident $completions:ident) => {
        #[allow(dead_code)]
        pub(crate) fn $stream(h: $f::StreamHandle) -> $t::StreamHandle {
            $t::StreamHandle {
                path: h.path,
                file_size: h.file_size,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn $range(r: $f::KeyGroupRange) -> $t::KeyGroupRange {
            $t::KeyGroupRange {
                start: r.start,
                end: r.end,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn $config(c: $f::WriterConfig) -> $t::WriterConfig {
            $t::WriterConfig {
                name: c.name,
                key_group_range: $range(c.key_group_range),
                preemptive_persist_threshold: c.preemptive_persist_threshold,
                local_recovery: c.local_recovery,
                value_pieces: c.value_pieces,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn $result(r: $f::UploadResult) -> $t::UploadResult {
            $t::UploadResult {
                sequence_number: r.sequence_number,
                remote: $stream(r.remote),
                offset: r.offset,
                local: r.local.map(|l| $t::LocalCopy {
                    handle: $stream(l.handle),
                    offset: l.offset,
                }),
                size: r.size,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn $handle(h: $f::ChangelogHandle) -> $t::ChangelogHandle {
            $t::ChangelogHandle {
                entries: h
                    .entries
                    .into_iter()
                    .map(|e| $t::HandleEntry {
                        handle: $stream(e.handle),
                        offset: e.offset,
                        size: e.size,
                    })
                    .collect(),
                key_group_range: $range(h.key_group_range),
                state_size: h.state_size,
                incremental_size: h.incremental_size,
                storage_id: h.storage_id,
            }
        }

        #[allow(dead_code)]
        pub(crate) fn $snapshot(s: $f::SnapshotResult) -> $t::SnapshotResult {
            $t::SnapshotResult {
                remote: $handle(s.remote),
                local: s.local.map($handle),
            }
        }

        #[allow(dead_code)]
        pub(crate) fn $error(e: $f::WriterError) -> $t::WriterError {
            $crate::map_writer_error!(e, $f => $t)
        }

        #[allow(dead_code)]
        pub(crate) fn $refusal(r: $f::Refusal) -> $t::Refusal {
            $crate::map_refusal!(r, $f => $t)
        }

        #[allow(dead_code)]
        pub(crate) fn $reply(r: $f::PersistReply) -> $t::PersistReply {
            match r {
                $f::PersistReply::Ready(s) => $t::PersistReply::Ready($snapshot(s)),
                $f::PersistReply::Pending(ticket) => $t::PersistReply::Pending(ticket),
            }
        }

        #[allow(dead_code)]
        pub(crate) fn $completions(list: Vec<$f::PersistCompletion>) -> Vec<$t::PersistCompletion> {
            list.into_iter()
                .map(|c| $t::PersistCompletion {
                    ticket: c.ticket,
                    outcome: c.outcome.map($snapshot).map_err($error),
                })
                .collect()
        }
    };
}

/// The domain's types gathered in one module as the generated bindings have them, so a
/// conversion names both sides alike.
#[doc(hidden)]
pub mod domain {
    pub use crate::error::*;
    pub use crate::types::*;
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
                $f::InvalidArgument::NegativeKeyGroup(k) => {
                    $t::InvalidArgument::NegativeKeyGroup(k)
                }
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
            $f::UploadFailure::Failed($f::FailedTask { task }) => {
                $t::UploadFailure::Failed($t::FailedTask { task })
            }
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
