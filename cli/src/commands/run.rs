//! `dstl run`: the main job.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use dstl::ChangelogStorage;
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
    };
    workload.validate()?;
    // Before the storage opens: it registers its metrics with the recorder installed then.
    if let Some(address) = args.prometheus {
        let bound = prometheus::serve(address)?;
        eprintln!("dstl: serving Prometheus metrics at http://{bound}/metrics");
    }
    let storage = ChangelogStorage::open(config)?;
    let bar = if args.json {
        indicatif::ProgressBar::hidden()
    } else if let Some(duration) = args.duration {
        let bar = indicatif::ProgressBar::new_spinner().with_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{{spinner}} [{{elapsed_precise}} of {}] {{human_pos}} changes ({{rate}})",
                humanize(duration)
            ))
            .expect("valid template")
            .with_key("rate", average_rate),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    } else {
        indicatif::ProgressBar::new(args.changes).with_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} changes ({rate}, eta {eta})",
            )
            .expect("valid template")
            .with_key("rate", average_rate),
        )
    };
    let progress = |n| bar.set_position(n);
    let summary = match args.duration {
        Some(duration) => workload::run_for(&storage, &workload, duration, &progress)?,
        None => workload::run(&storage, &workload, &progress)?,
    };
    bar.finish_and_clear();
    storage.close();
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "dstl run: {} writer{}, {} changes of {} B into {}",
            summary.writers,
            if summary.writers == 1 { "" } else { "s" },
            summary.changes,
            args.change_size,
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
    let per_second = if seconds > 0.0 {
        state.pos() as f64 / seconds
    } else {
        0.0
    };
    let _ = out.write_str(&rate(per_second));
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
