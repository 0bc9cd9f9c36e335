//! The checkpointing workload behind `dstl run`: simulated operators append seeded
//! changes and checkpoint (next-sequence-number, persist, confirm, truncate); at the end
//! the last checkpoint of every writer is read back and checked against what was
//! appended.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::manifest::Manifest;
use crate::{ChangelogStorage, KeyGroupRange, MetricsSnapshot, SnapshotResult, Writer};

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

/// Changes appended since the last checkpoint, as `(key group, value)`.
type Interval = Vec<(i32, Vec<u8>)>;

struct WriterOutcome {
    latencies: Vec<Duration>,
    checkpoints: u64,
    last: Option<(SnapshotResult, Interval)>,
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
    let appended = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let outcomes: Vec<anyhow::Result<WriterOutcome>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workload.writers)
            .map(|index| {
                let appended = appended.clone();
                scope.spawn(move || {
                    let share = workload.changes / workload.writers as u64
                        + u64::from((index as u64) < workload.changes % workload.writers as u64);
                    run_writer(storage, workload, index, share, &|n| {
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
    for outcome in outcomes {
        let outcome = outcome?;
        latencies.extend(outcome.latencies);
        checkpoints += outcome.checkpoints;
        if let Some((snapshot, expected)) = outcome.last {
            verify(storage, &snapshot, &expected)?;
        } else {
            verified = workload.changes == 0;
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
    let mut rng = ChaCha8Rng::seed_from_u64(
        workload.seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    let mut outcome = WriterOutcome {
        latencies: Vec::new(),
        checkpoints: 0,
        last: None,
    };
    let mut interval: Vec<(i32, Vec<u8>)> = Vec::new();
    let (mut key_groups, mut lengths, mut data) = (Vec::new(), Vec::new(), Vec::new());
    let mut from = writer.initial_sequence_number()?;
    let mut done = 0u64;
    let mut since_checkpoint = 0u64;
    while done < changes {
        let n = BATCH
            .min(changes - done)
            .min(workload.checkpoint_every - since_checkpoint);
        key_groups.clear();
        lengths.clear();
        data.clear();
        for _ in 0..n {
            let key_group = rng.random_range(0..workload.key_groups);
            let start = data.len();
            data.resize(start + workload.change_size, 0);
            rng.fill_bytes(&mut data[start..]);
            key_groups.push(key_group);
            lengths.push(workload.change_size as u32);
            interval.push((key_group, data[start..].to_vec()));
        }
        writer.append_batch(&key_groups, &lengths, &data)?;
        done += n;
        since_checkpoint += n;
        progress(n);
        if since_checkpoint == workload.checkpoint_every || done == changes {
            from = checkpoint(
                &writer,
                workload,
                &mut outcome,
                from,
                std::mem::take(&mut interval),
            )?;
            since_checkpoint = 0;
        }
    }
    writer.close()?;
    Ok(outcome)
}

fn checkpoint(
    writer: &Writer,
    workload: &Workload,
    outcome: &mut WriterOutcome,
    from: u64,
    interval: Vec<(i32, Vec<u8>)>,
) -> anyhow::Result<u64> {
    let checkpoint = outcome.checkpoints as i64 + 1;
    let to = writer.next_sequence_number()?;
    let started = Instant::now();
    let snapshot = writer.persist(from, checkpoint)?.wait()?;
    outcome.latencies.push(started.elapsed());
    writer.confirm(from, to, checkpoint)?;
    writer.truncate(to)?;
    if let Some(dir) = &workload.manifests {
        let mut manifest = Manifest::from_snapshot(&snapshot);
        manifest.writer = Some(writer.name().to_string());
        manifest.checkpoint_id = Some(checkpoint);
        manifest.sequence_from = Some(from);
        manifest.sequence_to = Some(to);
        let path = dir.join(format!("{}.json", writer.name()));
        manifest
            .store(&path)
            .with_context(|| format!("cannot write manifest {}", path.display()))?;
    }
    outcome.checkpoints += 1;
    outcome.last = Some((snapshot, interval));
    Ok(to)
}

/// Reading a change set keeps the append order within each key group (the format does
/// not keep it across key groups), so that is what is compared, exactly.
fn verify(
    storage: &ChangelogStorage,
    snapshot: &SnapshotResult,
    expected: &[(i32, Vec<u8>)],
) -> anyhow::Result<()> {
    let changes = storage.read(&snapshot.remote)?;
    let mut want: BTreeMap<i32, Vec<&[u8]>> = BTreeMap::new();
    for (key_group, value) in expected {
        want.entry(*key_group).or_default().push(value);
    }
    let mut got: BTreeMap<i32, Vec<&[u8]>> = BTreeMap::new();
    for change in &changes {
        got.entry(change.key_group).or_default().push(&change.value);
    }
    if want != got {
        bail!(
            "verification failed: the last checkpoint read back {} changes but {} were appended, or their bytes differ",
            changes.len(),
            expected.len()
        );
    }
    Ok(())
}

/// Peak resident set size of this process in MB.
pub fn peak_rss_mb() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    usage.ru_maxrss as f64 / 1024.0
}
