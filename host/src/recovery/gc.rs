//! Orphan collection: changelog files that no live manifest references and that are
//! older than a grace period. Flink leaves these behind when a process dies between an
//! upload and the checkpoint that would have owned it.
//!
//! A collection is scoped to jobs: those its manifests name (or that are named
//! explicitly). Jobs sharing the base directory have manifests elsewhere, so their files
//! are never examined.
//!
//! Three rules keep it from deleting what is live:
//! - Files are compared by identity, not by how a path is spelled: a listed file is
//!   referenced if a manifest names its path or the same file (device and inode) by
//!   another path (a symlinked or moved base, a second mount). A manifest naming the
//!   same store location (`<job>/dstl/<file>`) under another base stops the collection.
//! - Nothing outside the base is touched: symbolic links below it are reported as
//!   skipped, never followed.
//! - An open storage's lease (`store/lease.rs`) protects every file of its job
//!   written since the storage opened: a writer holds change sets for a checkpoint that
//!   has not completed yet, and no manifest names them until it does.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::manifest::{Manifest, ManifestError, ManifestFile};
use crate::config::Config;
use crate::store::lease::{
    CLOCK_SKEW, LEASE_DIR, LeaseRecord, holder_gone_here, is_lease_name, local_lease_dir,
};
use crate::store::{Location, S3Error, S3Store, Store, StoredFile};

/// Why a collection cannot run; it then deletes nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// A manifest names a file of a listed job under another base: the listing and the
    /// manifests disagree about where the job lives, so nothing can be judged unused.
    #[error(
        "a manifest names {named}, but the file at that place in the listed base is {listed}, a different file: \
         the manifests were written for another base (or a copy of it); refusing to collect"
    )]
    ForeignBase {
        /// The path a manifest names.
        named: String,
        /// The listed file at the same store-relative location.
        listed: String,
    },
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
#[non_exhaustive]
pub struct Orphan {
    /// The file.
    pub file: StoredFile,
    /// How long ago it was last modified.
    pub age: Duration,
}

/// What a collection found.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Report {
    /// Files examined.
    pub examined: usize,
    /// Files referenced by a live manifest.
    pub referenced: usize,
    /// Unreferenced files younger than the grace period (maybe still being committed).
    pub young: usize,
    /// Unreferenced files a live lease protects: an open storage may still hold them
    /// for a checkpoint that has not completed yet.
    pub leased: usize,
    /// Unreferenced files older than the grace period.
    pub orphans: Vec<Orphan>,
}

/// What the live manifests name.
#[derive(Debug, Default)]
pub struct Live {
    /// Every path (remote and local) the manifests reference.
    pub paths: HashSet<String>,
    /// The same files by their location within a store (see [`store_key`]), with the
    /// path a manifest names each by: how a file listed under another spelling of the
    /// base is recognized (or found to belong to another base).
    pub keys: HashMap<String, String>,
    /// Device and inode of every local file the manifests name that exists: a file is
    /// the same file whatever path (symlink, second mount, moved base) leads to it.
    pub identities: HashSet<(u64, u64)>,
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
            if let Some(key) = store_key(&entry.path) {
                live.keys.insert(key, entry.path.clone());
            }
            if let Some(identity) = identity(Path::new(&entry.path), true) {
                live.identities.insert(identity);
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

/// Device and inode of a local file (following symlinks with `follow`); `None` for
/// store URLs and missing files.
fn identity(path: &Path, follow: bool) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    if path.to_str().is_some_and(|p| p.contains("://")) {
        return None;
    }
    let meta = if follow {
        std::fs::metadata(path)
    } else {
        std::fs::symlink_metadata(path)
    };
    meta.ok().map(|m| (m.dev(), m.ino()))
}

/// Where a changelog file or local copy lives within its store, independent of how the
/// base is spelled: `<job>/dstl/<file>` or `jid_<job>/taskowned/<file>`. File names are
/// fresh UUIDs, so the key names one file.
pub fn store_key(path: &str) -> Option<String> {
    job_of(path)?;
    let mut parts = path.rsplitn(4, '/');
    let (file, kind, dir) = (parts.next()?, parts.next()?, parts.next()?);
    Some(format!("{dir}/{kind}/{file}"))
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
    /// Symbolic links met while listing, neither followed nor touched: gc stays inside
    /// the base.
    pub skipped_links: Vec<String>,
    /// The leases of the jobs in scope: open storages (see `store/lease.rs`).
    pub leases: Vec<LeaseFile>,
}

/// A lease file found while listing.
#[derive(Debug, Clone)]
pub struct LeaseFile {
    /// The job it belongs to.
    pub job: String,
    /// The file.
    pub file: StoredFile,
    /// What it says.
    pub record: LeaseRecord,
    /// Its holder is known to be gone: it ran on this machine and no longer runs
    /// ([`LeaseRecord::holder_gone`]), so the lease protects nothing even before it
    /// expires.
    pub holder_gone: bool,
}

impl LeaseFile {
    /// A lease read from `file`, with whether its holder is gone as this machine sees it.
    fn read(job: &str, file: StoredFile, bytes: &[u8]) -> Self {
        let record = LeaseRecord::parse(bytes);
        let holder_gone = holder_gone_here(&record);
        Self {
            job: job.to_string(),
            file,
            record,
            holder_gone,
        }
    }

    /// Whether the lease still protects its job at `now`: its holder may still run, and
    /// refreshed it within its expiry.
    pub fn is_live(&self, now: SystemTime) -> bool {
        let age = now.duration_since(self.file.modified).unwrap_or_default();
        self.record.protects(age, self.holder_gone)
    }
}

/// Every changelog file under the configured base that belongs to one of `jobs`, plus
/// their local copies and the staging files that crashed writes left behind. Other jobs
/// sharing the base are listed as skipped, never touched: their manifests are not here.
pub fn stored_files(config: &Config, jobs: &BTreeSet<String>) -> Result<Listing, GcError> {
    let mut listing = Listing::default();
    // Whether `job` is in scope; if not, it is listed as skipped.
    let mut in_scope = |job: &str| {
        let scoped = jobs.contains(job);
        if !scoped {
            listing.skipped_jobs.insert(job.to_string());
        }
        scoped
    };
    let links = &mut listing.skipped_links;
    match config.location() {
        Location::Local(base) => {
            if base.exists() {
                // The base as given may be a link (it is the user's choice); below it,
                // nothing is followed. Listed paths are absolute, as handles are.
                let base = base.canonicalize().map_err(list_error(&base))?;
                for (name, dir) in job_dirs(&base, "dstl", links)? {
                    if is_job_id(&name) && in_scope(&name) {
                        listing.files.extend(list_dir(&dir, links)?);
                        listing.leases.extend(local_leases(&base, &name, links)?);
                    }
                }
            }
        }
        Location::S3 { bucket, prefix } => {
            let store = S3Store::open(&config.s3(), &bucket, &prefix, "")?;
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
                if parts.len() == 3
                    && jobs.contains(parts[0])
                    && parts[1] == LEASE_DIR
                    && is_lease_name(parts[2])
                {
                    let bytes = store.read(&file.path).unwrap_or_default();
                    let job = parts[0].to_string();
                    listing.leases.push(LeaseFile::read(&job, file, &bytes));
                } else if parts.len() == 3
                    && is_job_id(parts[0])
                    && parts[1] == "dstl"
                    && in_scope(parts[0])
                {
                    listing.files.push(file);
                }
            }
        }
    }
    let local = config.local_copies_root();
    if local.is_dir() {
        let local = local.canonicalize().map_err(list_error(&local))?;
        for (name, dir) in job_dirs(&local, "taskowned", links)? {
            if let Some(id) = name.strip_prefix("jid_").filter(|id| is_job_id(id))
                && in_scope(id)
            {
                listing.files.extend(list_dir(&dir, links)?);
            }
        }
    }
    Ok(listing)
}

/// The leases in `<base>/<job>/leases/`.
fn local_leases(
    base: &Path,
    job: &str,
    links: &mut Vec<String>,
) -> Result<Vec<LeaseFile>, GcError> {
    let dir = local_lease_dir(base, job);
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(meta) if meta.file_type().is_symlink() => {
            links.push(dir.display().to_string());
            return Ok(Vec::new());
        }
        _ => return Ok(Vec::new()),
    }
    let mut leases = Vec::new();
    for file in list_dir(&dir, links)? {
        let name = file.path.rsplit('/').next().unwrap_or_default();
        if is_lease_name(name) {
            // A lease that vanishes between listing and reading was released.
            let Ok(bytes) = std::fs::read(&file.path) else {
                continue;
            };
            leases.push(LeaseFile::read(job, file, &bytes));
        }
    }
    Ok(leases)
}

/// The `<entry>/<kind>` directories under `base`, by entry name, without following a
/// symlinked entry or `<kind>` (those go to `links`).
fn job_dirs(
    base: &Path,
    kind: &str,
    links: &mut Vec<String>,
) -> Result<Vec<(String, PathBuf)>, GcError> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(base).map_err(list_error(base))? {
        let entry = entry.map_err(list_error(base))?;
        let file_type = entry.file_type().map_err(list_error(base))?;
        if file_type.is_symlink() {
            links.push(entry.path().display().to_string());
            continue;
        }
        let dir = entry.path().join(kind);
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_symlink() => {
                links.push(dir.display().to_string());
            }
            Ok(meta) if meta.is_dir() => {
                dirs.push((entry.file_name().to_string_lossy().into_owned(), dir));
            }
            _ => {}
        }
    }
    Ok(dirs)
}

/// A directory's regular files, staging files of interrupted writes included; symbolic
/// links go to `links`.
fn list_dir(dir: &Path, links: &mut Vec<String>) -> Result<Vec<StoredFile>, GcError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(list_error(dir))? {
        let entry = entry.map_err(list_error(dir))?;
        // `DirEntry::metadata` does not follow symlinks.
        let meta = entry.metadata().map_err(list_error(dir))?;
        if meta.file_type().is_symlink() {
            links.push(entry.path().display().to_string());
        } else if meta.is_file() {
            files.push(StoredFile {
                path: entry.path().to_string_lossy().into_owned(),
                size: meta.len(),
                modified: meta.modified().map_err(list_error(dir))?,
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// Classifies `files` against what the `live` manifests name at time `now`. A file is
/// referenced if a manifest names it by its path or names the same file by another path
/// (device and inode); a manifest naming the same store location in another base is an
/// error, since then the listing says nothing about what that job still uses.
///
/// A live lease of a job protects every unreferenced file of that job modified since
/// the lease was taken (less a clock skew of 300 s); an expired lease is itself an orphan.
pub fn classify(
    listing: &Listing,
    live: &Live,
    grace: Duration,
    now: SystemTime,
) -> Result<Report, GcError> {
    let Listing { files, leases, .. } = listing;
    let mut report = Report {
        examined: files.len(),
        ..Report::default()
    };
    // Per job, the oldest modification time a live lease protects.
    let mut protected_since: HashMap<String, SystemTime> = HashMap::new();
    for lease in leases {
        if lease.is_live(now) {
            // A lease that claims to open in the future is damaged: it protects the
            // whole job rather than nothing.
            let opened = Some(lease.record.opened())
                .filter(|opened| *opened <= now + CLOCK_SKEW)
                .unwrap_or(std::time::UNIX_EPOCH);
            let since = opened.checked_sub(CLOCK_SKEW).unwrap_or(opened);
            protected_since
                .entry(lease.job.clone())
                .and_modify(|s| *s = (*s).min(since))
                .or_insert(since);
        } else {
            let age = now.duration_since(lease.file.modified).unwrap_or_default();
            report.orphans.push(Orphan {
                file: lease.file.clone(),
                age,
            });
        }
    }
    for file in files {
        let same_file = || {
            identity(Path::new(&file.path), false).is_some_and(|id| live.identities.contains(&id))
        };
        if live.paths.contains(&file.path) || same_file() {
            report.referenced += 1;
            continue;
        }
        if let Some(named) = store_key(&file.path).and_then(|key| live.keys.get(&key)) {
            return Err(GcError::ForeignBase {
                named: named.clone(),
                listed: file.path.clone(),
            });
        }
        let leased = job_of(&file.path)
            .and_then(|job| protected_since.get(&job))
            .is_some_and(|since| file.modified >= *since);
        if leased {
            report.leased += 1;
            continue;
        }
        let age = now.duration_since(file.modified).unwrap_or_default();
        if age < grace {
            report.young += 1;
        } else {
            report.orphans.push(Orphan {
                file: file.clone(),
                age,
            });
        }
    }
    Ok(report)
}

/// Deletes the orphans of `report`; returns how many were deleted.
pub fn delete(config: &Config, report: &Report) -> Result<usize, GcError> {
    let s3 = match config.location() {
        Location::S3 { bucket, prefix } => Some(S3Store::open(&config.s3(), &bucket, &prefix, "")?),
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
