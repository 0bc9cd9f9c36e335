//! Orphan collection: changelog files that no live manifest references and that are
//! older than a grace period. Flink leaves these behind when a process dies between an
//! upload and the checkpoint that would have owned it.
//!
//! A collection is scoped to jobs: those its manifests name (or that are named
//! explicitly). Jobs sharing the base directory have manifests elsewhere, so their files
//! are never examined.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::manifest::{Manifest, ManifestError};
use crate::config::Config;
use crate::store::{LocalStore, Location, S3Error, S3Store, Store, StoredFile};

/// Why a collection cannot run; it then deletes nothing.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// The manifest directory cannot be read.
    #[error("cannot read the manifest directory {}: {source}", dir.display())]
    ManifestDir {
        /// The directory.
        dir: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A manifest does not load: collecting with half the picture could delete live data.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The manifest directory holds no manifest: every file would look unreferenced.
    #[error(
        "the manifest directory {} holds no manifest (*.json): refusing to collect, since every file would look unreferenced",
        dir.display()
    )]
    NoManifest {
        /// The directory.
        dir: std::path::PathBuf,
    },
    /// Files cannot be listed.
    #[error("cannot list {what}: {source}")]
    List {
        /// The directory or store.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The object store cannot be reached.
    #[error(transparent)]
    S3(#[from] S3Error),
    /// An orphan cannot be deleted (the ones before it were).
    #[error("cannot delete {path}: {source}")]
    Delete {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn list_error(what: &Path) -> impl FnOnce(std::io::Error) -> GcError + '_ {
    move |source| GcError::List {
        what: what.display().to_string(),
        source,
    }
}

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

/// What the live manifests name.
#[derive(Debug, Default)]
pub struct Live {
    /// Every path (remote and local) the manifests reference.
    pub paths: HashSet<String>,
    /// The jobs those paths belong to: the collection's scope.
    pub jobs: BTreeSet<String>,
    /// Manifests read.
    pub manifests: usize,
}

/// Reads every manifest in `dir`. Any manifest that does not parse is an error, and so is a
/// directory with no manifest at all: collecting with an incomplete (or empty) picture
/// could delete live data.
pub fn live(dir: &Path) -> Result<Live, GcError> {
    let mut live = Live::default();
    let manifest_dir = |source| GcError::ManifestDir {
        dir: dir.to_path_buf(),
        source,
    };
    let entries = std::fs::read_dir(dir).map_err(manifest_dir)?;
    for entry in entries {
        let path = entry.map_err(manifest_dir)?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let manifest = Manifest::load(&path)?;
        live.manifests += 1;
        let local = manifest.local.iter().flat_map(|l| &l.entries);
        for entry in manifest.entries.iter().chain(local) {
            if let Some(job) = job_of(&entry.path) {
                live.jobs.insert(job);
            }
            live.paths.insert(entry.path.clone());
        }
    }
    if live.manifests == 0 {
        return Err(GcError::NoManifest {
            dir: dir.to_path_buf(),
        });
    }
    Ok(live)
}

/// The job a changelog file or local copy belongs to: `.../<job>/dstl/<file>` or
/// `.../jid_<job>/taskowned/<file>`.
pub fn job_of(path: &str) -> Option<String> {
    let mut parts = path.rsplit('/').skip(1);
    let (kind, dir) = (parts.next()?, parts.next()?);
    let job = match kind {
        "dstl" => dir,
        "taskowned" => dir.strip_prefix("jid_")?,
        _ => return None,
    };
    is_job_id(job).then(|| job.to_string())
}

fn is_job_id(name: &str) -> bool {
    name.len() == 32
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks a job id given on the command line.
pub fn parse_job(value: &str) -> Result<String, String> {
    if is_job_id(value) {
        Ok(value.to_string())
    } else {
        Err(format!(
            "invalid job id `{value}`: expected 32 lowercase hexadecimal characters"
        ))
    }
}

/// The files of the jobs in scope, and the jobs found under the base but left alone.
#[derive(Debug, Default)]
pub struct Listing {
    /// Changelog files, local copies and staging files of the jobs in scope.
    pub files: Vec<StoredFile>,
    /// Jobs with files under the base (or the local-copy directory) that are out of scope.
    pub skipped_jobs: BTreeSet<String>,
}

/// Every changelog file under the configured base that belongs to one of `jobs`, plus
/// their local copies and the staging files that crashed writes left behind. Other jobs
/// sharing the base are listed as skipped, never touched: their manifests are not here.
pub fn stored_files(config: &Config, jobs: &BTreeSet<String>) -> Result<Listing, GcError> {
    let mut listing = Listing::default();
    let mut take = |job: &str, files: &mut dyn FnMut() -> Result<Vec<StoredFile>, GcError>| {
        if jobs.contains(job) {
            listing.files.extend(files()?);
        } else {
            listing.skipped_jobs.insert(job.to_string());
        }
        Ok::<(), GcError>(())
    };
    match config.location() {
        Location::Local(base) => {
            if base.exists() {
                for job in std::fs::read_dir(&base).map_err(list_error(&base))? {
                    let job = job.map_err(list_error(&base))?;
                    let name = job.file_name().to_string_lossy().into_owned();
                    let dir = job.path().join("dstl");
                    if is_job_id(&name) && dir.is_dir() {
                        take(&name, &mut || list_dir(&dir))?;
                    }
                }
            }
        }
        Location::S3 { bucket, prefix } => {
            let store = S3Store::open(&config.s3, &bucket, &prefix, "")?;
            let base = if prefix.is_empty() {
                format!("s3://{bucket}/")
            } else {
                format!("s3://{bucket}/{prefix}/")
            };
            let listed = store.list().map_err(|source| GcError::List {
                what: store.describe(),
                source,
            })?;
            for file in listed {
                let relative = file.path.strip_prefix(&base).unwrap_or_default();
                let parts: Vec<&str> = relative.split('/').collect();
                if parts.len() == 3 && is_job_id(parts[0]) && parts[1] == "dstl" {
                    let job = parts[0].to_string();
                    let mut file = Some(file);
                    take(&job, &mut || Ok(file.take().into_iter().collect()))?;
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
        for job in std::fs::read_dir(&local).map_err(list_error(&local))? {
            let job = job.map_err(list_error(&local))?;
            let name = job.file_name().to_string_lossy().into_owned();
            let dir = job.path().join("taskowned");
            if let Some(id) = name.strip_prefix("jid_").filter(|id| is_job_id(id))
                && dir.is_dir()
            {
                take(id, &mut || list_dir(&dir))?;
            }
        }
    }
    Ok(listing)
}

/// A directory's files, staging files of interrupted writes included.
fn list_dir(dir: &Path) -> Result<Vec<StoredFile>, GcError> {
    LocalStore::open(dir)
        .and_then(|store| store.files(true))
        .map_err(list_error(dir))
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
pub fn delete(config: &Config, report: &Report) -> Result<usize, GcError> {
    let s3 = match config.location() {
        Location::S3 { bucket, prefix } => Some(S3Store::open(&config.s3, &bucket, &prefix, "")?),
        Location::Local(_) => None,
    };
    for orphan in &report.orphans {
        let path = &orphan.file.path;
        match (&s3, path.starts_with("s3://")) {
            (Some(s3), true) => s3.delete(path),
            _ => crate::store::delete_file(path),
        }
        .map_err(|source| GcError::Delete {
            path: path.clone(),
            source,
        })?;
    }
    Ok(report.orphans.len())
}
