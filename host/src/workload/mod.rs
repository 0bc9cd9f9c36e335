//! The checkpointing workload behind `dstl run`: simulated operators append seeded
//! changes and checkpoint (next-sequence-number, persist, confirm, truncate); at the end
//! the last checkpoint of every writer is read back and checked against what was
//! appended.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

mod density;
mod input;
mod measure;

pub use density::{Density, density};
use input::Changes;
pub use measure::{current_rss_mb, disk_baseline_mb_per_s, peak_rss_mb};

use crate::recovery::manifest::Manifest;
use crate::{ChangelogStorage, KeyGroupRange, MetricsSnapshot, SnapshotResult};

/// What to run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Simulated operators, one writer and one thread each.
    pub writers: usize,
    /// Changes in total, split evenly across writers.
    pub changes: u64,
    /// Bytes per change.
    pub change_size: usize,
    /// Key groups per writer (`0..key_groups`).
    pub key_groups: i32,
    /// Appends per writer between checkpoints.
    pub checkpoint_every: u64,
    /// Seed of the change bytes.
    pub seed: u64,
    /// Where to (re)write each writer's latest manifest.
    pub manifests: Option<PathBuf>,
}

impl Workload {
    /// Checks the parameters, naming the bad one.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.writers == 0 || self.writers > 10_000 {
            bail!("--writers {} must be between 1 and 10000", self.writers);
        }
        if self.key_groups <= 0 || self.key_groups > 32_768 {
            bail!(
                "--key-groups {} must be between 1 and 32768",
                self.key_groups
            );
        }
        if self.checkpoint_every == 0 {
            bail!("--checkpoint-every must be at least 1");
        }
        if self.change_size > 64 << 20 {
            bail!("--change-size {} exceeds 64 MiB", self.change_size);
        }
        Ok(())
    }
}

/// What a run did, as printed by `dstl run --json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Writers.
    pub writers: usize,
    /// Changes appended.
    pub changes: u64,
    /// Payload bytes appended.
    pub payload_bytes: u64,
    /// Checkpoints completed (all writers).
    pub checkpoints: u64,
    /// Changelog files written.
    pub files: u64,
    /// Bytes written to the store.
    pub bytes_written: u64,
    /// Wall time of the workload.
    pub wall_s: f64,
    /// Appends per second.
    pub appends_per_s: f64,
    /// Payload megabytes (10^6) per second.
    pub payload_mb_per_s: f64,
    /// Median persist latency.
    pub persist_p50_ms: f64,
    /// 99th percentile persist latency.
    pub persist_p99_ms: f64,
    /// Peak resident set size of the process.
    pub peak_rss_mb: f64,
    /// Whether every writer's last checkpoint read back exactly.
    pub verified: bool,
    /// Where the files went.
    pub dir: String,
    /// Upload counters.
    pub metrics: MetricsSnapshot,
}

/// What one writer did.
struct WriterOutcome {
    latencies: Vec<Duration>,
    checkpoints: u64,
    /// The last confirmed checkpoint and the change indexes `[from, to)` it holds.
    last: Option<(SnapshotResult, u64, u64)>,
}

/// Runs `workload` against `storage`, calling `progress` with the number of changes
/// appended so far (from any thread).
pub fn run(
    storage: &ChangelogStorage,
    workload: &Workload,
    progress: &(dyn Fn(u64) + Sync),
) -> anyhow::Result<Summary> {
    workload.validate()?;
    if let Some(dir) = &workload.manifests {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the manifest directory {}", dir.display()))?;
    }
    let appended = AtomicU64::new(0);
    let share = |index: usize| {
        workload.changes / workload.writers as u64
            + u64::from((index as u64) < workload.changes % workload.writers as u64)
    };
    let started = Instant::now();
    let outcomes: Vec<anyhow::Result<WriterOutcome>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workload.writers)
            .map(|index| {
                let appended = &appended;
                scope.spawn(move || {
                    run_writer(storage, workload, index, share(index), &|n| {
                        progress(appended.fetch_add(n, Ordering::Relaxed) + n)
                    })
                    .with_context(|| format!("writer op-{index}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("writer thread panicked")))
            })
            .collect()
    });
    storage.wait_idle();
    let wall = started.elapsed();
    let mut latencies = Vec::new();
    let mut checkpoints = 0;
    let mut verified = true;
    for (index, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome?;
        latencies.extend(outcome.latencies);
        checkpoints += outcome.checkpoints;
        match outcome.last {
            Some((snapshot, from, to)) => verify(storage, workload, index, &snapshot, from, to)?,
            None => verified &= share(index) == 0,
        }
    }
    latencies.sort();
    let percentile = |p: f64| {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1e3
    };
    let metrics = storage.metrics();
    let payload_bytes = workload.changes * workload.change_size as u64;
    Ok(Summary {
        writers: workload.writers,
        changes: workload.changes,
        payload_bytes,
        checkpoints,
        files: metrics.uploaded_files,
        bytes_written: metrics.written_bytes,
        wall_s: wall.as_secs_f64(),
        appends_per_s: workload.changes as f64 / wall.as_secs_f64(),
        payload_mb_per_s: payload_bytes as f64 / 1e6 / wall.as_secs_f64(),
        persist_p50_ms: percentile(0.50),
        persist_p99_ms: percentile(0.99),
        peak_rss_mb: peak_rss_mb(),
        verified,
        dir: storage.config().job_dir().display().to_string(),
        metrics,
    })
}

/// Appends per batch call: large enough to amortize the call into the sandbox.
const BATCH: u64 = 512;

/// Checkpoints whose persist may still be running while the operator appends on.
const OUTSTANDING_CHECKPOINTS: usize = 2;

/// Changes as packed columns, the shape `append_batch` takes.
#[derive(Default)]
struct PackedBatch {
    key_groups: Vec<i32>,
    lengths: Vec<u32>,
    data: Vec<u8>,
}

impl PackedBatch {
    fn clear(&mut self) {
        self.key_groups.clear();
        self.lengths.clear();
        self.data.clear();
    }
}

/// A persist in flight, confirmed (as a checkpoint coordinator would) when it completes.
struct Pending {
    future: crate::PersistFuture,
    started: Instant,
    checkpoint: i64,
    from: u64,
    to: u64,
    /// Where to truncate once confirmed: the next checkpoint's `from`.
    truncate_to: u64,
    /// Change indexes `[first, last)` the snapshot holds.
    changes: (u64, u64),
}

/// One operator: appends and triggers checkpoints on its own thread, like a task thread;
/// a second thread confirms checkpoints as their persists complete, like the checkpoint
/// coordinator, so appending never waits for an upload unless
/// [`OUTSTANDING_CHECKPOINTS`] are in flight.
///
/// Checkpoint `k` persists from the end of checkpoint `k - 2` (a materialization that
/// lags one checkpoint), and confirming it truncates up to the end of `k - 1`, which
/// checkpoint `k` holds and which is where checkpoint `k + 1` starts. So ranges do not
/// depend on timing, and nothing is truncated that a pending persist still needs.
fn run_writer(
    storage: &ChangelogStorage,
    workload: &Workload,
    index: usize,
    changes: u64,
    progress: &dyn Fn(u64),
) -> anyhow::Result<WriterOutcome> {
    let name = format!("op-{index}");
    let writer = storage.create_writer(
        &name,
        KeyGroupRange {
            start: 0,
            end: workload.key_groups - 1,
        },
    )?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Pending>(OUTSTANDING_CHECKPOINTS - 1);
    std::thread::scope(|scope| {
        let coordinator = scope.spawn(|| -> anyhow::Result<WriterOutcome> {
            let mut outcome = WriterOutcome {
                latencies: Vec::new(),
                checkpoints: 0,
                last: None,
            };
            for pending in rx {
                let snapshot = pending.future.wait()?;
                outcome.latencies.push(pending.started.elapsed());
                writer.confirm(pending.from, pending.to, pending.checkpoint)?;
                writer.truncate(pending.truncate_to)?;
                if let Some(dir) = &workload.manifests {
                    let mut manifest = Manifest::from_snapshot(&snapshot);
                    manifest.writer = Some(writer.name().to_string());
                    manifest.checkpoint_id = Some(pending.checkpoint);
                    manifest.sequence_from = Some(pending.from);
                    manifest.sequence_to = Some(pending.to);
                    manifest.changes = Some([pending.changes.0, pending.changes.1]);
                    let path = dir.join(format!("{}.json", writer.name()));
                    manifest
                        .store(&path)
                        .with_context(|| format!("cannot write manifest {}", path.display()))?;
                }
                outcome.checkpoints += 1;
                outcome.last = Some((snapshot, pending.changes.0, pending.changes.1));
            }
            Ok(outcome)
        });
        // The operator's input: generated on a thread of its own, as records arrive
        // from upstream, in packed batches that end at checkpoint boundaries.
        let (batches, inbox) = std::sync::mpsc::sync_channel::<PackedBatch>(4);
        let (recycle, spare) = std::sync::mpsc::channel::<PackedBatch>();
        scope.spawn(move || {
            let mut source = Changes::new(workload, index);
            let mut done = 0u64;
            let mut since_checkpoint = 0u64;
            while done < changes {
                let n = BATCH
                    .min(changes - done)
                    .min(workload.checkpoint_every - since_checkpoint);
                let mut batch = spare.try_recv().unwrap_or_default();
                batch.clear();
                for _ in 0..n {
                    source.next_into(&mut batch.key_groups, &mut batch.lengths, &mut batch.data);
                }
                if batches.send(batch).is_err() {
                    return; // the operator stopped
                }
                done += n;
                since_checkpoint = (since_checkpoint + n) % workload.checkpoint_every;
            }
        });
        let appended = (|| -> anyhow::Result<()> {
            let mut done = 0u64;
            let mut since_checkpoint = 0u64;
            let mut checkpoint = 0i64;
            // (sequence number, change index) at the ends of the last two checkpoints.
            let mut ends = [(0u64, 0u64); 2];
            for batch in inbox {
                let n = batch.key_groups.len() as u64;
                writer.append_batch(&batch.key_groups, &batch.lengths, &batch.data)?;
                let _ = recycle.send(batch);
                done += n;
                since_checkpoint += n;
                progress(n);
                if since_checkpoint == workload.checkpoint_every || done == changes {
                    checkpoint += 1;
                    let to = writer.next_sequence_number()?;
                    let (from, first) = ends[0];
                    let pending = Pending {
                        started: Instant::now(),
                        future: writer.persist(from, checkpoint)?,
                        checkpoint,
                        from,
                        to,
                        truncate_to: ends[1].0,
                        changes: (first, done),
                    };
                    ends = [ends[1], (to, done)];
                    if tx.send(pending).is_err() {
                        break; // the coordinator failed; its error is reported
                    }
                    since_checkpoint = 0;
                }
            }
            Ok(())
        })();
        drop(tx);
        let outcome = coordinator
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("coordinator thread panicked")));
        appended?;
        let outcome = outcome?;
        writer.close()?;
        Ok(outcome)
    })
}

/// The changes `[from, to)` that writer `index` (`op-<index>`) of `workload` appends, in
/// append order, regenerated from the seed.
pub fn expected_changes(
    workload: &Workload,
    index: usize,
    from: u64,
    to: u64,
) -> Vec<(i32, Vec<u8>)> {
    let mut source = Changes::new(workload, index);
    let (mut key_groups, mut lengths, mut data) = (Vec::new(), Vec::new(), Vec::new());
    let mut changes = Vec::new();
    for i in 0..to {
        key_groups.clear();
        lengths.clear();
        data.clear();
        source.next_into(&mut key_groups, &mut lengths, &mut data);
        if i >= from {
            changes.push((key_groups[0], data.clone()));
        }
    }
    changes
}

/// Regenerates the writer's changes `[from, to)` from the seed and compares them with
/// what the snapshot reads back. Reading keeps the append order within each key group
/// (the format does not keep it across key groups), so that is compared, exactly.
fn verify(
    storage: &ChangelogStorage,
    workload: &Workload,
    index: usize,
    snapshot: &SnapshotResult,
    from: u64,
    to: u64,
) -> anyhow::Result<()> {
    let mut want: BTreeMap<i32, Vec<Vec<u8>>> = BTreeMap::new();
    for (key_group, value) in expected_changes(workload, index, from, to) {
        want.entry(key_group).or_default().push(value);
    }
    let changes = storage.read(&snapshot.remote)?;
    let mut got: BTreeMap<i32, Vec<Vec<u8>>> = BTreeMap::new();
    for change in changes.iter() {
        got.entry(change.key_group)
            .or_default()
            .push(change.value.clone());
    }
    if want != got {
        bail!(
            "verification failed: the last checkpoint of op-{index} read back {} changes but changes {from}..{to} were appended, or their bytes differ",
            changes.len(),
        );
    }
    Ok(())
}

impl Workload {
    /// One of the standard benchmark workloads (BENCHMARKS.md) (`small`, `fanout`, `large`,
    /// `small-z`); the compression flag is returned with it.
    pub fn standard(name: &str, seed: u64) -> anyhow::Result<(Self, bool)> {
        let (writers, changes, change_size, compression) = match name {
            "small" => (1, 2_000_000, 100, false),
            "fanout" => (8, 2_000_000, 100, false),
            "large" => (1, 200_000, 4096, false),
            "small-z" => (1, 2_000_000, 100, true),
            _ => bail!("unknown workload `{name}`: expected small, fanout, large or small-z"),
        };
        Ok((
            Self {
                writers,
                changes,
                change_size,
                key_groups: 128,
                checkpoint_every: 10_000,
                seed,
                manifests: None,
            },
            compression,
        ))
    }
}
