//! Appends collected on the host side as packed columns, handed to the guest as one
//! `append-batch` call: a call into the sandbox costs ~0.35 µs, a packed batch of 1000
//! small changes ~20 µs (ARCHITECTURE.md, "Costs that shaped the design").

use dstl_proto::types::WriterError;

/// Packed columns of appends not yet handed to the guest.
#[derive(Default)]
pub(crate) struct AppendBuffer {
    pub key_groups: Vec<i32>,
    pub lengths: Vec<u32>,
    pub data: Vec<u8>,
}

impl AppendBuffer {
    /// Hand over at this many bytes or changes.
    pub const MAX_BYTES: usize = 256 << 10;
    pub const MAX_CHANGES: usize = 4096;

    pub fn push(&mut self, key_group: i32, value: &[u8]) {
        self.key_groups.push(key_group);
        self.lengths.push(value.len() as u32);
        self.data.extend_from_slice(value);
    }

    pub fn is_empty(&self) -> bool {
        self.key_groups.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.data.len() >= Self::MAX_BYTES || self.key_groups.len() >= Self::MAX_CHANGES
    }

    pub fn clear(&mut self) {
        self.key_groups.clear();
        self.lengths.clear();
        self.data.clear();
    }
}

/// Keeps the host's mirror of the guest's open bytes after an `append-batch`: the guest
/// reports them; a failed pre-emptive persist leaves the set open and over the threshold
/// (so the next append tries again, as the guest would); a batch the guest refused as
/// malformed appended nothing.
pub(crate) fn mirror_open_bytes(
    open_bytes: &mut u64,
    result: Result<u64, WriterError>,
) -> Result<(), WriterError> {
    match result {
        Ok(open) => {
            *open_bytes = open;
            Ok(())
        }
        Err(e @ WriterError::InvalidArgument(_)) => Err(e),
        Err(e) => {
            *open_bytes = u64::MAX;
            Err(e)
        }
    }
}
