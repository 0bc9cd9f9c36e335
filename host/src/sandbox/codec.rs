//! The component's exported codec (the `reader` and `files` interfaces), in a sandbox of
//! its own: the tests hold it against the host's reader and file writer, so the format is
//! proven to be the same inside and outside the component.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

use dstl_proto::codec::Change;
use wasmtime::Store;

use super::bindings::{Changelog, ChangelogPre, wit};
use super::context::{CallClock, WriterCtx, WriterLinks};
use super::engine::deadline_ticks;
use super::instance::new_store;
use super::trap::Trap;
use crate::services::Services;
use crate::upload::{OutcomeSink, UploadOutcome};

/// The sink of a sandbox that runs no writer: it schedules no uploads.
struct NoWriter;

impl OutcomeSink for NoWriter {
    fn deliver(&self, _: UploadOutcome) {}
}

/// The component's exported codec, for checking it against the host's reader and writer.
pub struct ComponentCodec {
    store: Store<WriterCtx>,
    bindings: Changelog,
    call_timeout: Duration,
}

impl ComponentCodec {
    pub(crate) fn new(
        pre: &ChangelogPre<WriterCtx>,
        services: Arc<Services>,
        memory_limit: u64,
        call_timeout: Duration,
    ) -> Result<Self, Trap> {
        let sink: Weak<dyn OutcomeSink> = Weak::<NoWriter>::new();
        let ctx = WriterCtx::new(
            "codec",
            0,
            memory_limit,
            call_timeout,
            services,
            WriterLinks {
                sink,
                closing: Arc::new(AtomicBool::new(false)),
                preemptive_uploads: metrics::Counter::noop(),
            },
        );
        let mut store = new_store(pre.engine(), ctx);
        let bindings = pre
            .instantiate(&mut store)
            .map_err(|e| Trap::new(&e, store.data(), call_timeout))?;
        Ok(Self {
            store,
            bindings,
            call_timeout,
        })
    }

    fn trap(e: wasmtime::Error) -> String {
        format!("codec sandbox trapped: {e:#}")
    }

    fn start_call(&mut self) {
        self.store.data_mut().clock = CallClock::new(self.call_timeout);
        self.store
            .set_epoch_deadline(deadline_ticks(self.call_timeout));
    }

    /// A whole file's logical bytes, decoded inside the sandbox.
    pub fn logical_bytes(&mut self, file: &[u8]) -> Result<Vec<u8>, String> {
        self.start_call();
        self.bindings
            .dstl_changelog_reader()
            .call_logical_bytes(&mut self.store, file)
            .map_err(Self::trap)?
    }

    /// A file holding `blocks`, encoded inside the sandbox: its bytes, each block's
    /// logical offset, and the logical length.
    pub fn encode_file(
        &mut self,
        blocks: &[Vec<u8>],
        compression: bool,
    ) -> Result<(Vec<u8>, Vec<u64>, u64), String> {
        self.start_call();
        let file = self
            .bindings
            .dstl_changelog_files()
            .call_encode_file(&mut self.store, blocks, compression)
            .map_err(Self::trap)??;
        Ok((file.bytes, file.offsets, file.logical_size))
    }

    /// The layout of an uncompressed file of blocks of `block_sizes` bytes, computed
    /// inside the sandbox: the header, each block's logical offset, the logical length.
    pub fn layout_plain_file(
        &mut self,
        block_sizes: &[u64],
    ) -> Result<(Vec<u8>, Vec<u64>, u64), String> {
        self.start_call();
        let layout = self
            .bindings
            .dstl_changelog_files()
            .call_layout_plain_file(&mut self.store, block_sizes)
            .map_err(Self::trap)?;
        Ok((layout.header, layout.offsets, layout.logical_size))
    }

    /// The changes of the change sets at `offsets` of the file `path`, one list per
    /// offset, read inside the sandbox from `file` (its bytes, or the fetch's error) and
    /// checked against the handle's `logical_size`; the error is the reader's message.
    pub fn read_file(
        &mut self,
        path: &str,
        file: Result<&[u8], &str>,
        logical_size: u64,
        offsets: &[u64],
    ) -> Result<Vec<Vec<Change>>, String> {
        self.start_call();
        let packed = self
            .bindings
            .dstl_changelog_reader()
            .call_read_file(&mut self.store, path, file, logical_size, offsets)
            .map_err(Self::trap)??;
        let packed = dstl_proto::read::PackedChanges {
            counts: packed.counts,
            key_groups: packed.key_groups,
            lengths: packed.lengths,
            data: packed.data,
        };
        packed
            .unpack()
            .ok_or_else(|| "the codec returned change columns that do not add up".to_string())
    }

    /// The change set at `offset` of `logical`, decoded inside the sandbox.
    pub fn decode_change_set(
        &mut self,
        logical: &[u8],
        offset: u64,
    ) -> Result<Vec<Change>, String> {
        self.start_call();
        let changes = self
            .bindings
            .dstl_changelog_reader()
            .call_decode_change_set(&mut self.store, logical, offset)
            .map_err(Self::trap)??;
        Ok(from_wit_changes(changes))
    }
}

fn from_wit_changes(changes: Vec<wit::Change>) -> Vec<Change> {
    changes
        .into_iter()
        .map(|c| Change {
            key_group: c.key_group,
            value: c.value,
        })
        .collect()
}
