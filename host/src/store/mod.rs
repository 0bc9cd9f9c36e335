//! Where changelog files live: a local directory (the default) or an S3-compatible
//! object store. Every store makes a file visible only whole, never overwrites one, and
//! leaves nothing behind when a create fails.

mod direct;
pub(crate) mod lease;
mod local;
mod routing;
mod s3;
mod source;

use std::ops::Range;
use std::time::SystemTime;

pub use local::{LocalStore, create_dirs_durably};
pub(crate) use local::{delete as delete_file, sync_parent};
pub(crate) use routing::{Holder, Stores};
pub use s3::{S3Error, S3Settings, S3Store};
pub(crate) use s3::{job_key_prefix, join_key};
pub use source::FileSource;

/// A file as listed by a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFile {
    /// Path or URL, as handles name it.
    pub path: String,
    /// Bytes stored.
    pub size: u64,
    /// Last modification.
    pub modified: SystemTime,
}

/// Where uploads put files.
pub trait Store: Send + Sync + 'static {
    /// Creates a new file `name` holding `bytes`; returns the path (or URL) that handles
    /// will name it by.
    fn create(&self, name: &str, bytes: &[u8]) -> std::io::Result<String>;
    /// Like [`Store::create`] with the bytes given in parts; stores that can write parts
    /// without joining them first override this.
    fn create_parts(&self, name: &str, parts: &[&[u8]]) -> std::io::Result<String> {
        self.create(name, &parts.concat())
    }
    /// Deletes a file of this store; a missing file counts as deleted.
    fn delete(&self, path: &str) -> std::io::Result<()>;
    /// Reads a whole file of this store.
    fn read(&self, path: &str) -> std::io::Result<Vec<u8>>;
    /// Reads `range` of a file of this store.
    fn read_range(&self, path: &str, range: Range<u64>) -> std::io::Result<Vec<u8>> {
        let bytes = self.read(path)?;
        let end = (range.end as usize).min(bytes.len());
        let start = (range.start as usize).min(end);
        Ok(bytes[start..end].to_vec())
    }
    /// Every changelog file of this store (its job directory).
    fn list(&self) -> std::io::Result<Vec<StoredFile>>;
    /// Where the files go, for messages.
    fn describe(&self) -> String;
}

/// Where a configured base path points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local directory.
    Local(std::path::PathBuf),
    /// `s3://bucket/prefix`.
    S3 {
        /// The bucket.
        bucket: String,
        /// Key prefix, without leading or trailing `/`; may be empty.
        prefix: String,
    },
}

/// Why a base path is not a usable location.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LocationError {
    /// A NUL character, which no path may hold.
    #[error("base path {base:?} contains a NUL character")]
    Nul {
        /// The base path.
        base: String,
    },
    /// A URL of a kind of store dstl does not support.
    #[error("unsupported store URL {base}: use a directory or s3://bucket/prefix")]
    UnsupportedScheme {
        /// The base path.
        base: String,
    },
    /// A bucket name S3 would refuse.
    #[error(
        "invalid bucket name {bucket:?} in {base}: 3 to 63 lowercase letters, digits, '-' or '.'"
    )]
    Bucket {
        /// The bucket.
        bucket: String,
        /// The base path.
        base: String,
    },
    /// An `s3://` URL in a build without the crate feature `s3`.
    #[error("{base}: this build of dstl has no S3 support (enable the crate feature `s3`)")]
    S3NotBuilt {
        /// The base path.
        base: String,
    },
    /// A prefix segment that could escape the base or confuse the store.
    #[error(
        "invalid prefix segment {segment:?} in {base}: no empty, '.' or '..' segments, backslashes or control characters"
    )]
    PrefixSegment {
        /// The segment.
        segment: String,
        /// The base path.
        base: String,
    },
}

impl Location {
    /// Parses a base path: `s3://bucket[/prefix]` or a directory. Every part that ends up
    /// in an object key is validated, so nothing can escape the base.
    pub fn parse(base: &str) -> Result<Self, LocationError> {
        if base.contains('\0') {
            return Err(LocationError::Nul { base: base.into() });
        }
        let Some(rest) = base.strip_prefix("s3://") else {
            if base.contains("://") {
                return Err(LocationError::UnsupportedScheme { base: base.into() });
            }
            return Ok(Location::Local(base.into()));
        };
        if cfg!(not(feature = "s3")) {
            return Err(LocationError::S3NotBuilt { base: base.into() });
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !bucket.starts_with(['-', '.'])
            && !bucket.ends_with(['-', '.']);
        if !bucket_ok {
            return Err(LocationError::Bucket {
                bucket: bucket.into(),
                base: base.into(),
            });
        }
        let prefix = prefix.trim_end_matches('/');
        for segment in prefix.split('/').filter(|_| !prefix.is_empty()) {
            if segment.is_empty()
                || segment == "."
                || segment == ".."
                || segment.chars().any(|c| c.is_control() || c == '\\')
            {
                return Err(LocationError::PrefixSegment {
                    segment: segment.into(),
                    base: base.into(),
                });
            }
        }
        Ok(Location::S3 {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}
