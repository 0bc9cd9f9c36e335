//! Exports the writer, the words of its errors, the reader and the file encoder through the WIT world `changelog`, and
//! implements the writer's [`Effects`] with the host's imports.

use std::cell::RefCell;
use std::collections::HashMap;

use dstl_proto::codec;
use dstl_proto::read;
use dstl_proto::types as domain;
use dstl_proto::writer::{Effects, Writer};

wit_bindgen::generate!({
    world: "changelog",
    path: "wit",
    // Import parameters borrow: a block's pieces are slices of the writer's own buffers,
    // lent to `uploader.schedule` without a copy (types also used elsewhere stay owned).
    ownership: Borrowing { duplicate_if_necessary: false },
});

use dstl::changelog::types as wit;
use dstl::changelog::{local_registry, logging, registry, uploader};
use exports::dstl::changelog::errors::Guest as ErrorsGuest;
use exports::dstl::changelog::files::{self, Guest as FilesGuest};
use exports::dstl::changelog::reader::{Guest as ReaderGuest, PackedChanges};
use exports::dstl::changelog::writer::{Guest as WriterGuest, GuestWriter};

struct Component;

/// The host's imports as the writer's effects, and the blocks the writer's host reads
/// in place (by upload task): they stay here, untouched, until the host returns them.
struct HostEffects<'a> {
    lent: &'a mut HashMap<u64, Vec<domain::ChangeSetBlock<codec::Block>>>,
}

impl Effects for HostEffects<'_> {
    fn schedule(
        &mut self,
        task: domain::UploadTask<codec::Block>,
    ) -> Result<(), dstl_proto::error::Refusal> {
        let pieces: Vec<Vec<&[u8]>> = task.change_sets.iter().map(|c| c.block.pieces()).collect();
        let change_sets: Vec<wit::ChangeSetBlock<'_>> = task
            .change_sets
            .iter()
            .zip(&pieces)
            .map(|(c, pieces)| wit::ChangeSetBlock {
                sequence_number: c.sequence_number,
                size: c.size,
                pieces,
            })
            .collect();
        let lent = uploader::schedule(wit::UploadTask {
            id: task.id,
            change_sets: &change_sets,
            preemptive: task.preemptive,
        })
        .map_err(from_wit_refusal)?;
        if lent {
            drop(change_sets);
            drop(pieces);
            self.lent.insert(task.id, task.change_sets);
        }
        Ok(())
    }

    fn release(&mut self, handle: &domain::StreamHandle) {
        registry::release(&to_wit_stream(handle.clone()));
    }

    fn stop_tracking(&mut self, handle: &domain::StreamHandle) {
        registry::stop_tracking(&to_wit_stream(handle.clone()));
    }

    fn local_register(&mut self, handle: &domain::StreamHandle, checkpoint: domain::CheckpointId) {
        local_registry::register(&to_wit_stream(handle.clone()), checkpoint);
    }

    fn local_discard_up_to(&mut self, checkpoint: domain::CheckpointId) -> Vec<String> {
        local_registry::discard_up_to(checkpoint)
    }

    fn log(&mut self, level: domain::Level, message: &str) {
        let level = match level {
            domain::Level::Trace => logging::Level::Trace,
            domain::Level::Debug => logging::Level::Debug,
            domain::Level::Info => logging::Level::Info,
            domain::Level::Warn => logging::Level::Warn,
            domain::Level::Error => logging::Level::Error,
        };
        logging::log(level, message);
    }
}

dstl_proto::wit_conversions!(wit);

/// The exported resource. A constructor cannot fail in WIT, so a bad configuration is
/// kept and reported by every call.
struct WriterResource {
    writer: RefCell<Result<Writer, domain::WriterError>>,
    /// Blocks the host reads in place, by task (see `uploader.schedule`).
    lent: RefCell<HashMap<u64, Vec<domain::ChangeSetBlock<codec::Block>>>>,
}

impl WriterResource {
    fn with<R>(
        &self,
        f: impl FnOnce(&mut Writer, &mut HostEffects) -> Result<R, domain::WriterError>,
    ) -> Result<R, wit::WriterError> {
        let mut lent = self.lent.borrow_mut();
        match &mut *self.writer.borrow_mut() {
            Ok(writer) => f(writer, &mut HostEffects { lent: &mut lent }).map_err(to_wit_error),
            Err(e) => Err(to_wit_error(e.clone())),
        }
    }

    /// The host no longer reads the blocks of these tasks.
    fn give_back(&self, returned: Vec<u64>) {
        let mut lent = self.lent.borrow_mut();
        for task in returned {
            lent.remove(&task);
        }
    }
}

impl GuestWriter for WriterResource {
    fn new(config: wit::WriterConfig) -> Self {
        Self {
            writer: RefCell::new(Writer::new(from_wit_config(config))),
            lent: RefCell::default(),
        }
    }

    fn append(&self, key_group: i32, value: Vec<u8>) -> Result<(), wit::WriterError> {
        self.with(|wr, fx| wr.append(fx, key_group, &value))
    }

    fn append_batch(
        &self,
        key_groups: Vec<i32>,
        lengths: Vec<u32>,
        data: Vec<u8>,
    ) -> Result<u64, wit::WriterError> {
        self.with(|wr, fx| {
            wr.append_batch_owned(fx, &key_groups, &lengths, data)?;
            Ok(wr.open_bytes())
        })
    }

    fn append_framed(&self, data: Vec<u8>) -> Result<u64, wit::WriterError> {
        self.with(|wr, fx| {
            wr.append_framed_owned(fx, data)?;
            Ok(wr.open_bytes())
        })
    }

    fn append_meta(&self, value: Vec<u8>) -> Result<(), wit::WriterError> {
        self.with(|wr, fx| wr.append_meta(fx, &value))
    }

    fn initial_sequence_number(&self) -> u64 {
        0
    }

    fn next_sequence_number(&self) -> u64 {
        self.with(|wr, _| Ok(wr.next_sequence_number()))
            .unwrap_or(0)
    }

    fn persist(
        &self,
        key_groups: Vec<i32>,
        lengths: Vec<u32>,
        data: Vec<u8>,
        start: u64,
        checkpoint: i64,
    ) -> Result<wit::PersistReply, wit::WriterError> {
        self.with(|wr, fx| {
            if !key_groups.is_empty() {
                wr.append_batch_owned(fx, &key_groups, &lengths, data)?;
            }
            wr.persist(fx, start, checkpoint)
        })
        .map(to_wit_reply)
    }

    fn persist_framed(
        &self,
        data: Vec<u8>,
        start: u64,
        checkpoint: i64,
    ) -> Result<wit::PersistReply, wit::WriterError> {
        self.with(|wr, fx| {
            if !data.is_empty() {
                wr.append_framed_owned(fx, data)?;
            }
            wr.persist(fx, start, checkpoint)
        })
        .map(to_wit_reply)
    }

    fn truncate(&self, to: u64) -> Result<(), wit::WriterError> {
        self.with(|wr, fx| wr.truncate(fx, to))
    }

    fn truncate_and_close(
        &self,
        start: u64,
    ) -> Result<Vec<wit::PersistCompletion>, wit::WriterError> {
        self.with(|wr, fx| wr.truncate_and_close(fx, start))
            .map(to_wit_completions)
    }

    fn confirm(&self, start: u64, end: u64, checkpoint: i64) -> Result<(), wit::WriterError> {
        self.with(|wr, fx| wr.confirm(fx, start, end, checkpoint))
    }

    fn reset(&self, start: u64, end: u64, checkpoint: i64) -> Result<(), wit::WriterError> {
        self.with(|wr, fx| wr.reset(fx, start, end, checkpoint))
    }

    fn close(&self) -> Result<Vec<wit::PersistCompletion>, wit::WriterError> {
        self.with(|wr, fx| wr.close(fx)).map(to_wit_completions)
    }

    fn on_upload_succeeded(
        &self,
        task: u64,
        results: Vec<wit::UploadResult>,
        returned: Vec<u64>,
    ) -> Vec<wit::PersistCompletion> {
        self.give_back(returned);
        let results = results.into_iter().map(from_wit_result).collect();
        self.with(|wr, fx| Ok(wr.on_upload_succeeded(fx, task, results)))
            .map(to_wit_completions)
            .unwrap_or_default()
    }

    fn on_upload_failed(&self, task: u64, returned: Vec<u64>) -> Vec<wit::PersistCompletion> {
        self.give_back(returned);
        self.with(|wr, fx| Ok(wr.on_upload_failed(fx, task)))
            .map(to_wit_completions)
            .unwrap_or_default()
    }
}

impl WriterGuest for Component {
    type Writer = WriterResource;
}

impl ErrorsGuest for Component {
    fn describe(error: wit::WriterError, upload: Option<String>) -> String {
        from_wit_error(error).describe(upload.as_deref())
    }
}

impl ReaderGuest for Component {
    fn decode_change_set(logical: Vec<u8>, offset: u64) -> Result<Vec<wit::Change>, String> {
        codec::decode_change_set(&logical, offset)
            .map(to_wit_changes)
            .map_err(|e| e.to_string())
    }

    fn logical_bytes(file: Vec<u8>) -> Result<Vec<u8>, String> {
        codec::logical_bytes(&file)
            .map(|c| c.into_owned())
            .map_err(|e| e.to_string())
    }

    fn read_file(
        path: String,
        file: Result<Vec<u8>, String>,
        logical_size: u64,
        offsets: Vec<u64>,
    ) -> Result<PackedChanges, String> {
        let packed = read::read_file(
            &path,
            file.as_deref().map_err(String::as_str),
            logical_size,
            &offsets,
        )
        .map_err(|e| e.to_string())?;
        Ok(PackedChanges {
            counts: packed.counts,
            key_groups: packed.key_groups,
            lengths: packed.lengths,
            data: packed.data,
        })
    }
}

fn to_wit_changes(changes: Vec<codec::Change>) -> Vec<wit::Change> {
    changes
        .into_iter()
        .map(|c| wit::Change {
            key_group: c.key_group,
            value: c.value,
        })
        .collect()
}

impl FilesGuest for Component {
    fn encode_file(blocks: Vec<Vec<u8>>, compression: bool) -> Result<files::EncodedFile, String> {
        let (bytes, offsets) =
            codec::encode_file(&blocks, compression).map_err(|e| e.to_string())?;
        let logical_size = blocks.iter().map(|b| b.len() as u64).sum();
        Ok(files::EncodedFile {
            bytes,
            offsets,
            logical_size,
        })
    }

    fn layout_plain_file(block_sizes: Vec<u64>) -> files::PlainLayout {
        let (header, offsets, logical_size) = codec::plain_layout(block_sizes);
        files::PlainLayout {
            header,
            offsets,
            logical_size,
        }
    }
}

export!(Component);
