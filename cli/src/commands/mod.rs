//! Command-line interface: one file per subcommand (a contract other tools rely on:
//! README.md, "CLI").

mod bench;
mod gc;
mod inspect;
pub mod logging;
mod prometheus;
mod read;
mod run;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use dstl::Config;

use self::bench::BenchArgs;
use self::gc::GcArgs;
pub use self::run::Interrupted;
use self::run::RunArgs;

/// A durable short-term log of keyed-state changes.
#[derive(Parser, Debug)]
#[command(name = "dstl", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines on stderr as `text` or as `json` (one object per line, with the spans);
    /// `RUST_LOG` filters them (default `warn`).
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Text)]
    pub log_format: logging::LogFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulated operators append seeded changes and checkpoint, and the files of
    /// subsumed checkpoints are deleted as the run goes; the last checkpoint of every
    /// writer is read back and verified.
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
    /// Read many snapshots, as a recovery does (each file read once while in use), from
    /// handle lists in the Flink harness's format (`{"snapshots": [{"name",
    /// "keyGroupRange", "handles": [{"path", "offset", "fileSize"}]}]}`) and dstl
    /// manifests; prints `NAME<TAB>CHANGES<TAB>SHA256` per snapshot (a manifest's NAME is
    /// its `writer`, else its file name without `.json`).
    ReadList {
        /// Handle lists, manifests (told apart by their `snapshots` or `entries` field),
        /// or directories of them (every `*.json` file, in name order, as `dstl run
        /// --manifests DIR` writes them).
        #[arg(required = true, value_name = "FILE|DIR")]
        inputs: Vec<PathBuf>,
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
pub(super) struct ConfArgs {
    /// A TOML file of configuration keys.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Any configuration key, `key=value`, repeatable; overrides the file.
    #[arg(long = "conf", value_name = "KEY=VALUE")]
    conf: Vec<String>,
}

impl ConfArgs {
    /// The configuration with `base` as the default base path.
    pub(super) fn build(&self, base: &str) -> anyhow::Result<Config> {
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
pub(super) struct Target {
    /// Base directory: changelog files go to <DIR>/<job-id>/dstl/ [default: ./dstl-data;
    /// `dstl run` without --keep or --manifests: a fresh temporary directory].
    #[arg(long, conflicts_with = "store")]
    dir: Option<PathBuf>,
    /// An object store URL instead of a directory: s3://bucket/prefix.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
}

impl Target {
    pub(super) fn apply(&self, config: &mut Config) -> anyhow::Result<()> {
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

/// Runs a parsed command line.
pub fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Read {
            manifest,
            digest,
            local,
            conf,
        } => read::read(&manifest, digest, local, &conf),
        Command::ReadList { inputs, conf } => read::read_list(&inputs, &conf),
        Command::Inspect { file, values } => inspect::inspect(&file, values),
        Command::Gc(args) => gc::gc(args),
        Command::Bench(args) => bench::bench(args),
        Command::Config { conf } => {
            let config = conf.build(DEFAULT_DIR)?;
            config.validate()?;
            print!("{}", config_toml(&config));
            Ok(())
        }
    }
}

pub(super) const DEFAULT_DIR: &str = "./dstl-data";

/// The effective configuration as TOML that `--config` reads back: every value a string
/// in the syntax `--conf` takes; a key with no value of its own (S3 settings left to the
/// environment, the secret key, the default local-copy directory) is a comment saying
/// where its value comes from.
fn config_toml(config: &dstl::Config) -> String {
    let mut out = String::new();
    for (key, value) in config.entries() {
        let quoted = |v: &str| toml::Value::String(v.to_string()).to_string();
        let line = match key {
            "dstl.local-recovery.dir" => match &config.local_dir {
                Some(dir) => format!("{key} = {}", quoted(dir)),
                None => format!("# {key}: unset, local copies go to {value}"),
            },
            "dstl.s3.secret-access-key" if value == "(set)" => {
                format!("# {key}: set, not printed")
            }
            _ if value.starts_with('(') => format!("# {key}: unset {value}"),
            _ => format!("{key} = {}", quoted(&value)),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Lowercase hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
