//! The golden files that Apache Flink 2.3.0 wrote (`tests/golden/`, see its README) as
//! plain Rust values: every set, its files and snapshots, and the expected changes.

use std::path::{Path, PathBuf};

use dstl::{ChangelogHandle, HandleEntry, KeyGroupRange, StreamHandle};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The golden sets, each in its own directory under [`golden_dir`].
pub const GOLDEN_SETS: [&str; 3] = ["plain", "snappy", "snappy-large"];

/// `tests/golden`, the files Apache Flink 2.3.0 wrote, kept in the repository. Panics with
/// a clear message if it is missing, so a broken checkout is never mistaken for a passing
/// test.
pub fn golden_dir() -> PathBuf {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/golden"));
    assert!(
        dir.join("README.md").is_file(),
        "golden files not found at {}: the checkout is incomplete",
        dir.display()
    );
    dir
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The golden digest, computed here independently of `dstl::reader::digest`: for every
/// change, 4-byte big-endian key group, 4-byte big-endian value length, then the value.
pub fn golden_digest<'a>(changes: impl IntoIterator<Item = (i32, &'a [u8])>) -> String {
    let mut hasher = Sha256::new();
    for (key_group, value) in changes {
        hasher.update(key_group.to_be_bytes());
        hasher.update((value.len() as u32).to_be_bytes());
        hasher.update(value);
    }
    hex(&hasher.finalize())
}

/// How a set's `.expected` files spell one change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedFormat {
    /// `KEYGROUP<TAB>HEX`.
    Hex,
    /// `KEYGROUP<TAB>LENGTH<TAB>SHA256(value)` (large values).
    Digest,
}

impl ExpectedFormat {
    /// The `.expected` line of one change.
    pub fn line(self, key_group: i32, value: &[u8]) -> String {
        match self {
            ExpectedFormat::Hex => format!("{key_group}\t{}", hex(value)),
            ExpectedFormat::Digest => {
                format!("{key_group}\t{}\t{}", value.len(), sha256_hex(value))
            }
        }
    }
}

/// One handle entry of a golden snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoldenHandle {
    /// The file, absolute (set directory joined with the manifest's relative path).
    pub path: PathBuf,
    /// The manifest's relative path.
    pub relative: String,
    /// Logical offset of the change set.
    pub offset: u64,
    /// Logical length of the file.
    pub file_size: u64,
}

/// One snapshot of a golden set.
#[derive(Debug, Clone)]
pub struct GoldenSnapshot {
    /// E.g. `w0-cp2`.
    pub name: String,
    /// The writer (index into the set's writers).
    pub writer: u64,
    /// First sequence number the snapshot covers.
    pub sqn_from: u64,
    /// End of its sequence range, exclusive.
    pub sqn_to: u64,
    /// Inclusive key-group range.
    pub key_group_range: (i32, i32),
    /// Change sets in order.
    pub handles: Vec<GoldenHandle>,
    /// Number of changes the snapshot holds.
    pub expected_count: usize,
    /// `expectedTotalSha256`.
    pub expected_sha256: String,
    /// The `.expected` file.
    pub expected_file: PathBuf,
    /// The `.handles` file.
    pub handles_file: PathBuf,
}

impl GoldenSnapshot {
    /// The snapshot as a handle the host reads (entry sizes are 0: readers ignore them).
    pub fn handle(&self) -> ChangelogHandle {
        ChangelogHandle {
            entries: self
                .handles
                .iter()
                .map(|h| HandleEntry {
                    handle: StreamHandle {
                        path: h.path.to_str().expect("UTF-8 path").to_string(),
                        file_size: h.file_size,
                    },
                    offset: h.offset,
                    size: 0,
                })
                .collect(),
            key_group_range: KeyGroupRange {
                start: self.key_group_range.0,
                end: self.key_group_range.1,
            },
            state_size: 0,
            incremental_size: 0,
            storage_id: "filesystem".to_string(),
        }
    }

    /// The lines of the `.expected` file.
    pub fn expected_lines(&self) -> Vec<String> {
        read_text(&self.expected_file)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// One file of a golden set, as the manifest's `files` lists it.
#[derive(Debug, Clone)]
pub struct GoldenFile {
    /// Absolute path.
    pub path: PathBuf,
    /// The manifest's relative path.
    pub relative: String,
    /// Size on disk.
    pub size: u64,
    /// SHA-256 of the bytes on disk.
    pub sha256: String,
}

/// One golden set (`plain`, `snappy`, `snappy-large`).
#[derive(Debug, Clone)]
pub struct GoldenSet {
    /// The set's name.
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
    /// `params.compression`.
    pub compression: bool,
    /// How its `.expected` files spell changes.
    pub format: ExpectedFormat,
    /// Every changelog file.
    pub files: Vec<GoldenFile>,
    /// Every snapshot, in manifest order.
    pub snapshots: Vec<GoldenSnapshot>,
    /// `appendsFile`, relative to the set.
    pub appends_file: String,
}

fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn field<'a>(value: &'a Value, key: &str, context: &str) -> &'a Value {
    value
        .get(key)
        .unwrap_or_else(|| panic!("{context}: missing field `{key}`"))
}

fn as_u64(value: &Value, key: &str, context: &str) -> u64 {
    field(value, key, context)
        .as_u64()
        .unwrap_or_else(|| panic!("{context}: `{key}` is not an unsigned integer"))
}

fn as_str<'a>(value: &'a Value, key: &str, context: &str) -> &'a str {
    field(value, key, context)
        .as_str()
        .unwrap_or_else(|| panic!("{context}: `{key}` is not a string"))
}

fn as_array<'a>(value: &'a Value, key: &str, context: &str) -> &'a [Value] {
    field(value, key, context)
        .as_array()
        .unwrap_or_else(|| panic!("{context}: `{key}` is not an array"))
}

/// The objects of `value`'s array `key` (the set's files, a snapshot's handles), each with
/// its `path`, relative to the set's `dir`, as an absolute path and as the manifest spells it.
fn entries<'a>(
    value: &'a Value,
    key: &str,
    dir: &Path,
    context: &str,
) -> impl Iterator<Item = (&'a Value, PathBuf, String)> {
    as_array(value, key, context).iter().map(move |entry| {
        let relative = as_str(entry, "path", context).to_string();
        (entry, dir.join(&relative), relative)
    })
}

impl GoldenSet {
    /// Loads `golden/<name>/manifest.json`.
    pub fn load(name: &str) -> Self {
        let dir = golden_dir().join(name);
        let manifest_path = dir.join("manifest.json");
        let manifest: Value = serde_json::from_str(&read_text(&manifest_path))
            .unwrap_or_else(|e| panic!("invalid JSON in {}: {e}", manifest_path.display()));
        let ctx = manifest_path.display().to_string();
        let params = field(&manifest, "params", &ctx);
        let compression = field(params, "compression", &ctx)
            .as_bool()
            .expect("params.compression is a boolean");
        let format = match as_str(&manifest, "expectedFormat", &ctx) {
            "hex" => ExpectedFormat::Hex,
            "digest" => ExpectedFormat::Digest,
            other => panic!("{ctx}: unknown expectedFormat {other:?}"),
        };
        let files = entries(&manifest, "files", &dir, &ctx)
            .map(|(f, path, relative)| GoldenFile {
                path,
                relative,
                size: as_u64(f, "size", &ctx),
                sha256: as_str(f, "sha256", &ctx).to_string(),
            })
            .collect();
        let snapshots = as_array(&manifest, "snapshots", &ctx)
            .iter()
            .map(|s| {
                let name = as_str(s, "name", &ctx).to_string();
                let ctx = format!("{ctx} snapshot {name}");
                let range = as_array(s, "keyGroupRange", &ctx);
                assert_eq!(range.len(), 2, "{ctx}: keyGroupRange has two ends");
                let end = |i: usize| range[i].as_i64().expect("key group") as i32;
                let handles = entries(s, "handles", &dir, &ctx)
                    .map(|(h, path, relative)| GoldenHandle {
                        path,
                        relative,
                        offset: as_u64(h, "offset", &ctx),
                        file_size: as_u64(h, "fileSize", &ctx),
                    })
                    .collect();
                GoldenSnapshot {
                    writer: as_u64(s, "writer", &ctx),
                    sqn_from: as_u64(s, "sqnFrom", &ctx),
                    sqn_to: as_u64(s, "sqnTo", &ctx),
                    key_group_range: (end(0), end(1)),
                    handles,
                    expected_count: as_u64(s, "expectedCount", &ctx) as usize,
                    expected_sha256: as_str(s, "expectedTotalSha256", &ctx).to_string(),
                    expected_file: dir.join(as_str(s, "expectedFile", &ctx)),
                    handles_file: dir.join(as_str(s, "handlesFile", &ctx)),
                    name,
                }
            })
            .collect();
        Self {
            name: name.to_string(),
            compression,
            format,
            files,
            snapshots,
            appends_file: as_str(&manifest, "appendsFile", &ctx).to_string(),
            dir,
        }
    }

    /// Every golden set.
    pub fn all() -> Vec<Self> {
        GOLDEN_SETS.iter().map(|name| Self::load(name)).collect()
    }

    /// The logical length the snapshots record for `file` (they must agree), if any
    /// snapshot refers to it.
    pub fn recorded_file_size(&self, file: &Path) -> Option<u64> {
        let mut sizes: Vec<u64> = self
            .snapshots
            .iter()
            .flat_map(|s| &s.handles)
            .filter(|h| h.path == file)
            .map(|h| h.file_size)
            .collect();
        sizes.dedup();
        assert!(
            sizes.len() <= 1,
            "{}: handles disagree on the logical size of {}: {sizes:?}",
            self.name,
            file.display()
        );
        sizes.first().copied()
    }
}

/// A parsed `snapshots/NAME.handles` text file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlesFile {
    /// `snapshot NAME`.
    pub name: String,
    /// `keygroups START END`.
    pub key_group_range: (i32, i32),
    /// `handle PATH OFFSET FILE_SIZE`, the path resolved against the file's directory.
    pub handles: Vec<(PathBuf, u64, u64)>,
}

/// Parses a `.handles` file; unknown directives fail the test.
pub fn parse_handles_file(path: &Path) -> HandlesFile {
    let base = path.parent().expect("a .handles file lies in a directory");
    let mut name = None;
    let mut range = None;
    let mut handles = Vec::new();
    for (n, line) in read_text(path).lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let at = format!("{}:{}: cannot parse {line:?}", path.display(), n + 1);
        fn num<T: std::str::FromStr>(text: &str, at: &str) -> T {
            text.parse().unwrap_or_else(|_| panic!("{at}"))
        }
        match fields.as_slice() {
            ["snapshot", value] => name = Some(value.to_string()),
            ["keygroups", start, end] => range = Some((num(start, &at), num(end, &at))),
            ["handle", file, offset, size] => {
                handles.push((base.join(file), num(offset, &at), num(size, &at)))
            }
            _ => panic!("{at}"),
        }
    }
    HandlesFile {
        name: name.unwrap_or_else(|| panic!("{}: no `snapshot` line", path.display())),
        key_group_range: range.unwrap_or_else(|| panic!("{}: no `keygroups` line", path.display())),
        handles,
    }
}

/// Resolves `..` and symlinks so paths built two ways compare equal.
pub fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|e| panic!("cannot resolve {}: {e}", path.display()))
}

/// Copies a golden set's directory tree into `to` (files become writable there) and
/// returns the set with its paths moved there.
pub fn copy_set(set: &GoldenSet, to: &Path) -> GoldenSet {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::write(&target, std::fs::read(entry.path()).unwrap()).unwrap();
            }
        }
    }
    copy_dir(&set.dir, to);
    let moved = |p: &Path| to.join(p.strip_prefix(&set.dir).unwrap());
    let mut copy = set.clone();
    copy.dir = to.to_path_buf();
    for file in &mut copy.files {
        file.path = moved(&file.path);
    }
    for snapshot in &mut copy.snapshots {
        snapshot.expected_file = moved(&snapshot.expected_file);
        snapshot.handles_file = moved(&snapshot.handles_file);
        for handle in &mut snapshot.handles {
            handle.path = moved(&handle.path);
        }
    }
    copy
}
