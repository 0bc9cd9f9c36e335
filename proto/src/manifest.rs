//! The manifest JSON of one snapshot: the only place that knows it. Other tools read it
//! (README.md, "Manifest"), `dstl gc` keeps the files it names, and both hosts write it:
//! the wasmtime host links this module, the Node host calls it through the rules
//! component (WIT interface `records`). Reading and writing the file is the hosts' part.
//!
//! The remote handle's fields are at the top level, the local one's under `local`; the
//! extra fields (`writer`, `checkpoint_id`, `sequence_from`, `sequence_to`, `changes`)
//! are written only when set.

use serde::{Deserialize, Serialize};

use crate::types::{
    ChangelogHandle, HandleEntry, KeyGroupRange, STORAGE_ID, SnapshotResult, StreamHandle,
};

/// Why a text is not a manifest: not JSON, or a field missing or of the wrong type
/// (serde's message names the field, line and column).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ManifestParseError(#[from] serde_json::Error);

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
    /// The manifest of `snapshot`, without extra fields.
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

    /// The manifest as its file holds it: indented JSON ending in a newline.
    pub fn to_json(&self) -> String {
        // Serializing plain structs of strings and integers cannot fail.
        let mut json = serde_json::to_string_pretty(self).expect("a manifest serializes");
        json.push('\n');
        json
    }

    /// Parses a manifest file's text.
    pub fn parse(text: &str) -> Result<Self, ManifestParseError> {
        Ok(serde_json::from_str(text)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(path: &str, incremental_size: u64) -> ChangelogHandle {
        ChangelogHandle {
            entries: vec![HandleEntry {
                handle: StreamHandle {
                    path: path.to_string(),
                    file_size: 120,
                },
                offset: 1,
                size: 119,
            }],
            key_group_range: KeyGroupRange { start: 0, end: 127 },
            state_size: 119,
            incremental_size,
            storage_id: STORAGE_ID.to_string(),
        }
    }

    #[test]
    fn a_manifest_reads_back_as_the_handles_it_was_made_from() {
        let snapshot = SnapshotResult {
            remote: handle("/data/job/dstl/a", 119),
            local: Some(handle("/local/a", 0)),
        };
        let mut manifest = Manifest::from_snapshot(&snapshot);
        manifest.writer = Some("op-1".into());
        manifest.changes = Some([0, 10]);
        let json = manifest.to_json();
        assert!(json.ends_with("}\n"), "{json}");
        let back = Manifest::parse(&json).unwrap();
        assert_eq!(back, manifest);
        assert_eq!(back.remote_handle(), snapshot.remote);
        assert_eq!(back.local_handle(), snapshot.local);
    }

    #[test]
    fn extra_fields_are_written_only_when_set() {
        let snapshot = SnapshotResult {
            remote: handle("/a", 119),
            local: None,
        };
        let json = Manifest::from_snapshot(&snapshot).to_json();
        for extra in [
            "writer",
            "checkpoint_id",
            "sequence_from",
            "sequence_to",
            "changes",
        ] {
            assert!(!json.contains(extra), "{extra} in {json}");
        }
        assert!(json.contains("\"local\": null"), "{json}");
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let err = Manifest::parse(
            r#"{"storage_id":"filesystem","key_group_range":{"start":0,"end":1},
                "state_size":"big","incremental_size":0,"entries":[]}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("invalid type"), "{err}");
        let err = Manifest::parse(r#"{"storage_id":"filesystem"}"#).unwrap_err();
        assert!(err.to_string().contains("key_group_range"), "{err}");
    }
}
