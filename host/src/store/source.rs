//! Reading files named by handles, wherever they are.

use std::ops::Range;
use std::sync::Arc;

use crate::sync::LockExt;

use super::{S3Settings, S3Store, Store};

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
        let mut clients = self.clients.locked();
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
            None => std::fs::read(path),
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
