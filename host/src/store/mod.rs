//! Where changelog files live: a local directory (the default) or an S3-compatible
//! object store. Every store makes a file visible only whole, never overwrites one, and
//! leaves nothing behind when a create fails.

mod local;
mod s3;

use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

pub use local::LocalStore;
pub(crate) use local::{delete as delete_file, read};
pub use s3::{S3Settings, S3Store};

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

impl Location {
    /// Parses a base path: `s3://bucket[/prefix]` or a directory. Every part that ends up
    /// in an object key is validated, so nothing can escape the base.
    pub fn parse(base: &str) -> Result<Self, String> {
        if base.contains('\0') {
            return Err(format!("base path {base:?} contains a NUL character"));
        }
        let Some(rest) = base.strip_prefix("s3://") else {
            if base.contains("://") {
                return Err(format!(
                    "unsupported store URL {base}: use a directory or s3://bucket/prefix"
                ));
            }
            return Ok(Location::Local(base.into()));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !bucket.starts_with(['-', '.'])
            && !bucket.ends_with(['-', '.']);
        if !bucket_ok {
            return Err(format!(
                "invalid bucket name {bucket:?} in {base}: 3 to 63 lowercase letters, digits, '-' or '.'"
            ));
        }
        let prefix = prefix.trim_end_matches('/');
        for segment in prefix.split('/').filter(|_| !prefix.is_empty()) {
            if segment.is_empty()
                || segment == "."
                || segment == ".."
                || segment.chars().any(|c| c.is_control() || c == '\\')
            {
                return Err(format!(
                    "invalid prefix segment {segment:?} in {base}: no empty, '.' or '..' segments, backslashes or control characters"
                ));
            }
        }
        Ok(Location::S3 {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

/// The stores of one storage: uploads go to `remote`, local copies to `local`; paths
/// are routed to the store that owns them.
#[derive(Clone)]
pub(crate) struct Stores {
    pub remote: Arc<dyn Store>,
    pub local: Option<LocalStore>,
}

impl Stores {
    fn owner(&self, path: &str) -> &dyn Store {
        match &self.local {
            Some(local) if local.contains(path) => local,
            _ => &*self.remote,
        }
    }

    pub fn delete(&self, path: &str) -> std::io::Result<()> {
        self.owner(path).delete(path)
    }
}

/// Reads files named by handles: `s3://` URLs through an S3 client, anything else from
/// the local filesystem.
pub struct FileSource {
    s3: Option<S3Settings>,
    clients: std::sync::Mutex<std::collections::HashMap<String, Arc<S3Store>>>,
}

impl FileSource {
    /// A source using `s3` to reach object stores.
    pub fn new(s3: Option<S3Settings>) -> Self {
        Self {
            s3,
            clients: Default::default(),
        }
    }

    fn client(&self, path: &str) -> std::io::Result<Option<Arc<S3Store>>> {
        let Some(rest) = path.strip_prefix("s3://") else {
            return Ok(None);
        };
        let bucket = rest.split('/').next().unwrap_or_default();
        let mut clients = self.clients.lock().unwrap();
        if let Some(client) = clients.get(bucket) {
            return Ok(Some(client.clone()));
        }
        let settings = self.s3.clone().unwrap_or_default();
        let client = Arc::new(
            S3Store::open(&settings, bucket, "", "")
                .map_err(|e| std::io::Error::other(format!("cannot reach {path}: {e}")))?,
        );
        clients.insert(bucket.to_string(), client.clone());
        Ok(Some(client))
    }

    /// Reads a whole file.
    pub fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        match self.client(path)? {
            Some(s3) => s3.read(path),
            None => read(path),
        }
    }

    /// Reads part of a file.
    pub fn read_range(&self, path: &str, range: Range<u64>) -> std::io::Result<Vec<u8>> {
        match self.client(path)? {
            Some(s3) => s3.read_range(path, range),
            None => {
                use std::io::{Read, Seek, SeekFrom};
                let mut file = std::fs::File::open(path)?;
                file.seek(SeekFrom::Start(range.start))?;
                let mut out = Vec::new();
                file.take(range.end.saturating_sub(range.start))
                    .read_to_end(&mut out)?;
                Ok(out)
            }
        }
    }
}
