//! The checkpointing workload behind `dstl run`: simulated operators append seeded
//! changes and checkpoint (next-sequence-number, persist, confirm, truncate); the run,
//! as a job manager would, deletes the files of subsumed checkpoints (`retention`); at the
//! end the last checkpoint of every writer is read back and checked against what was
//! appended.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

mod density;
mod input;
mod measure;
pub mod recovery;
mod retention;

pub use density::{Density, density};
use input::{Changes, PlacedBatch, Pool};
pub use measure::{current_rss_mb, direct_baseline_mb_per_s, disk_baseline_mb_per_s, peak_rss_mb};
use retention::Retention;

use dstl::recovery::manifest::{Manifest, ManifestFile};
use dstl::{ChangelogStorage, KeyGroupRange, MetricsSnapshot, SnapshotResult, Store};

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
    /// Delete the files of subsumed checkpoints while the run goes on, as a job manager
    /// would (a checkpoint is subsumed once its writer confirms the next one). Without it
    /// the run keeps every file it wrote until it ends, as the Flink harness does: the
    /// benchmarks compare like with like.
    pub delete_subsumed: bool,
    /// At most this many checkpoints of one writer pending at once, as Flink's checkpoint
    /// coordinator allows (`execution.checkpointing.max-concurrent-checkpoints`): a
    /// checkpoint that falls due while they are pending is taken after the next batch of
    /// appends that finds one completed, and the writer goes on appending meanwhile.
    /// Every pending checkpoint's snapshot names each change set since the last confirmed
    /// one, so k pending checkpoints name O(k²) change sets; with no cap (`None`, as the
    /// Flink harness runs) uploads that fall behind frequent checkpoints grow that
    /// without bound, up to the writer's memory limit.
    pub max_pending_checkpoints: Option<usize>,
}

/// `dstl run`'s default [`Workload::max_pending_checkpoints`]: above what a run keeps
/// pending while its uploads keep up (about 25 per writer for the default run's 200
/// checkpoints a second and 110 ms persists), and a few MB of snapshots per writer.
pub const DEFAULT_MAX_PENDING_CHECKPOINTS: usize = 64;

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
        if self.max_pending_checkpoints == Some(0) {
            bail!("--max-pending-checkpoints 0 must be at least 1");
        }
        if self.checkpoint_every == 0 {
            bail!("--checkpoint-every must be at least 1");
        }
        if self.change_size > 64 << 20 {
            bail!("--change-size {} exceeds 64 MiB", self.change_size);
        }
        Ok(())
    }

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
                // 10,000 appends over all writers between checkpoints, as in the harness.
                checkpoint_every: 10_000 / writers as u64,
                seed,
                manifests: None,
                delete_subsumed: false,
                max_pending_checkpoints: None,
            },
            compression,
        ))
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
    /// Files of subsumed checkpoints deleted while the run went on.
    pub deleted_files: u64,
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
    /// Peak resident set size of the process while the workload ran (verification,
    /// which reads the last checkpoints back, comes after).
    pub peak_rss_mb: f64,
    /// Whether every writer's last checkpoint read back exactly.
    pub verified: bool,
    /// Where the files went.
    pub dir: String,
    /// Upload counters.
    pub metrics: MetricsSnapshot,
}

/// Why [`run_stoppable`] ended early: its `stop` asked it to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "stopped after {changes} changes: the writers stopped appending, took no final checkpoint and closed, failing their pending persists"
)]
pub struct Stopped {
    /// Changes appended before the writers stopped.
    pub changes: u64,
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
    run_stoppable(storage, workload, None, &|| false, progress)
}

/// Like [`run`], but every writer also asks `stop` between batches of appends, and with a
/// `duration` it appends until that has passed (wall-clock time) instead of stopping
/// after `workload.changes`, which is ignored; then each takes its final checkpoint as
/// usual, and the summary counts the changes actually appended. Once `stop` says yes,
/// the writers stop appending, take no final checkpoint and close, failing their pending
/// persists, and the run fails with [`Stopped`] at once, without waiting for uploads in
/// flight (closing the storage bounds those). Checkpoints confirmed before that stay
/// confirmed, and their manifests written.
///
/// This is the run behind [`run`] too. The first writer to fail stops the others the
/// same way `stop` does: the run has failed, and writers that went on appending would
/// only add files (on a full disk, failures) nobody reads.
pub fn run_stoppable(
    storage: &ChangelogStorage,
    workload: &Workload,
    duration: Option<Duration>,
    stop: &(dyn Fn() -> bool + Sync),
    progress: &(dyn Fn(u64) + Sync),
) -> anyhow::Result<Summary> {
    let deadline = duration.map(|d| Instant::now() + d);
    workload.validate()?;
    if let Some(dir) = &workload.manifests {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the manifest directory {}", dir.display()))?;
    }
    let appended = AtomicU64::new(0);
    let share = |index: usize| match deadline {
        Some(_) => u64::MAX,
        None => {
            workload.changes / workload.writers as u64
                + u64::from((index as u64) < workload.changes % workload.writers as u64)
        }
    };
    let pool = Pool::new(workload.seed, workload.change_size);
    let started = Instant::now();
    // The writer that failed first: its error is the run's (the others' follow from it).
    let first_failure = AtomicUsize::new(usize::MAX);
    let failed = AtomicBool::new(false);
    let halt = || failed.load(Ordering::Relaxed) || stop();
    let retention = workload
        .delete_subsumed
        .then(|| Retention::new(workload.writers));
    let deleted = AtomicU64::new(0);
    let (deletions, queued) = mpsc::channel();
    let outcomes = std::thread::scope(|scope| {
        // The deletion thread only when the run deletes.
        let subsumption = retention.as_ref().map(|retention| {
            let deleted = &deleted;
            scope.spawn(move || delete_files(storage.store(), queued, deleted));
            Subsumption {
                retention,
                deletions: &deletions,
            }
        });
        let outcomes = on_threads(workload.writers, |index| {
            let name = format!("op-{index}");
            let outcome = run_writer(
                storage,
                workload,
                &pool,
                index,
                share(index),
                deadline,
                subsumption,
                &halt,
                &|n| progress(appended.fetch_add(n, Ordering::Relaxed) + n),
            )
            .map_err(|e| {
                // dstl's writer errors name the writer already; others (a manifest that
                // cannot be written) get its name here.
                if e.to_string().contains(&format!("writer {name}")) {
                    e
                } else {
                    e.context(format!("writer {name}"))
                }
            });
            if outcome.is_err() {
                let _ = first_failure.compare_exchange(
                    usize::MAX,
                    index,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                failed.store(true, Ordering::Relaxed);
            }
            outcome
        });
        // The deletion thread ends once it has deleted everything queued.
        drop(deletions);
        outcomes
    });
    let first_failure = first_failure.into_inner();
    if first_failure != usize::MAX {
        return Err(outcomes
            .into_iter()
            .nth(first_failure)
            .and_then(Result::err)
            .expect("the first failure is an error"));
    }
    if stop() {
        return Err(Stopped {
            changes: appended.load(Ordering::Relaxed),
        }
        .into());
    }
    storage.wait_idle();
    let wall = started.elapsed();
    // The workload's memory, before verification reads the last checkpoints back.
    let peak_rss_mb = peak_rss_mb();
    let mut latencies = Vec::new();
    let mut checkpoints = 0;
    let mut verified = true;
    for (index, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome?.ok_or_else(|| {
            anyhow::anyhow!("writer op-{index} stopped, but neither a failure nor `stop` halted it")
        })?;
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
    let changes = appended.load(Ordering::Relaxed);
    let payload_bytes = changes * workload.change_size as u64;
    Ok(Summary {
        writers: workload.writers,
        changes,
        payload_bytes,
        checkpoints,
        files: metrics.uploaded_files,
        bytes_written: metrics.written_bytes,
        deleted_files: deleted.load(Ordering::Relaxed),
        wall_s: wall.as_secs_f64(),
        appends_per_s: changes as f64 / wall.as_secs_f64(),
        payload_mb_per_s: payload_bytes as f64 / 1e6 / wall.as_secs_f64(),
        persist_p50_ms: percentile(0.50),
        persist_p99_ms: percentile(0.99),
        peak_rss_mb,
        verified,
        dir: storage.config().job_dir().display().to_string(),
        metrics,
    })
}

/// Runs `f(0..n)` on `n` threads at once (one operator each) and returns their results
/// in order.
pub(crate) fn on_threads<T: Send>(
    n: usize,
    f: impl Fn(usize) -> anyhow::Result<T> + Sync,
) -> Vec<anyhow::Result<T>> {
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = (0..n).map(|index| scope.spawn(move || f(index))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("writer thread panicked")))
            })
            .collect()
    })
}

/// Deletes the files the run's [`Retention`] gives up, on a thread of its own, until the
/// writers are done. A file that cannot be deleted stays an orphan for `dstl gc`.
fn delete_files(store: &dyn Store, queued: mpsc::Receiver<Vec<String>>, deleted: &AtomicU64) {
    for path in queued.into_iter().flatten() {
        match store.delete(&path) {
            Ok(()) => {
                deleted.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => tracing::warn!(
                %path,
                %error,
                "could not delete a file of a subsumed checkpoint; `dstl gc` collects it"
            ),
        }
    }
}

/// Where operators report their confirmed checkpoints when the run deletes the files of
/// subsumed ones.
#[derive(Clone, Copy)]
struct Subsumption<'a> {
    retention: &'a Retention,
    deletions: &'a mpsc::Sender<Vec<String>>,
}

impl Subsumption<'_> {
    fn delete(&self, files: Vec<String>) {
        if !files.is_empty() {
            // The deletion thread outlives every operator.
            let _ = self.deletions.send(files);
        }
    }
}

/// Appends per batch call: large enough to amortize the call into the sandbox.
const BATCH: u64 = 512;

/// A persist in flight, confirmed when it completes.
struct Pending {
    future: dstl::PersistFuture,
    checkpoint: Checkpoint,
}

/// What a checkpoint holds.
struct Checkpoint {
    started: Instant,
    id: i64,
    from: u64,
    to: u64,
    /// The [`Retention`] clock read just before `to` was taken.
    tick: u64,
    /// The clock reading of the checkpoint that ended at `from`.
    from_tick: u64,
    /// Change indexes `[first, end)` the snapshot holds.
    changes: (u64, u64),
}

/// Where one operator stands: what it confirmed and what it measured.
struct Operator<'a> {
    index: usize,
    writer: dstl::Writer,
    workload: &'a Workload,
    subsumption: Option<Subsumption<'a>>,
    /// The end of the last confirmed checkpoint: where the next persist starts.
    confirmed: (u64, u64),
    /// The clock reading of that checkpoint.
    confirmed_tick: u64,
    outcome: WriterOutcome,
}

impl Operator<'_> {
    /// A persist completed: confirm and truncate (as the checkpoint coordinator would
    /// tell the task), record the latency, write the manifest, and (when the run deletes
    /// subsumed checkpoints) give up the files only earlier checkpoints named.
    /// `oldest_pending` is the checkpoint of the oldest persist still in flight.
    fn confirm(
        &mut self,
        checkpoint: Checkpoint,
        snapshot: SnapshotResult,
        oldest_pending: Option<&Checkpoint>,
    ) -> anyhow::Result<()> {
        self.outcome.latencies.push(checkpoint.started.elapsed());
        let writer = &self.writer;
        writer.confirm(checkpoint.from, checkpoint.to, checkpoint.id)?;
        if checkpoint.to > self.confirmed.0 {
            writer.truncate(checkpoint.to)?;
            self.confirmed = (checkpoint.to, checkpoint.changes.1);
            self.confirmed_tick = checkpoint.tick;
        }
        if let Some(dir) = &self.workload.manifests {
            let mut manifest = Manifest::from_snapshot(&snapshot);
            manifest.writer = Some(writer.name().to_string());
            manifest.checkpoint_id = Some(checkpoint.id);
            manifest.sequence_from = Some(checkpoint.from);
            manifest.sequence_to = Some(checkpoint.to);
            manifest.changes = Some([checkpoint.changes.0, checkpoint.changes.1]);
            let path = dir.join(format!("{}.json", writer.name()));
            manifest
                .store(&path)
                .with_context(|| format!("cannot write manifest {}", path.display()))?;
        }
        // After the manifest: a crash in between leaves it naming files that still exist.
        if let Some(subsumption) = self.subsumption {
            let safe = oldest_pending.map_or(self.confirmed_tick, |c| c.from_tick);
            let files = snapshot
                .remote
                .entries
                .iter()
                .map(|e| e.handle.path.as_str());
            subsumption.delete(subsumption.retention.confirmed(self.index, files, safe)?);
        }
        self.outcome.checkpoints += 1;
        self.outcome.last = Some((snapshot, checkpoint.changes.0, checkpoint.changes.1));
        Ok(())
    }
}

/// One operator on its own thread, like a task thread, with the protocol of the Flink
/// harness: after every `checkpoint_every` appends, `to = next-sequence-number` and
/// `persist(from = the end of the last confirmed checkpoint)`; the operator never waits
/// for a checkpoint (only the in-flight limit can hold it), and when a persist completes
/// it confirms `[from, to)` and truncates to `to`. A checkpoint due while
/// `max_pending_checkpoints` are pending waits for the first batch boundary after one
/// completes. After the last append (the
/// `changes`-th, or the first after `deadline`) it takes a final checkpoint and waits for
/// every persist. When `halt` says so (asked before every batch), it stops at once:
/// no final checkpoint, and closing the writer fails its pending persists; it then returns
/// `None`.
#[allow(clippy::too_many_arguments)]
fn run_writer(
    storage: &ChangelogStorage,
    workload: &Workload,
    pool: &Pool,
    index: usize,
    changes: u64,
    deadline: Option<Instant>,
    subsumption: Option<Subsumption<'_>>,
    halt: &dyn Fn() -> bool,
    progress: &dyn Fn(u64),
) -> anyhow::Result<Option<WriterOutcome>> {
    let name = format!("op-{index}");
    let writer = storage.create_writer(
        &name,
        KeyGroupRange {
            start: 0,
            end: workload.key_groups - 1,
        },
    )?;
    let source = Changes::new(pool, index, workload.key_groups, workload.change_size);
    let mut operator = Operator {
        index,
        writer,
        workload,
        subsumption,
        confirmed: (0, 0),
        confirmed_tick: 0,
        outcome: WriterOutcome {
            latencies: Vec::new(),
            checkpoints: 0,
            last: None,
        },
    };
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut batch = PlacedBatch::default();
    let mut done = 0u64;
    let mut since_checkpoint = 0u64;
    let mut checkpoint = 0i64;
    let mut last = changes == 0;
    while !last {
        if halt() {
            // The persists still pending fail with `Closed`; nobody waits for them. A
            // writer already closed by a trap has nothing left to fail.
            drop(pending);
            let _ = operator.writer.close();
            return Ok(None);
        }
        // Past a checkpoint deferred by the cap on pending ones: whole batches until it is
        // taken.
        let until_checkpoint = match workload.checkpoint_every.checked_sub(since_checkpoint) {
            Some(0) | None => BATCH,
            Some(n) => n,
        };
        let n = BATCH.min(changes - done).min(until_checkpoint);
        batch.append(&source, done..done + n, &operator.writer)?;
        done += n;
        since_checkpoint += n;
        progress(n);
        last = done == changes || deadline.is_some_and(|d| Instant::now() >= d);
        // Persists that completed meanwhile, in order (a later one never completes
        // before an earlier one: its range holds the earlier one's).
        while let Some(outcome) = pending.front_mut().and_then(|p| p.future.try_wait()) {
            let finished = pending.pop_front().expect("a front");
            let oldest = pending.front().map(|p| &p.checkpoint);
            operator.confirm(finished.checkpoint, outcome?, oldest)?;
        }
        let due = since_checkpoint >= workload.checkpoint_every
            && workload
                .max_pending_checkpoints
                .is_none_or(|max| pending.len() < max);
        if due || last {
            checkpoint += 1;
            // The clock first: `to` then covers every change in a file seen by then.
            let tick = subsumption.map_or(0, |s| s.retention.now());
            let to = operator.writer.next_sequence_number()?;
            let (from, first) = operator.confirmed;
            let started = Instant::now();
            pending.push_back(Pending {
                future: operator.writer.persist(from, checkpoint)?,
                checkpoint: Checkpoint {
                    started,
                    id: checkpoint,
                    from,
                    to,
                    tick,
                    from_tick: operator.confirmed_tick,
                    changes: (first, done),
                },
            });
            since_checkpoint = 0;
        }
    }
    while let Some(Pending { future, checkpoint }) = pending.pop_front() {
        let oldest = pending.front().map(|p| &p.checkpoint);
        operator.confirm(checkpoint, future.wait()?, oldest)?;
    }
    operator.writer.close()?;
    if let Some(subsumption) = subsumption {
        subsumption.delete(subsumption.retention.closed(index));
    }
    Ok(Some(operator.outcome))
}

/// The changes `[from, to)` that writer `index` (`op-<index>`) of `workload` appends, in
/// append order, regenerated from the seed.
pub fn expected_changes(
    workload: &Workload,
    index: usize,
    from: u64,
    to: u64,
) -> Vec<(i32, Vec<u8>)> {
    let pool = Pool::new(workload.seed, workload.change_size);
    let source = Changes::new(&pool, index, workload.key_groups, workload.change_size);
    (from..to).map(|i| source.change(i)).collect()
}

/// Values by key group, each group's in the order given.
fn by_key_group(changes: impl IntoIterator<Item = (i32, Vec<u8>)>) -> BTreeMap<i32, Vec<Vec<u8>>> {
    let mut grouped: BTreeMap<i32, Vec<Vec<u8>>> = BTreeMap::new();
    for (key_group, value) in changes {
        grouped.entry(key_group).or_default().push(value);
    }
    grouped
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
    let want = by_key_group(expected_changes(workload, index, from, to));
    let changes = storage.read(&snapshot.remote)?;
    if want != by_key_group(changes.iter().map(|c| (c.key_group, c.value.clone()))) {
        bail!(
            "verification failed: the last checkpoint of op-{index} read back {} changes but changes {from}..{to} were appended, or their bytes differ",
            changes.len(),
        );
    }
    Ok(())
}
