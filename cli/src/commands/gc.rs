//! `dstl gc`: files no live manifest names, for the jobs the manifests name.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::{ConfArgs, DEFAULT_DIR, Target};

/// `dstl gc` options.
#[derive(Args, Debug)]
pub(super) struct GcArgs {
    #[command(flatten)]
    pub(super) target: Target,
    /// Directory of the manifests of every checkpoint still live. Only the jobs they name
    /// are collected.
    #[arg(long, value_name = "DIR")]
    pub(super) manifests: PathBuf,
    /// Also collect this job (32 hex characters), e.g. one whose manifests all expired;
    /// repeatable.
    #[arg(long = "job", value_name = "ID", value_parser = dstl::gc::parse_job)]
    pub(super) jobs: Vec<String>,
    /// Only files older than this are orphans (a younger one may still be committing).
    #[arg(long, default_value = "1h", value_parser = parse_grace)]
    pub(super) grace: std::time::Duration,
    /// Delete the orphans (otherwise only list them).
    #[arg(long)]
    pub(super) delete: bool,
    #[command(flatten)]
    pub(super) conf: ConfArgs,
}

fn parse_grace(value: &str) -> Result<std::time::Duration, String> {
    dstl::config::parse_duration(value)
        .ok_or_else(|| format!("invalid duration `{value}`: expected e.g. `1h`, `30 min`, `0`"))
}

pub(super) fn gc(args: GcArgs) -> anyhow::Result<()> {
    let mut config = args.conf.build(DEFAULT_DIR)?;
    args.target.apply(&mut config)?;
    let live = dstl::gc::live(&args.manifests)?;
    let mut jobs = live.jobs.clone();
    jobs.extend(args.jobs.iter().cloned());
    let listing = dstl::gc::stored_files(&config, &jobs)?;
    let report = dstl::gc::classify(&listing, &live, args.grace, std::time::SystemTime::now())?;
    if report.referenced == 0
        && let Some(example) = live.paths.iter().next()
        && !live.paths.iter().any(|p| lies_under(p, &config))
    {
        // Most likely `--dir`/`--store` is not where the manifests' job wrote: nothing
        // here is referenced, so every old file would count as an orphan.
        eprintln!(
            "warning: no file the manifests in {} name lies under {} (e.g. {example}): is that the base their job wrote to?",
            args.manifests.display(),
            config.base_path
        );
    }
    let list = |jobs: &BTreeSet<String>| Vec::from_iter(jobs.iter().map(String::as_str)).join(", ");
    let mut out = std::io::stdout().lock();
    writeln!(out, "jobs collected: {}", list(&jobs))?;
    if !listing.skipped_jobs.is_empty() {
        writeln!(
            out,
            "jobs skipped (no manifest in {} names them; pass --job ID to collect one): {}",
            args.manifests.display(),
            list(&listing.skipped_jobs)
        )?;
    }
    for link in &listing.skipped_links {
        writeln!(out, "skipped symbolic link (not followed)\t{link}")?;
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
        "{} files examined: {} referenced by {} live paths, {} held by an open storage (live lease), {} younger than the grace period, {} orphans ({bytes} bytes): {verdict}",
        report.examined,
        report.referenced,
        live.paths.len(),
        report.leased,
        report.young,
        report.orphans.len()
    )?;
    Ok(())
}

/// Whether a path a manifest names lies under the configured base (as given, or
/// resolved through symbolic links).
fn lies_under(path: &str, config: &dstl::Config) -> bool {
    let base = &config.base_path;
    let path = std::path::Path::new(path);
    path.starts_with(base)
        || std::fs::canonicalize(base).is_ok_and(|real| {
            path.starts_with(&real)
                || std::fs::canonicalize(path).is_ok_and(|p| p.starts_with(&real))
        })
}
