//! Command-line interface (contract in DESIGN.md).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use dstl::codec::{self, ChangeSetReader};
use dstl::manifest::Manifest;
use dstl::workload::{self, Workload};
use dstl::{ChangelogStorage, Config};

/// A durable short-term log of keyed-state changes.
#[derive(Parser, Debug)]
#[command(name = "dstl", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulated operators append seeded changes and checkpoint; the last checkpoint of
    /// every writer is read back and verified.
    Run(RunArgs),
    /// Print every change of a snapshot, one `KEYGROUP<TAB>HEX` per line.
    Read {
        /// A manifest JSON file.
        manifest: PathBuf,
        /// Print `changes=N sha256=H` instead of the changes.
        #[arg(long)]
        digest: bool,
        /// Read the local copies instead of the remote files.
        #[arg(long)]
        local: bool,
        #[command(flatten)]
        conf: ConfArgs,
    },
    /// Human-readable dump of one changelog file.
    Inspect {
        /// The file.
        file: PathBuf,
        /// Also print every change's value.
        #[arg(long)]
        values: bool,
    },
    /// Print the effective configuration.
    Config {
        #[command(flatten)]
        conf: ConfArgs,
    },
    /// Run one standard benchmark workload in a fresh temporary directory, with a raw
    /// disk baseline measured in the same run.
    Bench(BenchArgs),
    /// List (and with --delete remove) changelog files that no live manifest references
    /// and that are older than a grace period.
    Gc(GcArgs),
}

/// Configuration sources, applied in order: defaults, `--config FILE`, `--conf`.
#[derive(Args, Debug, Default)]
struct ConfArgs {
    /// A TOML file of configuration keys.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Any configuration key, `key=value`, repeatable; overrides the file.
    #[arg(long = "conf", value_name = "KEY=VALUE")]
    conf: Vec<String>,
}

impl ConfArgs {
    /// The configuration with `base` as the default base path.
    fn build(&self, base: &str) -> anyhow::Result<Config> {
        let mut config = Config::default();
        config.set("dstl.dfs.base-path", base)?;
        if let Some(file) = &self.config {
            config.apply_file(file)?;
        }
        config.apply_pairs(self.conf.iter().map(String::as_str))?;
        Ok(config)
    }
}

/// Where the files are: a directory or an object store URL.
#[derive(Args, Debug, Default)]
struct Target {
    /// Directory for changelog files [default: ./dstl-data].
    #[arg(long, conflicts_with = "store")]
    dir: Option<PathBuf>,
    /// An object store URL instead of a directory: s3://bucket/prefix.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
}

impl Target {
    fn apply(&self, config: &mut Config) -> anyhow::Result<()> {
        if let Some(dir) = &self.dir {
            config.set("dstl.dfs.base-path", &dir.to_string_lossy())?;
        }
        if let Some(url) = &self.store {
            if !url.starts_with("s3://") {
                anyhow::bail!(
                    "--store {url}: expected s3://bucket/prefix (use --dir for a directory)"
                );
            }
            config.set("dstl.dfs.base-path", url)?;
        }
        Ok(())
    }
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// small, fanout, large, small-z (DESIGN.md), or density (many idle writers).
    #[arg(long)]
    workload: String,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// A hundredth of the work: checks that the benchmark runs, measures nothing.
    #[arg(long)]
    quick: bool,
    /// Writers of the density benchmark.
    #[arg(long, default_value_t = 10_000)]
    writers: usize,
    /// Where to make the temporary directory [default: the system's temp dir].
    #[arg(long)]
    tmp: Option<PathBuf>,
    #[command(flatten)]
    conf: ConfArgs,
}

#[derive(Args, Debug)]
struct GcArgs {
    #[command(flatten)]
    target: Target,
    /// Directory of the manifests of every checkpoint still live. Only the jobs they name
    /// are collected.
    #[arg(long, value_name = "DIR")]
    manifests: PathBuf,
    /// Also collect this job (32 hex characters), e.g. one whose manifests all expired;
    /// repeatable.
    #[arg(long = "job", value_name = "ID", value_parser = dstl::gc::parse_job)]
    jobs: Vec<String>,
    /// Only files older than this are orphans (a younger one may still be committing).
    #[arg(long, default_value = "1h", value_parser = parse_grace)]
    grace: std::time::Duration,
    /// Delete the orphans (otherwise only list them).
    #[arg(long)]
    delete: bool,
    #[command(flatten)]
    conf: ConfArgs,
}

fn parse_grace(value: &str) -> Result<std::time::Duration, String> {
    dstl::config::parse_duration(value)
        .ok_or_else(|| format!("invalid duration `{value}`: expected e.g. `1h`, `30 min`, `0`"))
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// Simulated operators (one writer each).
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Changes in total.
    #[arg(long, default_value_t = 400_000)]
    changes: u64,
    /// Bytes per change.
    #[arg(long, default_value_t = 100)]
    change_size: usize,
    /// Key groups per writer.
    #[arg(long, default_value_t = 128)]
    key_groups: i32,
    /// Appends per writer between checkpoints.
    #[arg(long, default_value_t = 10_000)]
    checkpoint_every: u64,
    /// Snappy-compress files.
    #[arg(long)]
    compression: bool,
    /// Seed of the change bytes.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[command(flatten)]
    conf: ConfArgs,
    /// After each checkpoint, atomically rewrite DIR/<writer>.json with its manifest.
    #[arg(long, value_name = "DIR")]
    manifests: Option<PathBuf>,
    /// Print the summary as one JSON object and nothing else on stdout.
    #[arg(long)]
    json: bool,
}

/// Runs a parsed command line.
pub fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run(args),
        Command::Read {
            manifest,
            digest,
            local,
            conf,
        } => read(&manifest, digest, local, &conf),
        Command::Inspect { file, values } => inspect(&file, values),
        Command::Gc(args) => gc(args),
        Command::Bench(args) => bench(args),
        Command::Config { conf } => {
            let config = conf.build(DEFAULT_DIR)?;
            config.validate()?;
            for (key, value) in config.entries() {
                println!("{key} = {value}");
            }
            Ok(())
        }
    }
}

const DEFAULT_DIR: &str = "./dstl-data";

fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut config = args.conf.build(DEFAULT_DIR)?;
    args.target.apply(&mut config)?;
    if args.compression {
        config.compression = true;
    }
    let workload = Workload {
        writers: args.writers,
        changes: args.changes,
        change_size: args.change_size,
        key_groups: args.key_groups,
        checkpoint_every: args.checkpoint_every,
        seed: args.seed,
        manifests: args.manifests.clone(),
    };
    workload.validate()?;
    let storage = ChangelogStorage::open(config)?;
    let bar = if args.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(args.changes).with_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} changes ({per_sec}, eta {eta})",
            )
            .expect("valid template"),
        )
    };
    let summary = workload::run(&storage, &workload, &|n| bar.set_position(n))?;
    bar.finish_and_clear();
    storage.close();
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "dstl run: {} writers, {} changes of {} B into {}",
            summary.writers, summary.changes, args.change_size, summary.dir
        );
        println!("  wall            {:.2} s", summary.wall_s);
        println!(
            "  appends         {:.0}/s ({:.1} MB/s payload)",
            summary.appends_per_s, summary.payload_mb_per_s
        );
        println!(
            "  checkpoints     {} (persist p50 {:.2} ms, p99 {:.2} ms)",
            summary.checkpoints, summary.persist_p50_ms, summary.persist_p99_ms
        );
        println!(
            "  files           {} ({} bytes written)",
            summary.files, summary.bytes_written
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
    }
    Ok(())
}

fn read(path: &Path, digest: bool, local: bool, conf: &ConfArgs) -> anyhow::Result<()> {
    let config = conf.build(DEFAULT_DIR)?;
    let manifest = Manifest::load(path)?;
    let handle = if local {
        manifest
            .local_handle()
            .with_context(|| format!("manifest {} has no local handle", path.display()))?
    } else {
        manifest.remote_handle()
    };
    let files = dstl::FileSource::new(Some(config.s3.clone()));
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

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn inspect(path: &Path, values: bool) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let logical = codec::logical_bytes(&bytes)
        .with_context(|| format!("{} is not a changelog file", path.display()))?;
    // Built whole before printing, so a corrupt file prints nothing but the error.
    let mut out = Vec::new();
    writeln!(out, "file            {}", path.display())?;
    writeln!(
        out,
        "compression     {}",
        if bytes[0] == codec::FLAG_SNAPPY {
            "snappy (framed)"
        } else {
            "none"
        }
    )?;
    writeln!(out, "bytes on disk   {}", bytes.len())?;
    writeln!(out, "logical bytes   {}", logical.len())?;
    let mut offset = 0u64;
    let mut index = 0;
    while offset < logical.len() as u64 {
        let mut reader = ChangeSetReader::new(&logical, offset).with_context(|| {
            format!(
                "{}: corrupt change set at logical offset {offset}",
                path.display()
            )
        })?;
        let mut groups: Vec<(i32, usize, u64)> = Vec::new();
        let mut lines = Vec::new();
        while let Some(change) = reader.next_change().with_context(|| {
            format!(
                "{}: corrupt change set at logical offset {offset}",
                path.display()
            )
        })? {
            match groups.last_mut() {
                Some(g) if g.0 == change.key_group => {
                    g.1 += 1;
                    g.2 += change.value.len() as u64;
                }
                _ => groups.push((change.key_group, 1, change.value.len() as u64)),
            }
            if values {
                lines.push(format!(
                    "      {}\t{}",
                    change.key_group,
                    hex(&change.value)
                ));
            }
        }
        let changes: usize = groups.iter().map(|g| g.1).sum();
        let payload: u64 = groups.iter().map(|g| g.2).sum();
        writeln!(
            out,
            "change set #{index} at offset {offset}: {} bytes, {} groups, {changes} changes, {payload} payload bytes",
            reader.position() - offset,
            groups.len()
        )?;
        for (key_group, count, size) in &groups {
            let label = if *key_group == codec::META_KEY_GROUP {
                "meta".to_string()
            } else {
                format!("kg {key_group}")
            };
            writeln!(out, "    {label:>8}: {count} changes, {size} bytes")?;
        }
        for line in lines {
            writeln!(out, "{line}")?;
        }
        offset = reader.position();
        index += 1;
    }
    std::io::stdout().lock().write_all(&out)?;
    Ok(())
}

fn gc(args: GcArgs) -> anyhow::Result<()> {
    let mut config = args.conf.build(DEFAULT_DIR)?;
    args.target.apply(&mut config)?;
    let live = dstl::gc::live(&args.manifests)?;
    let mut jobs = live.jobs.clone();
    jobs.extend(args.jobs.iter().cloned());
    let listing = dstl::gc::stored_files(&config, &jobs)?;
    let referenced = &live.paths;
    let report = dstl::gc::classify(
        listing.files,
        referenced,
        args.grace,
        std::time::SystemTime::now(),
    );
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "jobs collected: {}",
        jobs.iter().cloned().collect::<Vec<_>>().join(", ")
    )?;
    if !listing.skipped_jobs.is_empty() {
        writeln!(
            out,
            "jobs skipped (no manifest in {} names them; pass --job ID to collect one): {}",
            args.manifests.display(),
            listing
                .skipped_jobs
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    for orphan in &report.orphans {
        writeln!(
            out,
            "orphan\t{}\t{} bytes\t{} s old",
            orphan.file.path,
            orphan.file.size,
            orphan.age.as_secs()
        )?;
    }
    let bytes: u64 = report.orphans.iter().map(|o| o.file.size).sum();
    let verdict = if args.delete {
        let deleted = dstl::gc::delete(&config, &report)?;
        format!("deleted {deleted}")
    } else {
        "nothing deleted (pass --delete to remove them)".to_string()
    };
    writeln!(
        out,
        "{} files examined: {} referenced by {} live paths, {} younger than the grace period, {} orphans ({bytes} bytes): {verdict}",
        report.examined,
        report.referenced,
        referenced.len(),
        report.young,
        report.orphans.len()
    )?;
    Ok(())
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let root = args.tmp.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = TempDir(root.join(format!("dstl-bench-{}", uuid::Uuid::new_v4().simple())));
    std::fs::create_dir_all(&tmp.0)
        .with_context(|| format!("cannot create {}", tmp.0.display()))?;
    let mut config = args.conf.build(&tmp.0.to_string_lossy())?;
    if args.workload == "density" {
        let writers = if args.quick {
            args.writers.div_ceil(100)
        } else {
            args.writers
        };
        config.max_writers = u32::try_from(writers + 16).context("--writers is too large")?;
        let storage = ChangelogStorage::open(config)?;
        let result = workload::density(&storage, writers)?;
        if args.json {
            println!("{}", serde_json::to_string(&result)?);
        } else {
            println!(
                "density: {} writers, {:.1} µs each, {:.1} KiB RSS each ({:.0} MB -> {:.0} MB)",
                result.writers,
                result.us_per_writer,
                result.kib_per_writer,
                result.rss_before_mb,
                result.rss_after_mb
            );
        }
        return Ok(());
    }
    let (mut load, compression) = Workload::standard(&args.workload, 42)?;
    if args.quick {
        load.changes /= 100;
        load.checkpoint_every = load.checkpoint_every.div_ceil(100);
    }
    config.compression |= compression;
    let storage = ChangelogStorage::open(config)?;
    let summary = workload::run(&storage, &load, &|_| {})?;
    storage.close();
    let baseline = workload::disk_baseline_mb_per_s(&tmp.0, summary.bytes_written.max(1))?;
    let report = serde_json::json!({
        "workload": args.workload,
        "quick": args.quick,
        "baseline_disk_mb_per_s": baseline,
        "written_mb_per_s": summary.bytes_written as f64 / 1e6 / summary.wall_s,
        "disk_ratio": summary.bytes_written as f64 / 1e6 / summary.wall_s / baseline,
        "summary": summary,
    });
    if args.json {
        let mut flat = serde_json::to_value(&summary)?;
        for key in [
            "workload",
            "quick",
            "baseline_disk_mb_per_s",
            "written_mb_per_s",
            "disk_ratio",
        ] {
            flat[key] = report[key].clone();
        }
        println!("{}", serde_json::to_string(&flat)?);
    } else {
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
            "  disk: {:.0} MB/s written vs {:.0} MB/s raw sequential write + fsync (ratio {:.2})",
            report["written_mb_per_s"].as_f64().unwrap_or(0.0),
            baseline,
            report["disk_ratio"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
