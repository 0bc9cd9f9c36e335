//! The generated WIT bindings (world `dstl:changelog/changelog`) and conversions between
//! the generated types and the plain types of `dstl_proto::types`.

use dstl_proto::types as domain;

wasmtime::component::bindgen!({
    world: "changelog",
    path: "wit",
    // An import may trap its caller: the host refuses calls naming files the writer does
    // not hold (a guest fault).
    imports: { default: trappable },
});

/// The generated WIT types.
pub(crate) use self::dstl::changelog::types as wit;

pub(crate) fn from_wit_stream(h: wit::StreamHandle) -> domain::StreamHandle {
    domain::StreamHandle {
        path: h.path,
        file_size: h.file_size,
    }
}

fn to_wit_stream(h: domain::StreamHandle) -> wit::StreamHandle {
    wit::StreamHandle {
        path: h.path,
        file_size: h.file_size,
    }
}

pub(crate) fn to_wit_results(results: Vec<domain::UploadResult>) -> Vec<wit::UploadResult> {
    results
        .into_iter()
        .map(|r| wit::UploadResult {
            sequence_number: r.sequence_number,
            remote: to_wit_stream(r.remote),
            offset: r.offset,
            local: r.local.map(|l| wit::LocalCopy {
                handle: to_wit_stream(l.handle),
                offset: l.offset,
            }),
            size: r.size,
        })
        .collect()
}

fn from_wit_handle(h: wit::ChangelogHandle) -> domain::ChangelogHandle {
    domain::ChangelogHandle {
        entries: h
            .entries
            .into_iter()
            .map(|e| domain::HandleEntry {
                handle: from_wit_stream(e.handle),
                offset: e.offset,
                size: e.size,
            })
            .collect(),
        key_group_range: domain::KeyGroupRange {
            start: h.key_group_range.start,
            end: h.key_group_range.end,
        },
        state_size: h.state_size,
        incremental_size: h.incremental_size,
        storage_id: h.storage_id,
    }
}

pub(crate) fn from_wit_snapshot(s: wit::SnapshotResult) -> domain::SnapshotResult {
    domain::SnapshotResult {
        remote: from_wit_handle(s.remote),
        local: s.local.map(from_wit_handle),
    }
}

pub(crate) fn from_wit_error(e: wit::WriterError) -> domain::WriterError {
    match e {
        wit::WriterError::Closed(m) => domain::WriterError::Closed(m),
        wit::WriterError::Truncated(m) => domain::WriterError::Truncated(m),
        wit::WriterError::NotYetAppended(m) => domain::WriterError::NotYetAppended(m),
        wit::WriterError::AlreadyFailed(m) => domain::WriterError::AlreadyFailed(m),
        wit::WriterError::InvalidRange(m) => domain::WriterError::InvalidRange(m),
        wit::WriterError::InvalidArgument(m) => domain::WriterError::InvalidArgument(m),
        wit::WriterError::UploadFailed(m) => domain::WriterError::UploadFailed(m),
    }
}

pub(crate) fn to_wit_config(c: &domain::WriterConfig) -> wit::WriterConfig {
    wit::WriterConfig {
        name: c.name.clone(),
        key_group_range: wit::KeyGroupRange {
            start: c.key_group_range.start,
            end: c.key_group_range.end,
        },
        preemptive_persist_threshold: c.preemptive_persist_threshold,
        local_recovery: c.local_recovery,
    }
}

pub(crate) fn from_wit_completions(
    list: Vec<wit::PersistCompletion>,
) -> Vec<domain::PersistCompletion> {
    list.into_iter()
        .map(|c| domain::PersistCompletion {
            ticket: c.ticket,
            outcome: c.outcome.map(from_wit_snapshot).map_err(from_wit_error),
        })
        .collect()
}

pub(crate) fn from_wit_reply(reply: wit::PersistReply) -> domain::PersistReply {
    match reply {
        wit::PersistReply::Ready(s) => domain::PersistReply::Ready(from_wit_snapshot(s)),
        wit::PersistReply::Pending(ticket) => domain::PersistReply::Pending(ticket),
    }
}
