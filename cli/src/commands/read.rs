//! `dstl read`: every change of a snapshot, or its digest.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use dstl::manifest::Manifest;

use super::{ConfArgs, DEFAULT_DIR, hex};

pub(super) fn read(path: &Path, digest: bool, local: bool, conf: &ConfArgs) -> anyhow::Result<()> {
    let config = conf.build(DEFAULT_DIR)?;
    let manifest = Manifest::load(path)?;
    let handle = if local {
        manifest
            .local_handle()
            .with_context(|| format!("manifest {} has no local handle", path.display()))?
    } else {
        manifest.remote_handle()
    };
    let files = dstl::FileSource::new(Some(config.s3().clone()));
    let changes = dstl::reader::read_handle(&handle, &files)?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if digest {
        writeln!(
            out,
            "changes={} sha256={}",
            changes.len(),
            dstl::reader::digest(&changes)
        )?;
    } else {
        for change in &changes {
            writeln!(out, "{}\t{}", change.key_group, hex(&change.value))?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Where a reading thread leaves a snapshot's change count and digest.
type Slot = std::sync::Mutex<Option<anyhow::Result<(u64, String)>>>;

/// `dstl read-list`: every snapshot of a handle list, through one [`dstl::Recovery`].
pub(super) fn read_list(path: &Path, conf: &ConfArgs) -> anyhow::Result<()> {
    let config = conf.build(DEFAULT_DIR)?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the handle list {}", path.display()))?;
    let list: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("invalid handle list {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let snapshots = list["snapshots"]
        .as_array()
        .with_context(|| format!("{}: no `snapshots` array", path.display()))?;
    let mut handles = Vec::with_capacity(snapshots.len());
    for (n, snapshot) in snapshots.iter().enumerate() {
        let name = snapshot["name"].as_str().unwrap_or("").to_string();
        let what = |field: &str| format!("{}: snapshot {n} ({name}): {field}", path.display());
        let range = &snapshot["keyGroupRange"];
        let key_groups = dstl::KeyGroupRange {
            start: range[0].as_i64().unwrap_or(0) as i32,
            end: range[1].as_i64().unwrap_or(32767) as i32,
        };
        let mut entries = Vec::new();
        for handle in snapshot["handles"]
            .as_array()
            .with_context(|| what("no `handles` array"))?
        {
            let file = handle["path"]
                .as_str()
                .with_context(|| what("a handle without `path`"))?;
            let file = if file.contains("://") || Path::new(file).is_absolute() {
                file.to_string()
            } else {
                base.join(file).to_string_lossy().into_owned()
            };
            entries.push(dstl::HandleEntry {
                handle: dstl::StreamHandle {
                    path: file,
                    file_size: handle["fileSize"]
                        .as_u64()
                        .with_context(|| what("a handle without `fileSize`"))?,
                },
                offset: handle["offset"]
                    .as_u64()
                    .with_context(|| what("a handle without `offset`"))?,
                size: 0,
            });
        }
        let handle = dstl::ChangelogHandle {
            entries,
            key_group_range: key_groups,
            state_size: 0,
            incremental_size: 0,
            storage_id: "filesystem".into(),
        };
        handles.push((name, handle));
    }
    // Snapshots are read on every core at once; the recovery cache lets them share files.
    let recovery = dstl::Recovery::new(&config);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Slot> = handles.iter().map(|_| Default::default()).collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads.min(handles.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((name, handle)) = handles.get(i) else {
                        return;
                    };
                    let mut digest = dstl::reader::Digest::default();
                    let read = recovery
                        .visit(handle, &mut |key_group, value| {
                            digest.update(key_group, value)
                        })
                        .with_context(|| {
                            format!("{}: snapshot {i} ({name}): cannot read it", path.display())
                        })
                        .map(|()| digest.finish());
                    *results[i].lock().unwrap() = Some(read);
                }
            });
        }
    });
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for ((name, _), result) in handles.iter().zip(results) {
        let (changes, sha256) = result
            .into_inner()
            .unwrap()
            .expect("every snapshot was read")?;
        writeln!(out, "{name}\t{changes}\t{sha256}")?;
    }
    out.flush()?;
    Ok(())
}
