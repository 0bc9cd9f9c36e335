//! `dstl run`: the main job. Its data goes to a fresh temporary directory that is
//! removed after verification unless it is kept (`--keep`, `--manifests`); with an
//! explicit `--dir` or `--store`, only what the run created there is removed. SIGINT and
//! SIGTERM stop it cleanly.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use dstl::{ChangelogStorage, Config, Location, S3Store, Store};
use dstl_cli::workload::{self, Workload};

use super::{ConfArgs, DEFAULT_DIR, Target, prometheus};

/// `dstl run` options.
#[derive(Args, Debug)]
pub(super) struct RunArgs {
    #[command(flatten)]
    pub(super) target: Target,
    /// Simulated operators (one writer each).
    #[arg(long, default_value_t = 4)]
    pub(super) writers: usize,
    /// Changes in total.
    #[arg(long, default_value_t = 400_000)]
    pub(super) changes: u64,
    /// Append for this long (wall-clock time, e.g. `30s`, `10 min`) instead of a number
    /// of changes; each writer then takes its final checkpoint.
    #[arg(long, value_name = "DURATION", conflicts_with = "changes", value_parser = parse_run_duration)]
    pub(super) duration: Option<Duration>,
    /// Serve the metrics in the Prometheus text format at http://ADDR/metrics while the
    /// job runs (e.g. 127.0.0.1:9464; port 0 picks a free port, reported on stderr).
    #[arg(long, value_name = "ADDR", value_parser = prometheus::parse_address)]
    pub(super) prometheus: Option<SocketAddr>,
    /// Bytes per change.
    #[arg(long, default_value_t = 100)]
    pub(super) change_size: usize,
    /// Key groups per writer.
    #[arg(long, default_value_t = 128)]
    pub(super) key_groups: i32,
    /// Appends per writer between checkpoints.
    #[arg(long, default_value_t = 10_000)]
    pub(super) checkpoint_every: u64,
    /// At most this many checkpoints of one writer pending at once, as Flink's
    /// `execution.checkpointing.max-concurrent-checkpoints`: a checkpoint due while they
    /// are waits until one completes, and the writer goes on appending meanwhile. Each
    /// pending checkpoint names every change set since the last confirmed one, so without
    /// a cap, uploads that fall behind frequent checkpoints grow the writers' memory
    /// quadratically
    #[arg(long, default_value_t = workload::DEFAULT_MAX_PENDING_CHECKPOINTS)]
    pub(super) max_pending_checkpoints: usize,
    /// Snappy-compress files.
    #[arg(long)]
    pub(super) compression: bool,
    /// Seed of the change bytes.
    #[arg(long, default_value_t = 42)]
    pub(super) seed: u64,
    #[command(flatten)]
    pub(super) conf: ConfArgs,
    /// After each checkpoint, atomically rewrite DIR/<writer>.json with its manifest
    /// (implies --keep: the manifests name the files).
    #[arg(long, value_name = "DIR")]
    pub(super) manifests: Option<PathBuf>,
    /// Keep the data (in --dir, default ./dstl-data) instead of removing it after
    /// verification.
    #[arg(long)]
    pub(super) keep: bool,
    /// Print the summary as one JSON object and nothing else on stdout.
    #[arg(long)]
    pub(super) json: bool,
}

pub(super) fn run(args: RunArgs) -> anyhow::Result<()> {
    let keep = args.keep || args.manifests.is_some();
    // Data that is not kept goes to a directory of its own unless --dir or --store says
    // otherwise, so that removing it afterwards cannot remove anything else.
    let default_base = if keep {
        PathBuf::from(DEFAULT_DIR)
    } else {
        std::env::temp_dir().join(format!("dstl-run-{}", uuid::Uuid::new_v4().simple()))
    };
    let mut config = args.conf.build(&default_base.to_string_lossy())?;
    args.target.apply(&mut config)?;
    if args.compression {
        config.set_compression(true);
    }
    let workload = Workload {
        writers: args.writers,
        changes: args.changes,
        change_size: args.change_size,
        key_groups: args.key_groups,
        checkpoint_every: args.checkpoint_every,
        seed: args.seed,
        manifests: args.manifests.clone(),
        delete_subsumed: true,
        max_pending_checkpoints: Some(args.max_pending_checkpoints),
    };
    workload.validate()?;
    let data = RunData::plan(&config, keep)?;
    // Before the storage opens: it registers its metrics with the recorder installed then.
    if let Some(address) = args.prometheus {
        let bound = prometheus::serve(address)?;
        eprintln!("dstl: serving Prometheus metrics at http://{bound}/metrics");
    }
    let signals = Signals::install()?;
    let appended = std::sync::atomic::AtomicU64::new(0);
    // Where the changelog files go, for the summary and messages: absolute, and once the
    // storage has created it, spelled as the manifests spell their paths (canonical).
    let job_dir = config.job_dir();
    let mut files = match config.location() {
        Location::Local(_) => std::path::absolute(&job_dir).unwrap_or_else(|_| job_dir.clone()),
        Location::S3 { .. } => job_dir.clone(),
    }
    .display()
    .to_string();
    let outcome = ChangelogStorage::open(config)
        .map_err(anyhow::Error::from)
        .and_then(|storage| {
            if let Ok(absolute) = std::fs::canonicalize(&job_dir) {
                files = absolute.display().to_string();
            }
            let outcome = drive(&args, &workload, &storage, &signals, &appended);
            storage.close();
            outcome
        });
    let disposition = data.finish(&files);
    if let Some(signal) = signals.received() {
        return Err(Interrupted {
            signal,
            changes: appended.load(Ordering::Relaxed),
            disposition,
        }
        .into());
    }
    let mut summary = match outcome {
        Ok(summary) => summary,
        Err(error) => return Err(failure(&error, &files, &disposition)),
    };
    summary.dir = files;
    if args.json {
        let mut value = serde_json::to_value(&summary)?;
        value["kept"] = keep.into();
        println!("{value}");
    } else {
        print_summary(&summary, args.change_size, &disposition);
    }
    match disposition {
        Disposition::NotRemoved(why) => Err(anyhow::anyhow!(
            "the run succeeded, but its data could not be removed: {why}"
        )),
        _ => Ok(()),
    }
}

/// Runs the workload on an open storage, with the progress bar, until it completes,
/// fails or a signal stops it.
fn drive(
    args: &RunArgs,
    workload: &Workload,
    storage: &ChangelogStorage,
    signals: &Signals,
    appended: &std::sync::atomic::AtomicU64,
) -> anyhow::Result<workload::Summary> {
    let style = |template: &str| {
        indicatif::ProgressStyle::with_template(template)
            .expect("valid template")
            .with_key("rate", average_rate)
    };
    let bar = match args.duration {
        _ if args.json => indicatif::ProgressBar::hidden(),
        Some(duration) => {
            let bar = indicatif::ProgressBar::new_spinner().with_style(style(&format!(
                "{{spinner}} [{{elapsed_precise}} of {}] {{human_pos}} changes ({{rate}})",
                humanize(duration)
            )));
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        }
        None => indicatif::ProgressBar::new(args.changes).with_style(style(
            "{spinner} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} changes ({rate}, eta {eta})",
        )),
    };
    let progress = |n| {
        appended.fetch_max(n, Ordering::Relaxed);
        bar.set_position(n);
    };
    let stop = || signals.received().is_some();
    let summary = workload::run_stoppable(storage, workload, args.duration, &stop, &progress);
    bar.finish_and_clear();
    summary
}

fn print_summary(summary: &workload::Summary, change_size: usize, disposition: &Disposition) {
    println!(
        "dstl run: {} writer{}, {} changes of {} B into {}",
        summary.writers,
        if summary.writers == 1 { "" } else { "s" },
        summary.changes,
        change_size,
        summary.dir
    );
    println!("  wall            {:.2} s", summary.wall_s);
    println!(
        "  appends         {} ({:.1} MB/s payload)",
        rate(summary.appends_per_s),
        summary.payload_mb_per_s
    );
    println!(
        "  checkpoints     {} (persist p50 {:.2} ms, p99 {:.2} ms)",
        summary.checkpoints, summary.persist_p50_ms, summary.persist_p99_ms
    );
    println!(
        "  files           {} ({} bytes written; {} of subsumed checkpoints deleted)",
        summary.files, summary.bytes_written, summary.deleted_files
    );
    println!("  peak RSS        {:.1} MB", summary.peak_rss_mb);
    println!(
        "  verified        {}",
        if summary.verified {
            "yes: every writer's last checkpoint read back exactly"
        } else {
            "no"
        }
    );
    let data = match disposition {
        Disposition::Kept { dir, .. } => format!("kept in {dir}"),
        Disposition::Removed => "removed after verification (--keep keeps it)".to_string(),
        Disposition::NotRemoved(why) => format!("not removed: {why}"),
    };
    println!("  data            {data}");
}

/// The final error of a run that failed: one line, and on a full disk one that says so
/// first, naming where the files went (the cause alone names a staging file, or
/// nothing, when the text crossed the sandbox).
fn failure(error: &anyhow::Error, files: &str, disposition: &Disposition) -> anyhow::Error {
    let text = dstl::describe(error.as_ref());
    if is_disk_full(error.as_ref()) {
        anyhow::anyhow!("no space left on device in {files}: {text}; {disposition}")
    } else {
        anyhow::anyhow!("{text}; {disposition}")
    }
}

/// Whether `error` comes from a full disk: an I/O error of kind `StorageFull` (ENOSPC)
/// anywhere in its chain, including the typed cause of an upload failure
/// ([`dstl::UploadError::io_error_kind`]), also where a persist cites an earlier one
/// (`WriterError::AlreadyFailed`), and of a setup failure (the lease, the job directory).
fn is_disk_full(error: &(dyn std::error::Error + 'static)) -> bool {
    let full = std::io::ErrorKind::StorageFull;
    std::iter::successors(Some(error), |cause| cause.source()).any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == full)
            || cause
                .downcast_ref::<dstl::Error>()
                .is_some_and(|e| match e {
                    dstl::Error::Upload { source, .. }
                    | dstl::Error::Writer {
                        upload: Some(source),
                        ..
                    } if source.io_error_kind() == Some(full) => true,
                    _ => e.setup_cause().is_some_and(|c| is_disk_full(c)),
                })
    })
}

/// What became of a run's data.
#[derive(Debug, Clone)]
enum Disposition {
    /// Kept (`--keep`, `--manifests`): where the changelog files are, and how many
    /// staging files of uploads cut short by the end of the run are left beside them.
    Kept {
        /// The changelog directory (or URL).
        dir: String,
        /// Staging files left in it.
        staging: usize,
    },
    /// Removed: everything the run created.
    Removed,
    /// Not removed, or not all of it: why.
    NotRemoved(String),
}

impl std::fmt::Display for Disposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Disposition::Kept { dir, staging: 0 } => write!(f, "the data stays in {dir}"),
            Disposition::Kept { dir, staging } => write!(
                f,
                "the data stays in {dir}, with {staging} staging file{} of uploads cut short that `dstl gc` removes",
                if *staging == 1 { "" } else { "s" }
            ),
            Disposition::Removed => write!(f, "the run's data was removed"),
            Disposition::NotRemoved(why) => {
                write!(f, "the run's data could not be removed: {why}")
            }
        }
    }
}

/// `dstl run` stopped by SIGINT or SIGTERM. The binary exits with 128 + the signal's
/// number, the status a shell reports for a process the signal ended.
#[derive(Debug, thiserror::Error)]
#[error(
    "interrupted by {} after {changes} changes: the writers stopped appending and closed (their pending persists failed) and the storage closed, releasing its lease; {disposition}",
    signal_name(*signal)
)]
pub struct Interrupted {
    signal: i32,
    changes: u64,
    disposition: Disposition,
}

impl Interrupted {
    /// The process's exit status.
    pub fn exit_code(&self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(1)
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// SIGINT and SIGTERM while `dstl run` runs. The first one asks the run to stop; a
/// second one ends the process at once (the signal's default action), for a run that
/// does not stop soon enough.
struct Signals {
    received: Arc<AtomicUsize>,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        let received = Arc::new(AtomicUsize::new(0));
        let armed = Arc::new(AtomicBool::new(false));
        for signal in [libc::SIGINT, libc::SIGTERM] {
            let install = || -> std::io::Result<()> {
                // Registered before the flag that arms it, so it acts from the second
                // signal on (signal-hook runs a signal's actions in registration order).
                signal_hook::flag::register_conditional_default(signal, armed.clone())?;
                signal_hook::flag::register(signal, armed.clone())?;
                signal_hook::flag::register_usize(signal, received.clone(), signal as usize)?;
                Ok(())
            };
            install().with_context(|| format!("cannot handle {}", signal_name(signal)))?;
        }
        Ok(Self { received })
    }

    /// The signal received, if any.
    fn received(&self) -> Option<i32> {
        match self.received.load(Ordering::Relaxed) {
            0 => None,
            signal => i32::try_from(signal).ok(),
        }
    }
}

/// Where a run's data goes and which of it the run creates, so that removing the data
/// removes exactly that.
struct RunData {
    keep: bool,
    config: Config,
    /// Directories the run creates and removes whole: `<base>/<job-id>` of a local base,
    /// and `<local-dir>/jid_<job-id>` with local recovery.
    roots: Vec<PathBuf>,
    /// Their ancestors that do not exist yet, deepest first: the run creates them too,
    /// and removes each one that is empty afterwards (anything else put there meanwhile
    /// is not the run's).
    parents: Vec<PathBuf>,
}

impl RunData {
    /// Checks that a run whose data is not kept will only create: its job directories
    /// and, in an object store, its job's prefix must not exist yet (they could only with
    /// an explicit `dstl.job-id`; the default is random).
    fn plan(config: &Config, keep: bool) -> anyhow::Result<Self> {
        let mut roots = Vec::new();
        if let Location::Local(base) = config.location() {
            roots.push(base.join(config.job_id()));
        }
        if config.local_recovery {
            let copies = config.local_copies_dir();
            roots.push(copies.parent().unwrap_or(&copies).to_path_buf());
        }
        let missing = |path: &Path| {
            !path.as_os_str().is_empty()
                && matches!(path.symlink_metadata(), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
        };
        if !keep {
            if let Some(root) = roots.iter().find(|root| !missing(root)) {
                anyhow::bail!(
                    "{} already exists, and a run that does not keep its data writes only into directories it creates (dstl.job-id is {}): pass --keep to add to it, or another job id",
                    root.display(),
                    config.job_id()
                );
            }
            if let Location::S3 { bucket, prefix } = config.location() {
                // The whole job prefix: its files, and leases of storages open on it.
                let job = [prefix.as_str(), config.job_id()]
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .collect::<Vec<_>>()
                    .join("/");
                let store = S3Store::open(&config.s3(), &bucket, &job, "")
                    .with_context(|| format!("cannot open the object store s3://{bucket}"))?;
                let existing = store
                    .list()
                    .with_context(|| format!("cannot list {} before the run", store.describe()))?;
                if !existing.is_empty() {
                    anyhow::bail!(
                        "{} already holds {} objects, and a run that does not keep its data removes the job's files afterwards (dstl.job-id is {}): pass --keep to add to them, or another job id",
                        store.describe(),
                        existing.len(),
                        config.job_id()
                    );
                }
            }
        }
        let mut parents: Vec<PathBuf> = Vec::new();
        for root in &roots {
            let mut next = root.parent();
            while let Some(dir) = next.filter(|dir| missing(dir)) {
                if !parents.iter().any(|p| p == dir) {
                    parents.push(dir.to_path_buf());
                }
                next = dir.parent();
            }
        }
        parents.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
        Ok(Self {
            keep,
            config: config.clone(),
            roots,
            parents,
        })
    }

    /// After the storage closed: keeps the data, saying where it is (`files`), or
    /// removes what the run created.
    fn finish(&self, files: &str) -> Disposition {
        if self.keep {
            return Disposition::Kept {
                dir: files.to_string(),
                staging: self.staging_files(),
            };
        }
        let mut failures = Vec::new();
        for root in &self.roots {
            match std::fs::remove_dir_all(root) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    failures.push(format!("{}: {e}", root.display()));
                }
                _ => {}
            }
        }
        if let Err(e) = self.remove_objects() {
            failures.push(dstl::describe(e.as_ref()));
        }
        for dir in &self.parents {
            // Fails, leaving it, unless empty.
            let _ = std::fs::remove_dir(dir);
        }
        if failures.is_empty() {
            Disposition::Removed
        } else {
            Disposition::NotRemoved(failures.join("; "))
        }
    }

    /// Deletes the job's files from an object store (the store closed; its lease is gone).
    fn remove_objects(&self) -> anyhow::Result<()> {
        let Location::S3 { bucket, prefix } = self.config.location() else {
            return Ok(());
        };
        let store = S3Store::open(&self.config.s3(), &bucket, &prefix, self.config.job_id())
            .with_context(|| format!("cannot open the object store s3://{bucket}"))?;
        let files = store
            .list()
            .with_context(|| format!("cannot list {}", store.describe()))?;
        for file in files {
            store
                .delete(&file.path)
                .with_context(|| format!("cannot delete {}", file.path))?;
        }
        Ok(())
    }

    /// Staging files (hidden, `.<name>.<pid>.<n>.tmp`) in the job's local changelog
    /// directory: uploads that the end of the run cut short may leave them.
    fn staging_files(&self) -> usize {
        let Location::Local(_) = self.config.location() else {
            return 0;
        };
        std::fs::read_dir(self.config.job_dir()).map_or(0, |entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.starts_with('.') && name.ends_with(".tmp")
                })
                .count()
        })
    }
}

/// Parses `--duration`: Flink's duration syntax, with a unit (a bare number would be
/// milliseconds there, which is never what a run's length means).
fn parse_run_duration(value: &str) -> Result<Duration, String> {
    let expected = "expected a duration with a unit, such as `30s`, `10 min` or `1h`";
    let has_unit = value.trim().bytes().any(|b| b.is_ascii_alphabetic());
    match dstl::config::parse_duration(value) {
        Some(duration) if has_unit && !duration.is_zero() => Ok(duration),
        _ => Err(expected.to_string()),
    }
}

/// `90s` as `1m30s`, for the progress line.
fn humanize(duration: Duration) -> String {
    let secs = duration.as_secs();
    match (secs / 3600, secs / 60 % 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// Changes per second, rounded, with a unit: what the progress bar and the summary show.
fn rate(per_second: f64) -> String {
    if per_second >= 1e6 {
        format!("{:.2} M changes/s", per_second / 1e6)
    } else if per_second >= 1e3 {
        format!("{:.1} k changes/s", per_second / 1e3)
    } else {
        format!("{per_second:.0} changes/s")
    }
}

/// The progress bar's rate: changes so far over the time so far, as the summary computes
/// it (indicatif's own `per_sec` is a recent, unrounded estimate).
fn average_rate(state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write) {
    let seconds = state.elapsed().as_secs_f64();
    let per_second = state.pos() as f64 / seconds;
    let _ = out.write_str(&rate(if seconds > 0.0 { per_second } else { 0.0 }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_durations_need_a_unit() {
        assert_eq!(parse_run_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_run_duration("10 min"), Ok(Duration::from_secs(600)));
        for bad in ["30", "0s", "5 parsecs", "soon", ""] {
            assert!(parse_run_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(humanize(Duration::from_secs(90)), "1m30s");
        assert_eq!(humanize(Duration::from_secs(3725)), "1h02m05s");
    }
}
