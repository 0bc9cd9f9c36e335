//! A storage's lease on its job: while a [`ChangelogStorage`](crate::ChangelogStorage) is
//! open, a small file `<base>/<job>/leases/<id>.lease` says so, and `dstl gc` leaves
//! alone every file of the job written since the lease was taken. The record, its terms
//! and why there is one are dstl-proto's `lease`; this module writes, refreshes (and
//! re-creates, if gc collected it) and removes the file, and keeps the holder's side of
//! the terms ([`LeaseWatch`]): once the lease could have expired, files written before
//! are no longer safe to name in an acknowledged checkpoint.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use dstl_proto::lease::{
    CLOCK_SKEW, LAPSES_AFTER, LEASE_DIR, LEASE_SUFFIX, LeaseOwner, LeaseRecord, REFRESH,
};

use super::{LocalStore, Location, S3Error, S3Settings, S3Store, Store, join_key};
use crate::sync::LockExt;

/// The record of a lease taken now by this process.
fn record_now() -> LeaseRecord {
    let opened_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let record = LeaseRecord::new(opened_ms, std::process::id());
    match this_process() {
        Some(owner) => record.with_owner(owner),
        None => record,
    }
}

/// This machine's boot and this process's pid namespace, as [`LeaseOwner`] names them;
/// `None` where `/proc` does not say (then leases are judged by time alone).
pub(crate) fn this_machine() -> Option<(String, String)> {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let namespace = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some((
        boot_id.trim().to_string(),
        namespace.to_string_lossy().into_owned(),
    ))
}

/// When process `pid` of this pid namespace started, in clock ticks since boot (field 22
/// of `/proc/<pid>/stat`); `None` if no such process runs.
pub(crate) fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or parentheses:
    // the fields after it start at the last `)`.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 (the state) is the first after the name, so field 22 is the 20th.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `record`'s holder is known, on this machine, to be gone
/// ([`LeaseRecord::holder_gone`]).
pub(crate) fn holder_gone_here(record: &LeaseRecord) -> bool {
    let machine = this_machine();
    record.holder_gone(
        machine
            .as_ref()
            .map(|(boot, ns)| (boot.as_str(), ns.as_str())),
        start_ticks,
    )
}

/// This process as a lease's owner.
fn this_process() -> Option<LeaseOwner> {
    let (boot_id, pid_namespace) = this_machine()?;
    Some(LeaseOwner {
        boot_id,
        pid_namespace,
        start_ticks: start_ticks(std::process::id())?,
    })
}

/// The holder's side of the lease's terms, shared by the refresher, the uploads and the
/// writers. A lease not refreshed for [`LAPSES_AFTER`] (the process was stopped, the
/// machine suspended, the store unreachable) may have expired by gc's clock, and gc may
/// have collected the job's files since: the lease has *lapsed*. Files are stamped with
/// the generation they were written in; each lapse noticed starts a new one, and a
/// snapshot naming a file of an older generation, or completing while the lease is
/// lapsed, must not be acknowledged ([`LeaseWatch::check`]).
#[derive(Debug)]
pub(crate) struct LeaseWatch {
    state: Mutex<WatchState>,
}

#[derive(Debug)]
struct WatchState {
    /// When the last refresh that succeeded started, on both clocks: the monotonic one
    /// runs on while the process is stopped, the wall clock also while the machine
    /// sleeps.
    refreshed: Instant,
    refreshed_wall: SystemTime,
    generation: u64,
}

impl WatchState {
    /// Whether the lease has lapsed at this moment; a lapse starts a new generation.
    fn observe(&mut self) -> bool {
        let monotonic = self.refreshed.elapsed();
        let wall = self.refreshed_wall.elapsed().unwrap_or_default();
        let lapsed = monotonic.max(wall) >= LAPSES_AFTER;
        if lapsed {
            self.generation += 1;
        }
        lapsed
    }
}

/// A snapshot that cannot be acknowledged: the lease lapsed, see [`LeaseWatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lapse {
    /// The lease has not been refreshed for this long.
    Now(Duration),
    /// A file it names was written before a lapse.
    Before,
}

impl std::fmt::Display for Lapse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lapse::Now(since) => write!(
                f,
                "the storage's lease on its job has not been refreshed for {} s (a lease older than {} s may have expired), so orphan collection may have deleted the files this checkpoint names; it is not acknowledged",
                since.as_secs(),
                LAPSES_AFTER.as_secs()
            ),
            Lapse::Before => f.write_str(
                "a file this checkpoint names was written before the storage's lease on its job lapsed, so orphan collection may have deleted it; the checkpoint is not acknowledged",
            ),
        }
    }
}

impl LeaseWatch {
    /// A lease refreshed just now.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(WatchState {
                refreshed: Instant::now(),
                refreshed_wall: SystemTime::now(),
                generation: 0,
            }),
        }
    }

    /// The generation a file written from now on belongs to.
    pub fn generation(&self) -> u64 {
        let mut state = self.state.locked();
        state.observe();
        state.generation
    }

    /// Whether a snapshot whose files were written in `generations` may be acknowledged
    /// now.
    pub fn check(&self, generations: impl IntoIterator<Item = u64>) -> Result<(), Lapse> {
        let mut state = self.state.locked();
        if state.observe() {
            let since = state.refreshed.elapsed();
            return Err(Lapse::Now(since));
        }
        let current = state.generation;
        if generations.into_iter().any(|g| g < current) {
            return Err(Lapse::Before);
        }
        Ok(())
    }

    /// A refresh that started at `started` (both clocks) succeeded.
    fn refreshed(&self, started: (Instant, SystemTime)) {
        let mut state = self.state.locked();
        // Whatever went unnoticed until now was a lapse all the same.
        state.observe();
        state.refreshed = started.0;
        state.refreshed_wall = started.1;
    }

    /// Makes the lease look unrefreshed for `gap`, as after a process stopped that long
    /// (dstl's tests).
    #[cfg(feature = "test-util")]
    pub fn backdate(&self, gap: Duration) {
        let mut state = self.state.locked();
        state.refreshed = state.refreshed.checked_sub(gap).unwrap_or(state.refreshed);
        state.refreshed_wall = state
            .refreshed_wall
            .checked_sub(gap)
            .unwrap_or(state.refreshed_wall);
    }
}

/// What the refresher thread is told.
enum Command {
    /// Refresh now instead of at the next interval (dstl's tests).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    RefreshNow(mpsc::Sender<()>),
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
    dir: Arc<LeaseDir>,
    watch: Arc<LeaseWatch>,
    /// Dropping it stops the refresher.
    commands: Option<mpsc::Sender<Command>>,
    refresher: Option<std::thread::JoinHandle<()>>,
    /// Disconnects when the refresher ends.
    refresher_ended: mpsc::Receiver<()>,
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
        // Leases of earlier holders of the job that no longer protect anything (a killed
        // process's, expired or with its holder gone) go now: nothing else removes them
        // while the job runs (gc runs between jobs, if at all).
        let collected = dir.collect_expired(&name, REFRESH);
        if collected > 0 {
            tracing::info!(
                job,
                collected,
                "removed expired leases of earlier holders of the job"
            );
        }
        let dir = Arc::new(dir);
        let watch = Arc::new(LeaseWatch::new());
        let (commands, received) = mpsc::channel::<Command>();
        let (ended, refresher_ended) = mpsc::channel::<()>();
        let refresher = {
            let (lease_dir, lease_path, watch) = (dir.clone(), path.clone(), watch.clone());
            std::thread::Builder::new()
                .name("dstl-lease".into())
                .spawn(move || {
                    let _ended = ended;
                    // Ends when the sender is dropped.
                    loop {
                        let done = match received.recv_timeout(REFRESH) {
                            Ok(Command::RefreshNow(done)) => Some(done),
                            Err(mpsc::RecvTimeoutError::Timeout) => None,
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        };
                        let started = (Instant::now(), SystemTime::now());
                        match lease_dir.refresh(&lease_path, &bytes) {
                            Ok(()) => watch.refreshed(started),
                            Err(e) => tracing::warn!(lease = %lease_path, error = %e, "could not refresh the lease; once it is {} s old, persists naming files written before fail (orphan collection, dstl::gc, may collect them once the lease expires)", LAPSES_AFTER.as_secs()),
                        }
                        if let Some(done) = done {
                            let _ = done.send(());
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
            watch,
            commands: Some(commands),
            refresher: Some(refresher),
            refresher_ended,
        })
    }

    /// The holder's side of the lease, for the uploads and writers.
    pub fn watch(&self) -> Arc<LeaseWatch> {
        self.watch.clone()
    }

    /// Refreshes the lease now and returns once that was tried (dstl's tests).
    #[cfg(feature = "test-util")]
    pub fn refresh_now(&self) {
        let (done, wait) = mpsc::channel();
        if let Some(commands) = &self.commands
            && commands.send(Command::RefreshNow(done)).is_ok()
        {
            let _ = wait.recv();
        }
    }

    /// Stops refreshing and deletes the lease, spending at most `limit` on both: a store
    /// that does not answer (the refresher waits for it, and so would the deletion) must
    /// not hold the close of a storage. A lease left behind expires and is collected.
    pub fn release(mut self, limit: Duration) {
        self.end(limit);
    }

    fn end(&mut self, limit: Duration) {
        let started = Instant::now();
        drop(self.commands.take());
        if let Some(refresher) = self.refresher.take() {
            match self.refresher_ended.recv_timeout(limit) {
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = refresher.join();
                }
                // It ends on its own once its bounded refresh gives up.
                _ => {
                    tracing::warn!(lease = %self.path, ?limit, "the lease refresher is still waiting for the store; not waiting for it")
                }
            }
        }
        // Leases of holders that died since this one opened (a killed TaskManager's) go
        // too, while the store answers: nothing else removes them once the job ends.
        let own = self.path.rsplit('/').next().unwrap_or_default().to_string();
        let collected = self
            .dir
            .collect_expired(&own, limit.saturating_sub(started.elapsed()) / 2);
        if collected > 0 {
            tracing::info!(
                collected,
                "removed expired leases of other holders of the job"
            );
        }
        let left = limit
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(100));
        if let Err(e) = self.dir.remove(&self.path, left) {
            tracing::warn!(lease = %self.path, error = %e, "could not delete the lease; orphan collection (dstl::gc) removes it once it expires");
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.refresher.is_some() {
            self.end(REFRESH);
        }
    }
}

impl LeaseDir {
    /// Marks the lease refreshed now, writing it anew if it is gone (gc collects a lease
    /// that expired while its holder was stopped: without it, the job's files would stay
    /// unprotected for the rest of the storage's life).
    fn refresh(&self, path: &str, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            LeaseDir::Local(dir) => {
                match std::fs::File::options().write(true).open(path) {
                    Ok(file) => return file.set_modified(SystemTime::now()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                let name = Path::new(path)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| {
                        std::io::Error::other(format!("lease path {path} has no name"))
                    })?;
                tracing::warn!(lease = %path, "the lease was gone (collected after it expired); writing it again");
                LocalStore::open(dir)?.create(name, bytes).map(|_| ())
            }
            // Bounded, so a hung store cannot hold the refresher (and a close waiting
            // for it) past the next refresh.
            LeaseDir::S3(store) => store.overwrite_within(path, bytes, REFRESH),
        }
    }

    /// Deletes the leases in this directory, other than `own`, that no longer protect
    /// their job (`LeaseRecord::protects`); returns how many. Best effort: a lease that
    /// cannot be listed, read or deleted stays for gc.
    fn collect_expired(&self, own: &str, limit: Duration) -> usize {
        let started = Instant::now();
        let left = || limit.saturating_sub(started.elapsed());
        let listed = match self {
            LeaseDir::Local(dir) => std::fs::read_dir(dir).map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let modified = e.metadata().and_then(|m| m.modified()).ok()?;
                        Some((e.path().to_string_lossy().into_owned(), modified))
                    })
                    .collect::<Vec<_>>()
            }),
            LeaseDir::S3(store) => store
                .list_within(Some(limit))
                .map(|files| files.into_iter().map(|f| (f.path, f.modified)).collect()),
        };
        let Ok(listed) = listed else {
            return 0;
        };
        let now = SystemTime::now();
        let mut collected = 0;
        for (path, modified) in listed {
            let name = path.rsplit('/').next().unwrap_or_default();
            if name == own || !is_lease_name(name) {
                continue;
            }
            if left().is_zero() {
                break;
            }
            let bytes = match self {
                LeaseDir::Local(_) => std::fs::read(&path),
                LeaseDir::S3(store) => store.read_within(&path, Some(left())),
            };
            let Ok(bytes) = bytes else {
                continue;
            };
            let record = LeaseRecord::parse(&bytes);
            let age = now.duration_since(modified).unwrap_or_default();
            if record.protects(age, holder_gone_here(&record)) {
                continue;
            }
            let removed = match self {
                LeaseDir::Local(_) => super::delete_file(&path),
                LeaseDir::S3(store) => {
                    store.delete_within(&path, Some(left().max(Duration::from_millis(100))))
                }
            };
            if removed.is_ok() {
                collected += 1;
            }
        }
        collected
    }

    fn remove(&self, path: &str, limit: Duration) -> std::io::Result<()> {
        match self {
            LeaseDir::Local(dir) => {
                super::delete_file(path)?;
                // The directory goes with the last lease, so a finished job leaves no more
                // than `dstl/` behind; another storage taking a lease meanwhile keeps it.
                let _ = std::fs::remove_dir(dir);
                Ok(())
            }
            LeaseDir::S3(store) => store.delete_within(path, Some(limit)),
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
        lease.release(Duration::from_secs(5));
        assert!(!dir.exists());
    }
}
