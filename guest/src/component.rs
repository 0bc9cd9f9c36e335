//! Exports the writer and reader through the WIT world `changelog`, and implements the
//! writer's [`Effects`] with the host's imports.

use std::cell::RefCell;

use crate::codec;
use crate::types as t;
use crate::writer::{Effects, Writer};

wit_bindgen::generate!({
    world: "changelog",
    path: "../wit",
});

use dstl::changelog::types as w;
use dstl::changelog::{local_registry, logging, registry, uploader};
use exports::dstl::changelog::reader::Guest as ReaderGuest;
use exports::dstl::changelog::writer::{Guest as WriterGuest, GuestWriter};

struct Component;

/// The host's imports as the writer's effects.
struct HostEffects;

impl Effects for HostEffects {
    fn schedule(&mut self, task: t::UploadTask) -> Result<(), String> {
        uploader::schedule(&w::UploadTask {
            id: task.id,
            change_sets: task
                .change_sets
                .into_iter()
                .map(|c| w::ChangeSetBlock {
                    sequence_number: c.sequence_number,
                    size: c.size,
                    block: c.block,
                })
                .collect(),
        })
    }

    fn release(&mut self, handle: &t::StreamHandle) {
        registry::release(&to_wit_stream(handle));
    }

    fn stop_tracking(&mut self, handle: &t::StreamHandle) {
        registry::stop_tracking(&to_wit_stream(handle));
    }

    fn local_register(&mut self, handle: &t::StreamHandle, checkpoint: t::CheckpointId) {
        local_registry::register(&to_wit_stream(handle), checkpoint);
    }

    fn local_discard_up_to(&mut self, checkpoint: t::CheckpointId) -> Vec<String> {
        local_registry::discard_up_to(checkpoint)
    }

    fn log(&mut self, level: t::Level, message: &str) {
        let level = match level {
            t::Level::Trace => logging::Level::Trace,
            t::Level::Debug => logging::Level::Debug,
            t::Level::Info => logging::Level::Info,
            t::Level::Warn => logging::Level::Warn,
            t::Level::Error => logging::Level::Error,
        };
        logging::log(level, message);
    }
}

fn to_wit_stream(h: &t::StreamHandle) -> w::StreamHandle {
    w::StreamHandle {
        path: h.path.clone(),
        file_size: h.file_size,
    }
}

fn from_wit_stream(h: w::StreamHandle) -> t::StreamHandle {
    t::StreamHandle {
        path: h.path,
        file_size: h.file_size,
    }
}

fn to_wit_range(r: t::KeyGroupRange) -> w::KeyGroupRange {
    w::KeyGroupRange {
        start: r.start,
        end: r.end,
    }
}

fn to_wit_handle(h: t::ChangelogHandle) -> w::ChangelogHandle {
    w::ChangelogHandle {
        entries: h
            .entries
            .into_iter()
            .map(|e| w::HandleEntry {
                handle: to_wit_stream(&e.handle),
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

fn to_wit_snapshot(s: t::SnapshotResult) -> w::SnapshotResult {
    w::SnapshotResult {
        remote: to_wit_handle(s.remote),
        local: s.local.map(to_wit_handle),
    }
}

fn to_wit_error(e: t::WriterError) -> w::WriterError {
    match e {
        t::WriterError::Closed(m) => w::WriterError::Closed(m),
        t::WriterError::Truncated(m) => w::WriterError::Truncated(m),
        t::WriterError::NotYetAppended(m) => w::WriterError::NotYetAppended(m),
        t::WriterError::AlreadyFailed(m) => w::WriterError::AlreadyFailed(m),
        t::WriterError::InvalidRange(m) => w::WriterError::InvalidRange(m),
        t::WriterError::InvalidArgument(m) => w::WriterError::InvalidArgument(m),
        t::WriterError::UploadFailed(m) => w::WriterError::UploadFailed(m),
    }
}

fn to_wit_completions(list: Vec<t::PersistCompletion>) -> Vec<w::PersistCompletion> {
    list.into_iter()
        .map(|c| w::PersistCompletion {
            ticket: c.ticket,
            outcome: c.outcome.map(to_wit_snapshot).map_err(to_wit_error),
        })
        .collect()
}

/// The exported resource. A constructor cannot fail in WIT, so a bad configuration is
/// kept and reported by every call.
struct WriterResource(RefCell<Result<Writer, t::WriterError>>);

impl WriterResource {
    fn with<R>(
        &self,
        f: impl FnOnce(&mut Writer, &mut HostEffects) -> Result<R, t::WriterError>,
    ) -> Result<R, w::WriterError> {
        match &mut *self.0.borrow_mut() {
            Ok(writer) => f(writer, &mut HostEffects).map_err(to_wit_error),
            Err(e) => Err(to_wit_error(e.clone())),
        }
    }
}

impl GuestWriter for WriterResource {
    fn new(config: w::WriterConfig) -> Self {
        Self(RefCell::new(Writer::new(t::WriterConfig {
            name: config.name,
            key_group_range: t::KeyGroupRange {
                start: config.key_group_range.start,
                end: config.key_group_range.end,
            },
            preemptive_persist_threshold: config.preemptive_persist_threshold,
            local_recovery: config.local_recovery,
        })))
    }

    fn append(&self, key_group: i32, value: Vec<u8>) -> Result<(), w::WriterError> {
        self.with(|wr, fx| wr.append(fx, key_group, &value))
    }

    fn append_batch(
        &self,
        key_groups: Vec<i32>,
        lengths: Vec<u32>,
        data: Vec<u8>,
    ) -> Result<u64, w::WriterError> {
        self.with(|wr, fx| {
            wr.append_batch(fx, &key_groups, &lengths, &data)?;
            Ok(wr.open_bytes())
        })
    }

    fn append_meta(&self, value: Vec<u8>) -> Result<(), w::WriterError> {
        self.with(|wr, fx| wr.append_meta(fx, &value))
    }

    fn initial_sequence_number(&self) -> u64 {
        0
    }

    fn next_sequence_number(&self) -> u64 {
        self.with(|wr, _| Ok(wr.next_sequence_number()))
            .unwrap_or(0)
    }

    fn persist(&self, start: u64, checkpoint: i64) -> Result<w::PersistReply, w::WriterError> {
        self.with(|wr, fx| wr.persist(fx, start, checkpoint))
            .map(|r| match r {
                t::PersistReply::Ready(s) => w::PersistReply::Ready(to_wit_snapshot(s)),
                t::PersistReply::Pending(ticket) => w::PersistReply::Pending(ticket),
            })
    }

    fn truncate(&self, to: u64) -> Result<(), w::WriterError> {
        self.with(|wr, fx| wr.truncate(fx, to))
    }

    fn truncate_and_close(&self, start: u64) -> Result<Vec<w::PersistCompletion>, w::WriterError> {
        self.with(|wr, fx| wr.truncate_and_close(fx, start))
            .map(to_wit_completions)
    }

    fn confirm(&self, start: u64, end: u64, checkpoint: i64) -> Result<(), w::WriterError> {
        self.with(|wr, fx| wr.confirm(fx, start, end, checkpoint))
    }

    fn reset(&self, start: u64, end: u64, checkpoint: i64) -> Result<(), w::WriterError> {
        self.with(|wr, fx| wr.reset(fx, start, end, checkpoint))
    }

    fn close(&self) -> Result<Vec<w::PersistCompletion>, w::WriterError> {
        self.with(|wr, fx| wr.close(fx)).map(to_wit_completions)
    }

    fn on_upload_succeeded(
        &self,
        task: u64,
        results: Vec<w::UploadResult>,
    ) -> Vec<w::PersistCompletion> {
        let results = results
            .into_iter()
            .map(|r| t::UploadResult {
                sequence_number: r.sequence_number,
                remote: from_wit_stream(r.remote),
                offset: r.offset,
                local: r.local.map(|l| t::LocalCopy {
                    handle: from_wit_stream(l.handle),
                    offset: l.offset,
                }),
                size: r.size,
            })
            .collect();
        self.with(|wr, fx| Ok(wr.on_upload_succeeded(fx, task, results)))
            .map(to_wit_completions)
            .unwrap_or_default()
    }

    fn on_upload_failed(&self, task: u64, cause: String) -> Vec<w::PersistCompletion> {
        self.with(|wr, fx| Ok(wr.on_upload_failed(fx, task, &cause)))
            .map(to_wit_completions)
            .unwrap_or_default()
    }
}

impl WriterGuest for Component {
    type Writer = WriterResource;
}

impl ReaderGuest for Component {
    fn decode_change_set(logical: Vec<u8>, offset: u64) -> Result<Vec<w::Change>, String> {
        codec::decode_change_set(&logical, offset)
            .map(|changes| {
                changes
                    .into_iter()
                    .map(|c| w::Change {
                        key_group: c.key_group,
                        value: c.value,
                    })
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    fn logical_bytes(file: Vec<u8>) -> Result<Vec<u8>, String> {
        codec::logical_bytes(&file)
            .map(|c| c.into_owned())
            .map_err(|e| e.to_string())
    }
}

export!(Component);
