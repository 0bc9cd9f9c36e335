//! `dstl read`: every change of a snapshot, or its digest.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use dstl::manifest::{Manifest, ManifestFile};

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

/// One snapshot to read: its name in the output, where it came from (for errors) and
/// its handle.
struct Snapshot {
    name: String,
    origin: String,
    handle: dstl::ChangelogHandle,
}

/// `dstl read-list`: every snapshot of handle lists and manifests, through one
/// [`dstl::Recovery`]. Each input is a file, a handle list or a manifest told apart by
/// its top-level field, or a directory of such files.
pub(super) fn read_list(inputs: &[PathBuf], conf: &ConfArgs) -> anyhow::Result<()> {
    let config = conf.build(DEFAULT_DIR)?;
    let mut snapshots = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(input)
                .and_then(|entries| entries.map(|e| e.map(|e| e.path())).collect())
                .with_context(|| format!("cannot read the directory {}", input.display()))?;
            // A manifest being rewritten is `<writer>.json.tmp` until it is whole.
            files.retain(|path| path.extension().is_some_and(|e| e == "json") && path.is_file());
            if files.is_empty() {
                anyhow::bail!(
                    "{} holds no manifest or handle list (no *.json file)",
                    input.display()
                );
            }
            files.sort();
            for file in files {
                load(&file, &mut snapshots)?;
            }
        } else {
            load(input, &mut snapshots)?;
        }
    }
    // Snapshots are read on every core at once; the recovery cache lets them share files.
    let recovery = dstl::Recovery::new(&config);
    let read = |snapshot: &Snapshot| {
        let mut digest = dstl::reader::Digest::default();
        recovery
            .visit(&snapshot.handle, &mut |key_group, value| {
                digest.update(key_group, value)
            })
            .with_context(|| format!("{}: cannot read it", snapshot.origin))
            .map(|()| digest.finish())
    };
    // Each thread takes the next snapshot nobody has taken, until none is left.
    let next = AtomicUsize::new(0);
    let take = || {
        let i = next.fetch_add(1, Ordering::Relaxed);
        snapshots.get(i).map(|snapshot| (i, read(snapshot)))
    };
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut results: Vec<_> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.min(snapshots.len()))
            .map(|_| scope.spawn(|| std::iter::from_fn(&take).collect::<Vec<_>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for (snapshot, (_, result)) in snapshots.iter().zip(results) {
        let (changes, sha256) = result?;
        writeln!(out, "{}\t{changes}\t{sha256}", snapshot.name)?;
    }
    out.flush()?;
    Ok(())
}

/// Adds the snapshots of one file: a handle list (an object with `snapshots`) or a dstl
/// manifest (an object with `entries`).
fn load(path: &Path, snapshots: &mut Vec<Snapshot>) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let neither = "neither a handle list (a JSON object with `snapshots`) nor a dstl manifest (a JSON object with `entries`)";
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is {neither}: it is not JSON", path.display()))?;
    if value.get("snapshots").is_some() {
        return load_handle_list(path, &value, snapshots);
    }
    if value.get("entries").is_none() {
        anyhow::bail!("{} is {neither}", path.display());
    }
    let manifest: Manifest = serde_json::from_value(value)
        .with_context(|| format!("invalid manifest {}", path.display()))?;
    let name = manifest.writer.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    });
    snapshots.push(Snapshot {
        origin: format!("manifest {} ({name})", path.display()),
        name,
        handle: manifest.remote_handle(),
    });
    Ok(())
}

/// The snapshots of a handle list in the Flink harness's format (`{"snapshots": [{"name",
/// "keyGroupRange", "handles": [{"path", "offset", "fileSize"}]}]}`); relative paths are
/// relative to the list's directory.
fn load_handle_list(
    path: &Path,
    list: &serde_json::Value,
    snapshots: &mut Vec<Snapshot>,
) -> anyhow::Result<()> {
    let base = path.parent().unwrap_or(Path::new("."));
    let listed = list["snapshots"]
        .as_array()
        .with_context(|| format!("{}: `snapshots` is not an array", path.display()))?;
    for (n, snapshot) in listed.iter().enumerate() {
        let name = snapshot["name"].as_str().unwrap_or("").to_string();
        let origin = format!("{}: snapshot {n} ({name})", path.display());
        let what = |field: &str| format!("{origin}: {field}");
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
        snapshots.push(Snapshot {
            name,
            origin,
            handle,
        });
    }
    Ok(())
}
