//! Reading a handle's change sets back from the files it names, without I/O: which files
//! a read needs and from where, the checks on each file's bytes, and the words of every
//! failure. Hosts fetch the bytes (the wasmtime host links this module; the Node host
//! calls it through the writer component's `reader.read-file`), so a damaged or missing
//! file is reported the same way by both.
//!
//! - [`ReadPlan`]: the distinct files of a handle in first-use order, each with the lowest
//!   offset the handle needs (a plain file need not be fetched before it).
//! - [`logical_file`]: a fetched file's logical bytes, checked against the length the
//!   handle recorded.
//! - [`visit_change_set`]: one change set's changes, borrowed from the logical bytes.
//! - [`read_file`]: all of that for one whole file and the offsets a handle names in it,
//!   the changes packed as columns ([`PackedChanges`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Display;

use crate::codec::{self, Change, ChangeSetReader, FormatError};
use crate::types::ChangelogHandle;

/// What is wrong with a changelog file a handle names. Every variant names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// The file could not be fetched: missing (deleted, or a wrong base path),
    /// unreadable, or the object store failed or refused the request.
    #[error("cannot read changelog file {path}: {cause}")]
    Unreadable {
        /// The file.
        path: String,
        /// The host's I/O error, as text.
        cause: String,
    },
    /// The file's bytes do not decode at an offset the handle names: the file is corrupt,
    /// or the handle's offset does not point at a change set.
    #[error("corrupt changelog file {path} at logical offset {offset}: {source}")]
    Corrupt {
        /// The file.
        path: String,
        /// The change set's offset (0 when the file as a whole does not decode).
        offset: u64,
        /// What is wrong.
        #[source]
        source: FormatError,
    },
    /// The file's logical length differs from the one the handle recorded: the file was
    /// truncated, appended to or replaced since the snapshot was taken.
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

impl FileError {
    /// A fetch of `path` that failed with `cause` (a host's own I/O error).
    pub fn unreadable(path: &str, cause: impl Display) -> Self {
        FileError::Unreadable {
            path: path.to_string(),
            cause: cause.to_string(),
        }
    }
}

/// One file a read needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeededFile<'h> {
    /// The file's path, as the handle names it.
    pub path: &'h str,
    /// Its logical length, as the handle recorded it.
    pub logical_size: u64,
    /// The lowest logical offset the handle needs in it.
    pub from: u64,
}

/// The files a handle's read needs, in first-use order, and which of them each entry
/// points into.
#[derive(Debug, Clone)]
pub struct ReadPlan<'h> {
    files: Vec<NeededFile<'h>>,
    /// For each entry of the handle, the index of its file in `files`.
    entry_files: Vec<usize>,
}

impl<'h> ReadPlan<'h> {
    /// Plans the read of `handle`.
    pub fn new(handle: &'h ChangelogHandle) -> Self {
        let mut files: Vec<NeededFile<'h>> = Vec::new();
        let mut index: HashMap<&'h str, usize> = HashMap::new();
        let mut entry_files = Vec::with_capacity(handle.entries.len());
        for entry in &handle.entries {
            let path = entry.handle.path.as_str();
            let i = *index.entry(path).or_insert_with(|| {
                files.push(NeededFile {
                    path,
                    logical_size: entry.handle.file_size,
                    from: entry.offset,
                });
                files.len() - 1
            });
            files[i].from = files[i].from.min(entry.offset);
            entry_files.push(i);
        }
        ReadPlan { files, entry_files }
    }

    /// The distinct files, in the order the handle first names them.
    pub fn files(&self) -> &[NeededFile<'h>] {
        &self.files
    }

    /// The index in [`ReadPlan::files`] of the file the handle's entry `entry` points into.
    pub fn file_of(&self, entry: usize) -> usize {
        self.entry_files[entry]
    }
}

/// The logical bytes of a whole file (flag byte and body) that a handle records as
/// `logical_size` bytes long; a plain file's are borrowed.
pub fn logical_file<'f>(
    path: &str,
    file: &'f [u8],
    logical_size: u64,
) -> Result<Cow<'f, [u8]>, FileError> {
    let logical = codec::logical_bytes(file).map_err(|source| FileError::Corrupt {
        path: path.to_string(),
        offset: 0,
        source,
    })?;
    check_size(path, logical_size, logical.len() as u64)?;
    Ok(logical)
}

/// Fails unless a file's logical length, `actual`, is the `expected` one its handle
/// recorded.
fn check_size(path: &str, expected: u64, actual: u64) -> Result<(), FileError> {
    if actual == expected {
        return Ok(());
    }
    Err(FileError::SizeMismatch {
        path: path.to_string(),
        expected,
        actual,
    })
}

/// Calls `visit` with every change of the change set at logical `offset` of `path`, in
/// order, each value borrowed from `logical` (the file's logical bytes from `start` on;
/// 0 for all of them). Returns the number of changes.
pub fn visit_change_set<'a>(
    path: &str,
    logical: &'a [u8],
    start: u64,
    offset: u64,
    visit: &mut dyn FnMut(i32, &'a [u8]),
) -> Result<u64, FileError> {
    let corrupt = |source| FileError::Corrupt {
        path: path.to_string(),
        offset,
        source,
    };
    let mut reader = ChangeSetReader::in_range(logical, start, offset).map_err(corrupt)?;
    let mut changes = 0;
    while let Some((key_group, value)) = reader.next_borrowed().map_err(corrupt)? {
        visit(key_group, value);
        changes += 1;
    }
    Ok(changes)
}

/// The changes of a [`read_file`], packed as columns (for hosts that copy them out of a
/// sandbox: four copies however many changes): change `i` has key group
/// `key_groups[i]` and the next `lengths[i]` bytes of `data`; the change set of
/// `offsets[j]` holds the next `counts[j]` changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedChanges {
    /// Changes per change set, in the order of the offsets.
    pub counts: Vec<u32>,
    /// Each change's key group.
    pub key_groups: Vec<i32>,
    /// Each change's value length.
    pub lengths: Vec<u32>,
    /// The values, one after another.
    pub data: Vec<u8>,
}

impl PackedChanges {
    /// The changes of each change set, unpacked; `None` if the columns do not add up
    /// (they came from a component that lies).
    pub fn unpack(&self) -> Option<Vec<Vec<Change>>> {
        let changes = self.key_groups.len();
        let counted: u64 = self.counts.iter().map(|&c| u64::from(c)).sum();
        let bytes: u64 = self.lengths.iter().map(|&l| u64::from(l)).sum();
        if counted != changes as u64
            || self.lengths.len() != changes
            || bytes != self.data.len() as u64
        {
            return None;
        }
        let (mut change, mut at) = (0, 0);
        let sets = self.counts.iter().map(|&count| {
            (0..count)
                .map(|_| {
                    let len = self.lengths[change] as usize;
                    let c = Change {
                        key_group: self.key_groups[change],
                        value: self.data[at..at + len].to_vec(),
                    };
                    (change, at) = (change + 1, at + len);
                    c
                })
                .collect()
        });
        Some(sets.collect())
    }
}

/// The changes of the change sets at `offsets` of one file, in the order given: `file`
/// is the fetch's outcome (the whole file, or the host's I/O error), `logical_size` the
/// logical length the handle recorded.
pub fn read_file(
    path: &str,
    file: Result<&[u8], &str>,
    logical_size: u64,
    offsets: &[u64],
) -> Result<PackedChanges, FileError> {
    let file = file.map_err(|cause| FileError::unreadable(path, cause))?;
    let logical = logical_file(path, file, logical_size)?;
    let mut packed = PackedChanges::default();
    for &offset in offsets {
        let count = visit_change_set(path, &logical, 0, offset, &mut |key_group, value| {
            packed.key_groups.push(key_group);
            packed.lengths.push(value.len() as u32);
            packed.data.extend_from_slice(value);
        })?;
        packed.counts.push(count as u32);
    }
    Ok(packed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{HandleEntry, KeyGroupRange, StreamHandle};

    fn handle(entries: &[(&str, u64, u64)]) -> ChangelogHandle {
        ChangelogHandle {
            entries: entries
                .iter()
                .map(|&(path, file_size, offset)| HandleEntry {
                    handle: StreamHandle {
                        path: path.to_string(),
                        file_size,
                    },
                    offset,
                    size: 0,
                })
                .collect(),
            key_group_range: KeyGroupRange { start: 0, end: 0 },
            state_size: 0,
            incremental_size: 0,
            storage_id: String::new(),
        }
    }

    #[test]
    fn plan_lists_files_in_first_use_order_with_their_lowest_offset() {
        let h = handle(&[("a", 30, 20), ("b", 9, 0), ("a", 30, 4), ("a", 30, 25)]);
        let plan = ReadPlan::new(&h);
        let files = plan.files();
        assert_eq!(files.len(), 2);
        assert_eq!(
            (files[0].path, files[0].logical_size, files[0].from),
            ("a", 30, 4)
        );
        assert_eq!((files[1].path, files[1].from), ("b", 0));
        let of: Vec<usize> = (0..4).map(|i| plan.file_of(i)).collect();
        assert_eq!(of, [0, 1, 0, 0]);
    }

    #[test]
    fn read_file_decodes_each_offset_and_names_the_file_in_every_failure() {
        let first = codec::encode_change_set([(1, &b"x"[..]), (-1, &b"meta"[..])]);
        let second = codec::encode_change_set([(2, &b"yz"[..])]);
        let (file, offsets) = codec::encode_file(&[first.clone(), second.clone()], true).unwrap();
        let size = (first.len() + second.len()) as u64;
        let sets = read_file("f", Ok(&file), size, &[offsets[1], offsets[0]])
            .unwrap()
            .unpack()
            .unwrap();
        assert_eq!(sets[0], codec::decode_change_set(&second, 0).unwrap());
        assert_eq!(sets[1][0].key_group, -1);

        let unreadable = read_file("f", Err("No such file"), size, &[0]).unwrap_err();
        assert_eq!(
            unreadable.to_string(),
            "cannot read changelog file f: No such file"
        );
        let short = read_file("f", Ok(&file), size + 1, &[0]).unwrap_err();
        assert_eq!(
            short.to_string(),
            format!(
                "changelog file f has {size} logical bytes but the handle records {}: the file was truncated or replaced",
                size + 1
            )
        );
        let corrupt = read_file("f", Ok(&file), size, &[1]).unwrap_err();
        assert!(
            matches!(corrupt, FileError::Corrupt { offset: 1, .. }),
            "{corrupt:?}"
        );
        assert!(
            corrupt
                .to_string()
                .starts_with("corrupt changelog file f at logical offset 1: "),
            "{corrupt}"
        );
        let empty = read_file("f", Ok(&[]), 0, &[0]).unwrap_err();
        assert_eq!(
            empty.to_string(),
            "corrupt changelog file f at logical offset 0: empty file: no compression flag byte"
        );
    }

    #[test]
    fn columns_that_do_not_add_up_do_not_unpack() {
        let good = PackedChanges {
            counts: vec![1, 0],
            key_groups: vec![4],
            lengths: vec![2],
            data: b"ab".to_vec(),
        };
        assert_eq!(good.unpack().unwrap()[0][0].value, b"ab");
        for lie in [
            PackedChanges {
                data: b"a".to_vec(),
                ..good.clone()
            },
            PackedChanges {
                counts: vec![2],
                ..good.clone()
            },
            PackedChanges {
                lengths: vec![],
                ..good.clone()
            },
            PackedChanges {
                counts: vec![u32::MAX, 1],
                ..good.clone()
            },
        ] {
            assert_eq!(lie.unpack(), None, "{lie:?}");
        }
    }

    #[test]
    fn an_offset_before_a_ranged_read_is_out_of_range() {
        let block = codec::encode_change_set([(3, &b"v"[..])]);
        let mut seen = Vec::new();
        let n = visit_change_set("f", &block, 100, 100, &mut |kg, v| {
            seen.push((kg, v.to_vec()))
        })
        .unwrap();
        assert_eq!((n, seen), (1, vec![(3, b"v".to_vec())]));
        let before = visit_change_set("f", &block, 100, 99, &mut |_, _| {}).unwrap_err();
        assert!(
            matches!(
                before,
                FileError::Corrupt {
                    source: FormatError::OffsetOutOfRange { offset: 99, .. },
                    ..
                }
            ),
            "{before:?}"
        );
    }
}
