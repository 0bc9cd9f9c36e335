//! A storage's lease on its job: while a [`ChangelogStorage`](crate::ChangelogStorage) is
//! open, a small file `<base>/<job>/leases/<id>.lease` says so, and `dstl gc` leaves
//! alone every file of the job written since the lease was taken. The record, its terms
//! and why there is one are dstl-proto's `lease`; this module writes, refreshes and
//! removes the file.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{SystemTime, UNIX_EPOCH};

pub use dstl_proto::lease::{CLOCK_SKEW, LEASE_DIR, LEASE_SUFFIX, LeaseRecord, REFRESH};

use super::{LocalStore, Location, S3Error, S3Settings, S3Store, Store, join_key};

/// The record of a lease taken now by this process.
fn record_now() -> LeaseRecord {
    let opened_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    LeaseRecord::new(opened_ms, std::process::id())
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
        let bytes = record_now().to_json().into_bytes();
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
