//! The manifest JSON of one snapshot (a contract other tools rely on: see README.md,
//! "Manifest"), written atomically.

use std::path::Path;

use dstl_proto::types::{
    ChangelogHandle, HandleEntry, KeyGroupRange, STORAGE_ID, SnapshotResult, StreamHandle,
};
use serde::{Deserialize, Serialize};

/// Why a manifest cannot be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// [`Manifest::load`]: the file cannot be read (missing, no permission).
    #[error("cannot read manifest {}: {source}", path.display())]
    Read {
        /// The manifest.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// [`Manifest::load`]: the file is not manifest JSON (a field missing or of the
    /// wrong type, or not JSON at all).
    #[error("invalid manifest {}: {source}", path.display())]
    Parse {
        /// The manifest.
        path: std::path::PathBuf,
        /// What does not parse.
        #[source]
        source: serde_json::Error,
    },
}

/// One snapshot: the remote handle's fields at the top level, the local one under `local`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `filesystem`.
    pub storage_id: String,
    /// The writer's key groups.
    pub key_group_range: Range,
    /// Sum of entry sizes.
    pub state_size: u64,
    /// Bytes uploaded for this snapshot.
    pub incremental_size: u64,
    /// Change sets in order.
    pub entries: Vec<Entry>,
    /// The local copies, if any.
    #[serde(default)]
    pub local: Option<LocalManifest>,
    /// The writer (extra field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
    /// The checkpoint (extra field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<i64>,
    /// First sequence number (extra field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_from: Option<u64>,
    /// End of the sequence range, exclusive (extra field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_to: Option<u64>,
    /// Indexes `[first, end)` of the writer's changes the snapshot holds, for workloads
    /// that can regenerate them (extra field, written by `dstl run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<[u64; 2]>,
}

/// The local handle in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalManifest {
    /// Always `filesystem`.
    pub storage_id: String,
    /// The writer's key groups.
    pub key_group_range: Range,
    /// Sum of entry sizes.
    pub state_size: u64,
    /// Always 0 for local handles.
    pub incremental_size: u64,
    /// Change sets in order.
    pub entries: Vec<Entry>,
}

/// Inclusive key-group range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    /// First key group.
    pub start: i32,
    /// Last key group.
    pub end: i32,
}

/// One change set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Absolute path (local stores) or URL.
    pub path: String,
    /// Logical file length.
    pub file_size: u64,
    /// Logical offset.
    pub offset: u64,
    /// Payload bytes.
    pub size: u64,
}

fn entries(handle: &ChangelogHandle) -> Vec<Entry> {
    handle
        .entries
        .iter()
        .map(|e| Entry {
            path: e.handle.path.clone(),
            file_size: e.handle.file_size,
            offset: e.offset,
            size: e.size,
        })
        .collect()
}

fn range(r: KeyGroupRange) -> Range {
    Range {
        start: r.start,
        end: r.end,
    }
}

fn to_handle(
    range: Range,
    state_size: u64,
    incremental_size: u64,
    entries: &[Entry],
) -> ChangelogHandle {
    ChangelogHandle {
        entries: entries
            .iter()
            .map(|e| HandleEntry {
                handle: StreamHandle {
                    path: e.path.clone(),
                    file_size: e.file_size,
                },
                offset: e.offset,
                size: e.size,
            })
            .collect(),
        key_group_range: KeyGroupRange {
            start: range.start,
            end: range.end,
        },
        state_size,
        incremental_size,
        storage_id: STORAGE_ID.to_string(),
    }
}

impl Manifest {
    /// The manifest of `snapshot`.
    pub fn from_snapshot(snapshot: &SnapshotResult) -> Self {
        let remote = &snapshot.remote;
        Self {
            storage_id: remote.storage_id.clone(),
            key_group_range: range(remote.key_group_range),
            state_size: remote.state_size,
            incremental_size: remote.incremental_size,
            entries: entries(remote),
            local: snapshot.local.as_ref().map(|l| LocalManifest {
                storage_id: l.storage_id.clone(),
                key_group_range: range(l.key_group_range),
                state_size: l.state_size,
                incremental_size: l.incremental_size,
                entries: entries(l),
            }),
            writer: None,
            checkpoint_id: None,
            sequence_from: None,
            sequence_to: None,
            changes: None,
        }
    }

    /// The remote handle.
    pub fn remote_handle(&self) -> ChangelogHandle {
        to_handle(
            self.key_group_range,
            self.state_size,
            self.incremental_size,
            &self.entries,
        )
    }

    /// The local handle, if any.
    pub fn local_handle(&self) -> Option<ChangelogHandle> {
        self.local.as_ref().map(|l| {
            to_handle(
                l.key_group_range,
                l.state_size,
                l.incremental_size,
                &l.entries,
            )
        })
    }

    /// Reads a manifest file.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| ManifestError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Writes the manifest to `path` atomically: a reader sees the old or the new one whole.
    pub fn store(&self, path: &Path) -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&json)?;
            file.write_all(b"\n")?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}
