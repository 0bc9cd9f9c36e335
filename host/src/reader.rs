//! Recovery: turns a handle back into its changes, in order.
//!
//! Each file is read, and decompressed if needed, once per read of a handle however many
//! change sets point into it (Flink decompresses from the file start for every pair,
//! spec §12.12). Every error names the file and the offset.

use std::collections::HashMap;

use dstl_guest::codec::{self, Change, FormatError};
use dstl_guest::types::ChangelogHandle;

/// Why a handle could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be read.
    #[error("cannot read changelog file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The bytes do not decode.
    #[error("corrupt changelog file {path} at logical offset {offset}: {source}")]
    Format {
        /// The file.
        path: String,
        /// The change set's offset.
        offset: u64,
        /// What is wrong.
        #[source]
        source: FormatError,
    },
    /// The file's logical length differs from the one the handle recorded.
    #[error(
        "changelog file {path} has {actual} logical bytes but the handle records {expected}: the file was truncated or replaced"
    )]
    SizeMismatch {
        /// The file.
        path: String,
        /// Logical length in the handle.
        expected: u64,
        /// Logical length found.
        actual: u64,
    },
}

/// Reads every change of `handle` in order: change sets in handle order; within a change
/// set, metadata first, then key group by key group in append order.
pub fn read_handle(handle: &ChangelogHandle) -> Result<Vec<Change>, ReadError> {
    let mut files: HashMap<&str, Vec<u8>> = HashMap::new();
    let mut changes = Vec::new();
    for entry in &handle.entries {
        let path = entry.handle.path.as_str();
        if !files.contains_key(path) {
            let bytes = crate::store::read(path).map_err(|source| ReadError::Io {
                path: path.to_string(),
                source,
            })?;
            let logical = codec::logical_bytes(&bytes)
                .map_err(|source| ReadError::Format {
                    path: path.to_string(),
                    offset: entry.offset,
                    source,
                })?
                .into_owned();
            if logical.len() as u64 != entry.handle.file_size {
                return Err(ReadError::SizeMismatch {
                    path: path.to_string(),
                    expected: entry.handle.file_size,
                    actual: logical.len() as u64,
                });
            }
            files.insert(path, logical);
        }
        let logical = &files[path];
        let decoded = codec::decode_change_set(logical, entry.offset).map_err(|source| {
            ReadError::Format {
                path: path.to_string(),
                offset: entry.offset,
                source,
            }
        })?;
        changes.extend(decoded);
    }
    Ok(changes)
}

/// SHA-256 over every change in order: key group and value length as 4-byte big-endian,
/// then the value (the digest `golden/` calls `expectedTotalSha256`).
pub fn digest(changes: &[Change]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for change in changes {
        hasher.update(change.key_group.to_be_bytes());
        hasher.update((change.value.len() as u32).to_be_bytes());
        hasher.update(&change.value);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
