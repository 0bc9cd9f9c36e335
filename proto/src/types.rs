//! Plain Rust mirrors of the WIT `types` interface, so the state machine does not depend
//! on generated bindings and unit-tests natively.

/// Identifies one change set of a writer.
pub type SequenceNumber = u64;

/// A checkpoint id; [`PREEMPTIVE_CHECKPOINT`] marks a persist that belongs to none.
pub type CheckpointId = i64;

/// The checkpoint id of pre-emptive persists.
pub const PREEMPTIVE_CHECKPOINT: CheckpointId = -1;

/// Storage identifier written into every handle (Flink's `"filesystem"`).
pub const STORAGE_ID: &str = "filesystem";

/// Inclusive range of key groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyGroupRange {
    /// First key group.
    pub start: i32,
    /// Last key group (inclusive).
    pub end: i32,
}

impl KeyGroupRange {
    /// True if `key_group` lies in the range.
    pub fn contains(&self, key_group: i32) -> bool {
        self.start <= key_group && key_group <= self.end
    }
}

/// A file in the store with its logical size.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamHandle {
    /// Absolute path or URL.
    pub path: String,
    /// Logical (uncompressed) length after the flag byte.
    pub file_size: u64,
}

/// One change set inside a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleEntry {
    /// The file.
    pub handle: StreamHandle,
    /// Logical offset of the block.
    pub offset: u64,
    /// Payload bytes of the change set.
    pub size: u64,
}

/// The change sets of a snapshot, in sequence-number order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangelogHandle {
    /// `(file, offset, size)` per change set.
    pub entries: Vec<HandleEntry>,
    /// The writer's key groups.
    pub key_group_range: KeyGroupRange,
    /// Sum of entry sizes.
    pub state_size: u64,
    /// Bytes this snapshot had to upload (0 when everything was uploaded before).
    pub incremental_size: u64,
    /// Always [`STORAGE_ID`].
    pub storage_id: String,
}

/// A remote handle and optionally a handle to local copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotResult {
    /// Handle to the store's files.
    pub remote: ChangelogHandle,
    /// Handle to the local copies, when local recovery is on and every change set has one.
    pub local: Option<ChangelogHandle>,
}

pub use crate::error::WriterError;

/// What a writer is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterConfig {
    /// Operator name, for messages.
    pub name: String,
    /// Key groups this writer accepts.
    pub key_group_range: KeyGroupRange,
    /// Open-change bytes that trigger an upload before any checkpoint (`>=`).
    pub preemptive_persist_threshold: u64,
    /// Build local handles.
    pub local_recovery: bool,
    /// Blocks keep large values apart, as pieces of their own ([`crate::codec::Block`]);
    /// false: every block is one piece.
    pub value_pieces: bool,
}

/// One encoded change set handed to the uploader: the writer hands out its blocks as
/// [`crate::codec::Block`] pieces, a host uploads them as one buffer each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeSetBlock<B = Vec<u8>> {
    /// Its sequence number.
    pub sequence_number: SequenceNumber,
    /// Payload bytes.
    pub size: u64,
    /// The encoded block.
    pub block: B,
}

/// Change sets of one writer uploaded together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadTask<B = Vec<u8>> {
    /// Names the task in its outcome.
    pub id: u64,
    /// Ascending sequence numbers.
    pub change_sets: Vec<ChangeSetBlock<B>>,
    /// Scheduled at the pre-emptive threshold, for no checkpoint: nobody waits for it.
    pub preemptive: bool,
}

/// Where a local copy of an uploaded change set lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCopy {
    /// The local file.
    pub handle: StreamHandle,
    /// Logical offset in it.
    pub offset: u64,
}

/// One uploaded change set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadResult {
    /// Its sequence number.
    pub sequence_number: SequenceNumber,
    /// The store's file.
    pub remote: StreamHandle,
    /// Logical offset in it.
    pub offset: u64,
    /// The local copy, if one was made.
    pub local: Option<LocalCopy>,
    /// Payload bytes.
    pub size: u64,
}

/// What `persist` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PersistReply {
    /// Everything was uploaded already.
    Ready(SnapshotResult),
    /// Completed later by a [`PersistCompletion`] with this ticket.
    Pending(u64),
}

/// A pending persist that finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistCompletion {
    /// The ticket `persist` returned.
    pub ticket: u64,
    /// The snapshot, or why it failed.
    pub outcome: Result<SnapshotResult, WriterError>,
}

/// Log levels of the host's logging import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Very detailed.
    Trace,
    /// Detailed.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the writer handled.
    Warn,
    /// Something failed.
    Error,
}
