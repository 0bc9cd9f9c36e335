//! Recovery: turns a handle back into its changes, in order.
//!
//! Each file is read, and decompressed if needed, once per read of a handle however many
//! change sets point into it (Flink decompresses from the file start for every pair), and
//! with a [`RecoveryCache`] once per recovery however many handles point into it.
//! Distinct files are fetched in parallel. Every error names the file and the offset.

use std::sync::Arc;

use dstl_proto::codec::{self, Change};
use dstl_proto::read::{self, FileError, NeededFile, ReadPlan};
use dstl_proto::types::ChangelogHandle;
use sha2::Digest as _;

use super::cache::RecoveryCache;
use crate::store::FileSource;
use crate::sync::LockExt;

/// Why a handle could not be read ([`crate::ChangelogStorage::read`],
/// [`crate::Recovery::read`], [`read_handle`]). The words are `dstl_proto::read`'s, which
/// the Node host prints too.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// A file the handle names could not be read: missing (deleted, or a wrong base
    /// path), unreadable, or the object store failed or refused the request.
    #[error("{}", FileError::unreadable(.path, .source))]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A file's bytes do not decode at an offset the handle names, or its logical
    /// length differs from the one the handle recorded.
    #[error(transparent)]
    File(#[from] FileError),
}

/// Files fetched at once by one read.
const READ_THREADS: usize = 4;

/// Reads every change of `handle` in order: change sets in handle order; within a change
/// set, group by group as its block holds them (ARCHITECTURE.md, "The file format"), so
/// each key group's changes in append order.
///
/// A plain file is fetched with one ranged read covering the change sets the handle
/// needs; a compressed one whole, since Snappy framing has no index.
pub fn read_handle(handle: &ChangelogHandle, files: &FileSource) -> Result<Vec<Change>, ReadError> {
    read_handle_cached(handle, files, None)
}

/// Like [`read_handle`], with files taken from (and kept in) `cache`: a recovery that
/// reads many handles pointing into the same files reads and decompresses each once.
/// Distinct files are fetched in parallel.
pub fn read_handle_cached(
    handle: &ChangelogHandle,
    files: &FileSource,
    cache: Option<&RecoveryCache>,
) -> Result<Vec<Change>, ReadError> {
    let mut changes = Vec::new();
    visit_handle(handle, files, cache, &mut |key_group, value| {
        changes.push(Change {
            key_group,
            value: value.to_vec(),
        })
    })?;
    Ok(changes)
}

/// Calls `visit` with every change of `handle`, in order, each value borrowed from the
/// file's bytes: nothing is allocated per change. On an error, the changes visited so far
/// are those before the damage.
pub fn visit_handle(
    handle: &ChangelogHandle,
    files: &FileSource,
    cache: Option<&RecoveryCache>,
    visit: &mut dyn FnMut(i32, &[u8]),
) -> Result<(), ReadError> {
    let span = tracing::debug_span!(
        "recovery_read",
        entries = handle.entries.len(),
        files = tracing::field::Empty,
        state_size = handle.state_size,
        changes = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let _entered = span.enter();
    let mut changes = 0u64;
    let result = visit_entries(handle, files, cache, &span, visit, &mut changes);
    span.record("changes", changes);
    match &result {
        Ok(()) => {
            span.record("outcome", "ok");
            tracing::debug!("recovery read finished");
        }
        Err(error) => {
            span.record("outcome", "failed");
            tracing::debug!(%error, "recovery read failed");
        }
    }
    result
}

fn visit_entries(
    handle: &ChangelogHandle,
    files: &FileSource,
    cache: Option<&RecoveryCache>,
    span: &tracing::Span,
    visit: &mut dyn FnMut(i32, &[u8]),
    visited: &mut u64,
) -> Result<(), ReadError> {
    let plan = ReadPlan::new(handle);
    span.record("files", plan.files().len());
    let fetched = fetch_all(plan.files(), files, cache)?;
    for (i, entry) in handle.entries.iter().enumerate() {
        let logical = &fetched[plan.file_of(i)];
        *visited += read::visit_change_set(
            &entry.handle.path,
            &logical.bytes,
            logical.start,
            entry.offset,
            visit,
        )?;
    }
    Ok(())
}

/// The logical bytes of a file a read needs, from `start` on: all of them, from 0, for a
/// compressed file or any file from the cache; fewer after a ranged read of a plain file.
struct Logical {
    bytes: Arc<Vec<u8>>,
    start: u64,
}

impl Logical {
    /// All of a file's logical bytes.
    fn whole(bytes: Arc<Vec<u8>>) -> Self {
        Self { bytes, start: 0 }
    }
}

/// Fetches every file a read needs, in parallel when there are several; the first
/// error wins.
fn fetch_all(
    needed: &[NeededFile<'_>],
    files: &FileSource,
    cache: Option<&RecoveryCache>,
) -> Result<Vec<Logical>, ReadError> {
    let one = |file: &NeededFile<'_>| match cache {
        Some(cache) => cache
            .get_or_load(file.path, || {
                fetch_whole(files, file.path, file.logical_size)
            })
            .map(Logical::whole),
        None => fetch(files, file.path, file.logical_size, file.from),
    };
    if needed.len() <= 1 {
        return needed.iter().map(one).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<Result<Logical, ReadError>>>> =
        needed.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..READ_THREADS.min(needed.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(file) = needed.get(i) else {
                        return;
                    };
                    *slots[i].locked() = Some(one(file));
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|slot| slot.into_inner().unwrap().expect("every file was fetched"))
        .collect()
}

/// The logical bytes of `path` from `from` on (all of them for compressed files).
/// Checks the logical length against the handle's.
fn fetch(files: &FileSource, path: &str, file_size: u64, from: u64) -> Result<Logical, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_string(),
        source,
    };
    let flag = files.read_range(path, 0..1).map_err(io)?;
    if flag.first() == Some(&codec::FLAG_PLAIN) && from <= file_size {
        // One byte past the recorded end tells a longer file from an exact one.
        let bytes = files
            .read_range(path, from.saturating_add(1)..file_size.saturating_add(2))
            .map_err(io)?;
        if from.saturating_add(bytes.len() as u64) == file_size {
            return Ok(Logical {
                bytes: Arc::new(bytes),
                start: from,
            });
        }
        // The length differs: a range cannot tell by how much (the file may end before
        // `from`), so the whole file is read for the error, which names its true length.
    }
    fetch_whole(files, path, file_size).map(|bytes| Logical::whole(Arc::new(bytes)))
}

/// All logical bytes of `path`, checked against the handle's length.
fn fetch_whole(files: &FileSource, path: &str, file_size: u64) -> Result<Vec<u8>, ReadError> {
    let bytes = files.read(path).map_err(|source| ReadError::Io {
        path: path.to_string(),
        source,
    })?;
    Ok(read::logical_file(path, &bytes, file_size)?.into_owned())
}

/// SHA-256 over every change in order: key group and value length as 4-byte big-endian,
/// then the value (the digest the golden files call `expectedTotalSha256`).
pub fn digest(changes: &[Change]) -> String {
    let mut digest = Digest::default();
    for change in changes {
        digest.update(change.key_group, &change.value);
    }
    digest.finish().1
}

/// [`digest`], one change at a time, with the number of changes.
#[derive(Default)]
pub struct Digest {
    hasher: sha2::Sha256,
    changes: u64,
}

impl Digest {
    /// Adds one change.
    pub fn update(&mut self, key_group: i32, value: &[u8]) {
        self.hasher.update(key_group.to_be_bytes());
        self.hasher.update((value.len() as u32).to_be_bytes());
        self.hasher.update(value);
        self.changes += 1;
    }

    /// The number of changes and the lowercase hex digest.
    pub fn finish(self) -> (u64, String) {
        let hex = self
            .hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        (self.changes, hex)
    }
}
