//! Orphan collection: changelog files that no live manifest references and that are
//! older than a grace period. Flink leaves these behind when a process dies between an
//! upload and the checkpoint that would have owned it (spec §12.9).

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Context;

use crate::config::Config;
use crate::manifest::Manifest;
use crate::store::{LocalStore, Location, S3Store, Store, StoredFile};

/// A file no live manifest references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// The file.
    pub file: StoredFile,
    /// How long ago it was last modified.
    pub age: Duration,
}

/// What a collection found.
#[derive(Debug, Default)]
pub struct Report {
    /// Files examined.
    pub examined: usize,
    /// Files referenced by a live manifest.
    pub referenced: usize,
    /// Unreferenced files younger than the grace period (maybe still being committed).
    pub young: usize,
    /// Unreferenced files older than the grace period.
    pub orphans: Vec<Orphan>,
}

/// Every path (remote and local) named by the manifests in `dir`. Any manifest that does
/// not parse is an error: collecting with an incomplete picture could delete live data.
pub fn referenced_paths(dir: &Path) -> anyhow::Result<HashSet<String>> {
    let mut paths = HashSet::new();
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the manifest directory {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let manifest = Manifest::load(&path)?;
        paths.extend(manifest.entries.iter().map(|e| e.path.clone()));
        if let Some(local) = &manifest.local {
            paths.extend(local.entries.iter().map(|e| e.path.clone()));
        }
    }
    Ok(paths)
}

fn is_job_id(name: &str) -> bool {
    name.len() == 32
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Every changelog file under the configured base (all jobs), plus local copies and
/// staging files that crashed writes left behind.
pub fn stored_files(config: &Config) -> anyhow::Result<Vec<StoredFile>> {
    let mut files = Vec::new();
    match config.location() {
        Location::Local(base) => {
            if base.exists() {
                for job in std::fs::read_dir(&base)
                    .with_context(|| format!("cannot list {}", base.display()))?
                {
                    let job = job?;
                    let name = job.file_name().to_string_lossy().into_owned();
                    let dir = job.path().join("dstl");
                    if is_job_id(&name) && dir.is_dir() {
                        files.extend(list_dir(&dir)?);
                    }
                }
            }
        }
        Location::S3 { bucket, prefix } => {
            let store =
                S3Store::open(&config.s3, &bucket, &prefix, "").map_err(anyhow::Error::msg)?;
            let base = if prefix.is_empty() {
                format!("s3://{bucket}/")
            } else {
                format!("s3://{bucket}/{prefix}/")
            };
            for file in store.list()? {
                let relative = file.path.strip_prefix(&base).unwrap_or_default();
                let parts: Vec<&str> = relative.split('/').collect();
                if parts.len() == 3 && is_job_id(parts[0]) && parts[1] == "dstl" {
                    files.push(file);
                }
            }
        }
    }
    let local = config
        .local_dir
        .clone()
        .unwrap_or_else(|| match config.location() {
            Location::Local(base) => base.join("local"),
            Location::S3 { .. } => "dstl-local".into(),
        });
    if local.is_dir() {
        for job in std::fs::read_dir(&local)? {
            let dir = job?.path().join("taskowned");
            if dir.is_dir() {
                files.extend(list_dir(&dir)?);
            }
        }
    }
    Ok(files)
}

/// A directory's files, staging files of interrupted writes included.
fn list_dir(dir: &Path) -> anyhow::Result<Vec<StoredFile>> {
    Ok(LocalStore::open(dir)?.files(true)?)
}

/// Classifies `files` against `referenced` at time `now`.
pub fn classify(
    files: Vec<StoredFile>,
    referenced: &HashSet<String>,
    grace: Duration,
    now: SystemTime,
) -> Report {
    let mut report = Report {
        examined: files.len(),
        ..Report::default()
    };
    for file in files {
        if referenced.contains(&file.path) {
            report.referenced += 1;
            continue;
        }
        let age = now.duration_since(file.modified).unwrap_or_default();
        if age < grace {
            report.young += 1;
        } else {
            report.orphans.push(Orphan { file, age });
        }
    }
    report
}

/// Deletes the orphans of `report`; returns how many were deleted.
pub fn delete(config: &Config, report: &Report) -> anyhow::Result<usize> {
    let s3 = match config.location() {
        Location::S3 { bucket, prefix } => {
            Some(S3Store::open(&config.s3, &bucket, &prefix, "").map_err(anyhow::Error::msg)?)
        }
        Location::Local(_) => None,
    };
    for orphan in &report.orphans {
        let path = &orphan.file.path;
        match (&s3, path.starts_with("s3://")) {
            (Some(s3), true) => s3.delete(path),
            _ => crate::store::delete_file(path),
        }
        .with_context(|| format!("cannot delete {path}"))?;
    }
    Ok(report.orphans.len())
}
