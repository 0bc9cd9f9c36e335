//! The recovery benchmark: several writers write many checkpoints into shared,
//! compressed files; then every checkpoint is read back, as a restarting job reads its
//! operators' state. Snapshots are cumulative (each persists from sequence number 0 and
//! nothing is truncated), so every handle points into many files that other handles and
//! other writers share: the case where reading each `(file, offset)` pair on its own, as
//! Flink's reader does, decompresses the same files over and over.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use super::input::{Changes, PlacedBatch, Pool};
use dstl::recovery::reader::{digest, read_handle};
use dstl::store::FileSource;
use dstl::{ChangelogHandle, ChangelogStorage, KeyGroupRange};

/// What the recovery benchmark writes.
#[derive(Debug, Clone)]
pub struct RecoveryWorkload {
    /// Writers sharing the storage.
    pub writers: usize,
    /// Changes per writer.
    pub changes: u64,
    /// Bytes per change.
    pub change_size: usize,
    /// Appends per writer between checkpoints.
    pub checkpoint_every: u64,
    /// Seed of the input pool.
    pub seed: u64,
}

impl RecoveryWorkload {
    /// The standard recovery workload: 8 writers × 50,000 changes of 100 B, a checkpoint
    /// every 2,500 appends per writer (160 snapshots, each over up to 20 change sets).
    pub fn standard() -> Self {
        Self {
            writers: 8,
            changes: 50_000,
            change_size: 100,
            checkpoint_every: 2_500,
            seed: 42,
        }
    }
}

/// One snapshot written: its handle and what reading it must give.
#[derive(Debug, Clone)]
pub struct WrittenSnapshot {
    /// `op-<writer>-cp<checkpoint>`.
    pub name: String,
    /// The handle.
    pub handle: ChangelogHandle,
    /// Changes it holds.
    pub changes: usize,
    /// Their digest (as `dstl read --digest`).
    pub sha256: String,
}

/// What the recovery benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct RecoverySummary {
    /// Snapshots read back.
    pub snapshots: usize,
    /// `(file, offset)` pairs over all snapshots.
    pub pairs: usize,
    /// Distinct files they point into.
    pub files: usize,
    /// Changes read back over all snapshots.
    pub changes: u64,
    /// Seconds to write (not part of the comparison).
    pub write_s: f64,
    /// Seconds to read every snapshot with the recovery cache.
    pub read_s: f64,
    /// Seconds to read every snapshot without it (each file once per handle).
    pub read_uncached_s: f64,
    /// Reads the cache served, and files it loaded.
    pub cache_hits: u64,
    /// Files the cache loaded.
    pub cache_misses: u64,
    /// Every snapshot read back exactly what was appended.
    pub verified: bool,
}

/// Writes the recovery workload into `storage` and returns every snapshot.
pub fn write(
    storage: &ChangelogStorage,
    workload: &RecoveryWorkload,
) -> anyhow::Result<Vec<WrittenSnapshot>> {
    if workload.writers == 0 || workload.checkpoint_every == 0 {
        bail!("the recovery workload needs writers and a checkpoint interval");
    }
    let pool = Pool::new(workload.seed, workload.change_size);
    let per_writer = super::on_threads(workload.writers, |index| {
        write_one(storage, workload, &pool, index)
    });
    let mut snapshots = Vec::new();
    for written in per_writer {
        snapshots.extend(written?);
    }
    storage.wait_idle();
    Ok(snapshots)
}

fn write_one(
    storage: &ChangelogStorage,
    workload: &RecoveryWorkload,
    pool: &Pool,
    index: usize,
) -> anyhow::Result<Vec<WrittenSnapshot>> {
    let key_groups = 128;
    let writer = storage.create_writer(
        &format!("op-{index}"),
        KeyGroupRange {
            start: 0,
            end: key_groups - 1,
        },
    )?;
    let source = Changes::new(pool, index, key_groups, workload.change_size);
    let mut snapshots = Vec::new();
    let mut appended: Vec<(i32, Vec<u8>)> = Vec::new();
    let mut batch = PlacedBatch::default();
    let mut done = 0;
    let mut checkpoint = 0i64;
    while done < workload.changes {
        let n = workload.checkpoint_every.min(workload.changes - done);
        appended.extend((done..done + n).map(|i| source.change(i)));
        batch.append(&source, done..done + n, &writer)?;
        done += n;
        checkpoint += 1;
        let to = writer.next_sequence_number()?;
        let snapshot = writer.persist(0, checkpoint)?.wait()?;
        writer.confirm(0, to, checkpoint)?;
        // What reading the snapshot must give: the changes so far, change set by change
        // set. Each set was appended as one batch, which the writer keeps key group by key
        // group (metadata first).
        let mut expected = Vec::new();
        for set in appended.chunks(workload.checkpoint_every as usize) {
            let mut set: Vec<&(i32, Vec<u8>)> = set.iter().collect();
            set.sort_by_key(|(key_group, _)| *key_group);
            expected.extend(set.into_iter().map(|(k, v)| dstl::Change {
                key_group: *k,
                value: v.clone(),
            }));
        }
        snapshots.push(WrittenSnapshot {
            name: format!("op-{index}-cp{checkpoint}"),
            handle: snapshot.remote,
            changes: expected.len(),
            sha256: digest(&expected),
        });
    }
    writer.close()?;
    Ok(snapshots)
}

/// Reads every snapshot back, with the recovery cache and without, and checks each.
pub fn read_back(
    storage: &ChangelogStorage,
    snapshots: &[WrittenSnapshot],
    write_time: Duration,
) -> anyhow::Result<RecoverySummary> {
    let mut verified = true;
    let mut changes = 0u64;
    let recovery = storage.recovery();
    let started = Instant::now();
    for snapshot in snapshots {
        let read = recovery
            .read(&snapshot.handle)
            .with_context(|| format!("reading {}", snapshot.name))?;
        changes += read.len() as u64;
        verified &= read.len() == snapshot.changes && digest(&read) == snapshot.sha256;
    }
    let read_s = started.elapsed().as_secs_f64();
    let (cache_hits, cache_misses) = recovery
        .cache()
        .map(|c| c.hits_and_misses())
        .unwrap_or_default();
    let files = FileSource::new(Some(storage.config().s3().clone()));
    let started = Instant::now();
    for snapshot in snapshots {
        let read = read_handle(&snapshot.handle, &files)?;
        verified &= digest(&read) == snapshot.sha256;
    }
    let read_uncached_s = started.elapsed().as_secs_f64();
    let distinct: std::collections::HashSet<&str> = snapshots
        .iter()
        .flat_map(|s| s.handle.entries.iter().map(|e| e.handle.path.as_str()))
        .collect();
    Ok(RecoverySummary {
        snapshots: snapshots.len(),
        pairs: snapshots.iter().map(|s| s.handle.entries.len()).sum(),
        files: distinct.len(),
        changes,
        write_s: write_time.as_secs_f64(),
        read_s,
        read_uncached_s,
        cache_hits,
        cache_misses,
        verified,
    })
}

/// Writes the snapshots as a handle list Flink's harness reads (`run.sh read FILE`):
/// `{"snapshots": [{"name", "keyGroupRange", "handles": [{"path", "offset", "fileSize"}],
/// "expectedCount", "expectedTotalSha256"}]}`.
pub fn write_handle_list(snapshots: &[WrittenSnapshot], path: &Path) -> anyhow::Result<()> {
    let list: Vec<serde_json::Value> = snapshots
        .iter()
        .map(|s| {
            serde_json::json!({
                "name": s.name,
                "keyGroupRange": [s.handle.key_group_range.start, s.handle.key_group_range.end],
                "handles": s.handle.entries.iter().map(|e| serde_json::json!({
                    "path": e.handle.path,
                    "offset": e.offset,
                    "fileSize": e.handle.file_size,
                })).collect::<Vec<_>>(),
                "expectedCount": s.changes,
                "expectedTotalSha256": s.sha256,
            })
        })
        .collect();
    let text = serde_json::to_string_pretty(&serde_json::json!({ "snapshots": list }))?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
