//! `dstl run`: the main job.

use std::path::PathBuf;

use clap::Args;
use dstl::ChangelogStorage;
use dstl::workload::{self, Workload};

use super::{ConfArgs, DEFAULT_DIR, Target};

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
    /// Bytes per change.
    #[arg(long, default_value_t = 100)]
    pub(super) change_size: usize,
    /// Key groups per writer.
    #[arg(long, default_value_t = 128)]
    pub(super) key_groups: i32,
    /// Appends per writer between checkpoints.
    #[arg(long, default_value_t = 10_000)]
    pub(super) checkpoint_every: u64,
    /// Snappy-compress files.
    #[arg(long)]
    pub(super) compression: bool,
    /// Seed of the change bytes.
    #[arg(long, default_value_t = 42)]
    pub(super) seed: u64,
    #[command(flatten)]
    pub(super) conf: ConfArgs,
    /// After each checkpoint, atomically rewrite DIR/<writer>.json with its manifest.
    #[arg(long, value_name = "DIR")]
    pub(super) manifests: Option<PathBuf>,
    /// Print the summary as one JSON object and nothing else on stdout.
    #[arg(long)]
    pub(super) json: bool,
}

pub(super) fn run(args: RunArgs) -> anyhow::Result<()> {
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
