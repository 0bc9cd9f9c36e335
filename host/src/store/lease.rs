//! A storage's lease on its job: while a [`ChangelogStorage`](crate::ChangelogStorage) is
//! open, a small file `<base>/<job>/leases/<id>.lease` says so, and `dstl gc` leaves
//! alone every file of the job written since the lease was taken.
//!
//! Why: a writer keeps uploaded change sets for its next snapshot, and a file only gets a
//! manifest once a checkpoint that names it completes. When no checkpoint completes for
//! longer than gc's grace period (declined or aborted checkpoints, pre-emptive uploads, a
//! slow coordinator), the file looks like an orphan by age alone, yet the next
//! acknowledged checkpoint names it. A storage only ever holds files it wrote itself, so
//! everything of the job modified since its lease was opened is what it may hold.
//!
//! The holder refreshes the lease's modification time every [`REFRESH`]; a lease not
//! refreshed for its `expires_after` (a process that died without closing) no longer
//! protects anything, and gc may remove it. Closing the storage removes the lease.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{LocalStore, Location, S3Error, S3Settings, S3Store, Store, join_key};

/// Directory of the leases, beside `dstl/` in a job's directory.
pub const LEASE_DIR: &str = "leases";
/// Suffix of a lease file.
pub const LEASE_SUFFIX: &str = ".lease";
/// How often the holder refreshes its lease.
pub const REFRESH: Duration = Duration::from_secs(30);
/// How long a lease protects the job's files after its last refresh: long enough that a
/// process paused for minutes (a long GC pause, a stopped container) keeps its files.
pub const EXPIRES_AFTER: Duration = Duration::from_secs(600);
/// Clock difference between the lease's writer and the store tolerated by gc: files
/// modified up to this long before the lease was opened are protected too.
pub const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// What a lease file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// When the storage opened, in milliseconds since the Unix epoch (its clock).
    pub opened_ms: u64,
    /// How long the lease protects after its last refresh, in milliseconds.
    pub expires_after_ms: u64,
    /// The holder's process id, for people reading the file.
    pub pid: u32,
}

impl LeaseRecord {
    fn now() -> Self {
        Self {
            opened_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as u64,
            expires_after_ms: EXPIRES_AFTER.as_millis() as u64,
            pid: std::process::id(),
        }
    }

    /// When the holder opened; the epoch for a time out of range (protecting everything
    /// rather than failing on a damaged lease).
    pub fn opened(&self) -> SystemTime {
        UNIX_EPOCH
            .checked_add(Duration::from_millis(self.opened_ms))
            .unwrap_or(UNIX_EPOCH)
    }

    /// How long the lease protects after its last refresh.
    pub fn expires_after(&self) -> Duration {
        Duration::from_millis(self.expires_after_ms)
    }

    /// Parses a lease file. Unreadable content protects the whole job for the default
    /// expiry (a lease that cannot be understood must not be ignored).
    pub fn parse(bytes: &[u8]) -> Self {
        serde_json::from_slice(bytes).unwrap_or(Self {
            opened_ms: 0,
            expires_after_ms: EXPIRES_AFTER.as_millis() as u64,
            pid: 0,
        })
    }
}

/// Where a job's leases live.
enum LeaseDir {
    Local(PathBuf),
    S3(Box<S3Store>),
}

/// Why a lease cannot be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The lease file cannot be written.
    #[error("cannot write the lease {path}: {source}")]
    Write {
        /// The lease.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The object store cannot be reached.
    #[error(transparent)]
    S3(#[from] S3Error),
}

/// A held lease; released (its file deleted) by [`Lease::release`] or on drop.
pub(crate) struct Lease {
    path: String,
    dir: std::sync::Arc<LeaseDir>,
    stop: Option<mpsc::Sender<()>>,
    refresher: Option<std::thread::JoinHandle<()>>,
}

impl Lease {
    /// Takes a lease on `job` under `location` and starts refreshing it.
    pub fn take(
        location: &Location,
        s3: &S3Settings,
        job: &str,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<Self, LeaseError> {
        let name = format!("{}{LEASE_SUFFIX}", uuid::Uuid::new_v4());
        let bytes = serde_json::to_vec(&LeaseRecord::now()).expect("a record serializes");
        let (dir, path) = match location {
            Location::Local(base) => {
                let dir = local_lease_dir(base, job);
                let path = LocalStore::open(&dir)
                    .and_then(|store| store.create(&name, &bytes))
                    .map_err(|source| LeaseError::Write {
                        path: dir.join(&name).display().to_string(),
                        source,
                    })?;
                (LeaseDir::Local(dir), path)
            }
            Location::S3 { bucket, prefix } => {
                let key_prefix = join_key(&[prefix, job, LEASE_DIR]);
                let store = S3Store::open_at(s3, bucket, &key_prefix, runtime)?;
                let path = store
                    .create(&name, &bytes)
                    .map_err(|source| LeaseError::Write {
                        path: format!("{}/{name}", store.describe()),
                        source,
                    })?;
                (LeaseDir::S3(Box::new(store)), path)
            }
        };
        let dir = std::sync::Arc::new(dir);
        let (stop, stopped) = mpsc::channel::<()>();
        let refresher = {
            let (lease_dir, lease_path) = (dir.clone(), path.clone());
            std::thread::Builder::new()
                .name("dstl-lease".into())
                .spawn(move || {
                    // Ends when the sender is dropped (or sends).
                    while let Err(mpsc::RecvTimeoutError::Timeout) =
                        stopped.recv_timeout(REFRESH)
                    {
                        if let Err(e) = lease_dir.refresh(&lease_path, &bytes) {
                            tracing::warn!(lease = %lease_path, error = %e, "could not refresh the lease; orphan collection (dstl::gc) may treat this job's files as unprotected once it expires");
                        }
                    }
                })
                .map_err(|source| LeaseError::Write {
                    path: path.clone(),
                    source,
                })?
        };
        Ok(Self {
            path,
            dir,
            stop: Some(stop),
            refresher: Some(refresher),
        })
    }

    /// Stops refreshing and deletes the lease.
    pub fn release(mut self) {
        self.end();
    }

    fn end(&mut self) {
        drop(self.stop.take());
        if let Some(refresher) = self.refresher.take() {
            let _ = refresher.join();
        }
        if let Err(e) = self.dir.remove(&self.path) {
            tracing::warn!(lease = %self.path, error = %e, "could not delete the lease; orphan collection (dstl::gc) removes it once it expires");
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.refresher.is_some() {
            self.end();
        }
    }
}

impl LeaseDir {
    fn refresh(&self, path: &str, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            LeaseDir::Local(_) => std::fs::File::options()
                .write(true)
                .open(path)?
                .set_modified(SystemTime::now()),
            LeaseDir::S3(store) => store.overwrite(path, bytes),
        }
    }

    fn remove(&self, path: &str) -> std::io::Result<()> {
        match self {
            LeaseDir::Local(dir) => {
                super::delete_file(path)?;
                // The directory goes with the last lease, so a finished job leaves no more
                // than `dstl/` behind; another storage taking a lease meanwhile keeps it.
                let _ = std::fs::remove_dir(dir);
                Ok(())
            }
            LeaseDir::S3(store) => store.delete(path),
        }
    }
}

/// Whether `name` (a file name in a job's [`LEASE_DIR`]) is a lease.
pub fn is_lease_name(name: &str) -> bool {
    name.strip_suffix(LEASE_SUFFIX)
        .is_some_and(|id| uuid::Uuid::parse_str(id).is_ok())
}

/// The lease directory of `job` under a local base.
pub fn local_lease_dir(base: &Path, job: &str) -> PathBuf {
    base.join(job).join(LEASE_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_lease_protects_everything_instead_of_failing() {
        let garbage = LeaseRecord::parse(b"{\"opened_ms\": ");
        assert_eq!(garbage.opened(), UNIX_EPOCH);
        assert_eq!(garbage.expires_after(), EXPIRES_AFTER);
        let huge = LeaseRecord::parse(
            format!(
                "{{\"opened_ms\": {}, \"expires_after_ms\": 1, \"pid\": 1}}",
                u64::MAX
            )
            .as_bytes(),
        );
        // Far in the future, without overflowing (gc treats that as damaged).
        assert!(huge.opened() > SystemTime::now());
    }

    #[test]
    fn lease_names_are_uuids_with_the_suffix() {
        let name = format!("{}{LEASE_SUFFIX}", uuid::Uuid::new_v4());
        assert!(is_lease_name(&name));
        assert!(!is_lease_name("x.lease"));
        assert!(!is_lease_name(name.trim_end_matches(LEASE_SUFFIX)));
    }

    #[test]
    fn a_local_lease_is_written_and_removed_with_its_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let location = Location::Local(tmp.path().to_path_buf());
        let lease = Lease::take(&location, &S3Settings::default(), "job", None).unwrap();
        let dir = local_lease_dir(tmp.path(), "job");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1);
        assert!(is_lease_name(&names[0]));
        let record = LeaseRecord::parse(&std::fs::read(dir.join(&names[0])).unwrap());
        assert_eq!(record.pid, std::process::id());
        lease.release();
        assert!(!dir.exists());
    }
}
