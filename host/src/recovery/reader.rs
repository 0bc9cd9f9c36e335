//! Recovery: turns a handle back into its changes, in order.
//!
//! Each file is read, and decompressed if needed, once per read of a handle however many
//! change sets point into it (Flink decompresses from the file start for every pair).
//! Every error names the file and the offset.

use std::collections::HashMap;

use dstl_proto::codec::{self, Change, FormatError};
use dstl_proto::types::ChangelogHandle;

use crate::store::FileSource;

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
///
/// A plain file is fetched with one ranged read covering the change sets the handle
/// needs; a compressed one whole, since Snappy framing has no index.
pub fn read_handle(handle: &ChangelogHandle, files: &FileSource) -> Result<Vec<Change>, ReadError> {
    let mut first_offset: HashMap<&str, u64> = HashMap::new();
    for entry in &handle.entries {
        let min = first_offset
            .entry(&entry.handle.path)
            .or_insert(entry.offset);
        *min = (*min).min(entry.offset);
    }
    // Per file: the logical bytes fetched, and the logical offset they start at.
    let mut cache: HashMap<&str, (Vec<u8>, u64)> = HashMap::new();
    let mut changes = Vec::new();
    for entry in &handle.entries {
        let path = entry.handle.path.as_str();
        if !cache.contains_key(path) {
            let fetched = fetch(files, path, entry.handle.file_size, first_offset[path])?;
            cache.insert(path, fetched);
        }
        let (logical, start) = &cache[path];
        let format = |source| ReadError::Format {
            path: path.to_string(),
            offset: entry.offset,
            source,
        };
        let relative = entry.offset.checked_sub(*start).ok_or_else(|| {
            format(FormatError::OffsetOutOfRange {
                offset: entry.offset,
                len: entry.handle.file_size,
            })
        })?;
        changes.extend(codec::decode_change_set(logical, relative).map_err(format)?);
    }
    Ok(changes)
}

/// The logical bytes of `path` from `from` on (all of them for compressed files), and
/// the offset they start at. Checks the logical length against the handle's.
fn fetch(
    files: &FileSource,
    path: &str,
    file_size: u64,
    from: u64,
) -> Result<(Vec<u8>, u64), ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_string(),
        source,
    };
    let mismatch = |actual| ReadError::SizeMismatch {
        path: path.to_string(),
        expected: file_size,
        actual,
    };
    let flag = files.read_range(path, 0..1).map_err(io)?;
    if flag.first() == Some(&codec::FLAG_PLAIN) && from <= file_size {
        // One byte past the recorded end tells a longer file from an exact one.
        let bytes = files
            .read_range(path, from.saturating_add(1)..file_size.saturating_add(2))
            .map_err(io)?;
        let actual = from.saturating_add(bytes.len() as u64);
        if actual != file_size {
            return Err(mismatch(actual));
        }
        return Ok((bytes, from));
    }
    let bytes = files.read(path).map_err(io)?;
    let logical = codec::logical_bytes(&bytes).map_err(|source| ReadError::Format {
        path: path.to_string(),
        offset: from,
        source,
    })?;
    if logical.len() as u64 != file_size {
        return Err(mismatch(logical.len() as u64));
    }
    Ok((logical.into_owned(), 0))
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
