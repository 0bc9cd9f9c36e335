//! `dstl bench`: one standard benchmark workload in a fresh temporary directory.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use dstl::ChangelogStorage;
use dstl_cli::workload::{self, Workload};

use super::ConfArgs;

/// `dstl bench` options.
#[derive(Args, Debug)]
pub(super) struct BenchArgs {
    /// small, fanout, large, small-z (BENCHMARKS.md), density (many idle writers), or
    /// recovery (many checkpoints of several writers read back).
    #[arg(long)]
    pub(super) workload: String,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub(super) json: bool,
    /// A hundredth of the work: checks that the benchmark runs, measures nothing.
    #[arg(long)]
    pub(super) quick: bool,
    /// Writers of the density benchmark.
    #[arg(long, default_value_t = 10_000)]
    pub(super) writers: usize,
    /// Where to make the temporary directory [default: the system's temp dir].
    #[arg(long)]
    pub(super) tmp: Option<PathBuf>,
    /// Keep the files in this directory instead of a temporary one; the recovery workload
    /// also writes `handles.json` there, the snapshots as Flink's harness reads them.
    #[arg(long, value_name = "DIR")]
    pub(super) keep: Option<PathBuf>,
    #[command(flatten)]
    pub(super) conf: ConfArgs,
}

/// A directory for the run, removed on drop unless it was asked to be kept.
struct TempDir(PathBuf, bool);

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub(super) fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let tmp = match &args.keep {
        Some(dir) => TempDir(dir.clone(), true),
        None => {
            let root = args.tmp.clone().unwrap_or_else(std::env::temp_dir);
            TempDir(
                root.join(format!("dstl-bench-{}", uuid::Uuid::new_v4().simple())),
                false,
            )
        }
    };
    std::fs::create_dir_all(&tmp.0)
        .with_context(|| format!("cannot create {}", tmp.0.display()))?;
    let mut config = args.conf.build(&tmp.0.to_string_lossy())?;
    if args.workload == "recovery" {
        return recovery(&args, config, &tmp.0);
    }
    if args.workload == "density" {
        let writers = if args.quick {
            args.writers.div_ceil(100)
        } else {
            args.writers
        };
        config.set("dstl.writer.max-writers", &(writers + 16).to_string())?;
        let storage = ChangelogStorage::open(config)?;
        let result = workload::density(&storage, writers)?;
        return print_result(args.json, &result, || {
            println!(
                "density: {} writers, {:.1} µs each, {:.1} KiB RSS each ({:.0} MB -> {:.0} MB)",
                result.writers,
                result.us_per_writer,
                result.kib_per_writer,
                result.rss_before_mb,
                result.rss_after_mb
            );
        });
    }
    let (mut load, compression) = Workload::standard(&args.workload, 42)?;
    if args.quick {
        load.changes /= 100;
        load.checkpoint_every = load.checkpoint_every.div_ceil(100);
    }
    if compression {
        config.set_compression(true);
    }
    let fsync = config.local_fsync;
    let job_dir = config.job_dir();
    let storage = ChangelogStorage::open(config)?;
    let summary = workload::run(&storage, &load, &|_| {})?;
    storage.close();
    // The baselines start from a clean page cache: the run's files are gone and written
    // back, so neither competes with the other's dirty pages.
    let _ = std::fs::remove_dir_all(&job_dir);
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    let bytes = summary.bytes_written.max(1);
    let buffered = workload::disk_baseline_mb_per_s(&tmp.0, bytes, false)?;
    unsafe { libc::sync() };
    let durable = workload::disk_baseline_mb_per_s(&tmp.0, bytes, true)?;
    unsafe { libc::sync() };
    let direct = workload::direct_baseline_mb_per_s(&tmp.0, bytes)?;
    // The run is compared with the baseline doing the same: fsync'd or not.
    let baseline = if fsync { durable } else { buffered };
    let written = summary.bytes_written as f64 / 1e6 / summary.wall_s;
    let report = serde_json::json!({
        "workload": args.workload,
        "quick": args.quick,
        "fsync": fsync,
        "baseline_disk_mb_per_s": durable,
        "baseline_buffered_mb_per_s": buffered,
        "baseline_direct_mb_per_s": direct,
        "written_mb_per_s": written,
        "disk_ratio": written / baseline,
    });
    let mut flat = serde_json::to_value(&summary)?;
    for (key, value) in report.as_object().expect("an object") {
        flat[key] = value.clone();
    }
    print_result(args.json, &flat, || {
        println!(
            "{}: {:.0} appends/s, {:.1} MB/s payload, persist p50 {:.1} ms p99 {:.1} ms, {} files, peak RSS {:.0} MB, {:.2} s",
            args.workload,
            summary.appends_per_s,
            summary.payload_mb_per_s,
            summary.persist_p50_ms,
            summary.persist_p99_ms,
            summary.files,
            summary.peak_rss_mb,
            summary.wall_s
        );
        println!(
            "  disk: {written:.0} MB/s written vs {baseline:.0} MB/s plain sequential write{} (ratio {:.2}; buffered {buffered:.0} MB/s, fsync'd {durable:.0} MB/s, O_DIRECT {})",
            if fsync { " + fsync" } else { ", buffered" },
            written / baseline,
            direct.map_or_else(|| "refused".to_string(), |d| format!("{d:.0} MB/s"))
        );
    })
}

/// Prints `result` as one JSON object under `--json`; otherwise `human` prints it.
fn print_result(
    json: bool,
    result: &impl serde::Serialize,
    human: impl FnOnce(),
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(result)?);
    } else {
        human();
    }
    Ok(())
}

fn recovery(
    args: &BenchArgs,
    mut config: dstl::Config,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    use dstl_cli::workload::recovery::{self, RecoveryWorkload};
    let mut load = RecoveryWorkload::standard();
    if args.quick {
        load.changes /= 25;
        load.checkpoint_every /= 25;
    }
    config.set_compression(true);
    let storage = ChangelogStorage::open(config)?;
    let started = std::time::Instant::now();
    let snapshots = recovery::write(&storage, &load)?;
    let write_time = started.elapsed();
    let summary = recovery::read_back(&storage, &snapshots, write_time)?;
    if args.keep.is_some() {
        recovery::write_handle_list(&snapshots, &dir.join("handles.json"))?;
    }
    storage.close();
    let mut value = serde_json::to_value(&summary)?;
    value["workload"] = "recovery".into();
    value["quick"] = args.quick.into();
    print_result(args.json, &value, || {
        println!(
            "recovery: {} snapshots ({} (file, offset) pairs over {} files, {} changes) read in {:.3} s with the cache, {:.3} s without; verified {}",
            summary.snapshots,
            summary.pairs,
            summary.files,
            summary.changes,
            summary.read_s,
            summary.read_uncached_s,
            summary.verified
        );
    })?;
    if !summary.verified {
        anyhow::bail!("a snapshot did not read back what was appended");
    }
    Ok(())
}
