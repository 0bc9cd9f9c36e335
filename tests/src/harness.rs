//! What every black-box test needs: a storage over a temporary directory (or a SeaweedFS
//! bucket) configured with `key=value` pairs, snapshots read back, the files a directory
//! or a snapshot holds, and the typed error inside a result.
//!
//! Conventions:
//! - `conf` is a list of `key=value` pairs as `dstl run --conf` takes them. They are
//!   applied in order after the harness's defaults ([`DEFAULT_CONF`]), so they override
//!   them; a bad pair fails the test.
//! - The paths a handle names are `String`s, exactly as the handle spells them
//!   ([`remote_paths`], [`local_paths`], [`snapshot_paths`]); what a directory holds is
//!   `PathBuf`s ([`files`], [`changelog_files`]).
//! - Every helper that can fail panics with a message naming what failed (and, through
//!   `#[track_caller]`, the caller's line), so a test reads as a list of expectations.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::{Duration, SystemTime};

use dstl::{
    ChangelogHandle, ChangelogStorage, Config, Error, KeyGroupRange, ReadError, SnapshotResult,
    Store, StoredFile, Writer, WriterError, gc,
};
use tempfile::TempDir;

use crate::fault_store::FaultStore;
use crate::seaweed::Seaweed;

/// The key-group range of most test writers: Flink's default of 128 key groups.
pub const RANGE: KeyGroupRange = KeyGroupRange { start: 0, end: 127 };

/// Pairs every storage the harness opens starts from: a small instance pool (tests create
/// a few writers; the default pool of 1024 costs memory and start-up time).
pub const DEFAULT_CONF: &[&str] = &["dstl.writer.max-writers=8"];

/// Bound for anything that must happen "eventually"; never reached when things work.
pub const EVENTUALLY: Duration = Duration::from_secs(60);

/// The configuration of a storage over the local directory `dir`: files go to
/// `dir/<job-id>/dstl` ([`Config::job_dir`]); [`DEFAULT_CONF`], then `conf`.
#[track_caller]
pub fn config(dir: &Path, conf: &[&str]) -> Config {
    let mut config = Config::new();
    config
        .set_base_path(dir)
        .unwrap_or_else(|e| panic!("bad test directory: {e}"));
    config
        .apply_pairs(DEFAULT_CONF.iter().chain(conf).copied())
        .unwrap_or_else(|e| panic!("bad test configuration {conf:?}: {e}"));
    config
}

/// A storage over the local directory `dir` (see [`config`]).
#[track_caller]
pub fn open(dir: &Path, conf: &[&str]) -> ChangelogStorage {
    ChangelogStorage::open(config(dir, conf))
        .unwrap_or_else(|e| panic!("cannot open a storage over {}: {e}", dir.display()))
}

/// What `open` opens over a fresh temporary directory, and that directory: keep it (as
/// `_tmp` if unused) as long as what was opened, since dropping it deletes the files.
#[track_caller]
pub fn in_temp_dir<T>(open: impl FnOnce(&Path) -> T) -> (TempDir, T) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("cannot create a test directory: {e}"));
    let opened = open(dir.path());
    (dir, opened)
}

/// A storage over a fresh temporary directory (see [`open`] and [`in_temp_dir`]).
#[track_caller]
pub fn open_temp(conf: &[&str]) -> (TempDir, ChangelogStorage) {
    in_temp_dir(|dir| open(dir, conf))
}

/// A storage configured as [`open`] does whose uploads go to the store `store` builds
/// from that configuration (usually over its [`Config::job_dir`]); returns both.
#[track_caller]
pub fn open_with_store<S: Store>(
    dir: &Path,
    conf: &[&str],
    store: impl FnOnce(&Config) -> Arc<S>,
) -> (ChangelogStorage, Arc<S>) {
    let config = config(dir, conf);
    let store = store(&config);
    let storage = ChangelogStorage::builder(config)
        .store(store.clone())
        .open()
        .unwrap_or_else(|e| panic!("cannot open a storage over {}: {e}", dir.display()));
    (storage, store)
}

/// A storage whose uploads go to a [`FaultStore`] over its job directory, with no fault
/// planned yet.
#[track_caller]
pub fn open_faulty(dir: &Path, conf: &[&str]) -> (ChangelogStorage, Arc<FaultStore>) {
    open_with_store(dir, conf, |config| FaultStore::new(&config.job_dir()))
}

/// A storage on `server`'s bucket under `prefix` (`s3://<bucket>/<prefix>`), with the
/// server's endpoint and credentials and at most 16 writers, then `conf`.
#[track_caller]
pub fn open_s3(server: &Seaweed, prefix: &str, conf: &[&str]) -> ChangelogStorage {
    let mut config = Config::default();
    let base = format!("s3://{}/{prefix}", server.bucket);
    config
        .set("dstl.dfs.base-path", &base)
        .unwrap_or_else(|e| panic!("bad base path {base}: {e}"));
    let server_conf = server.conf();
    config
        .apply_pairs(
            ["dstl.writer.max-writers=16"]
                .into_iter()
                .chain(server_conf.iter().map(String::as_str))
                .chain(conf.iter().copied()),
        )
        .unwrap_or_else(|e| panic!("bad test configuration {conf:?}: {e}"));
    ChangelogStorage::open(config)
        .unwrap_or_else(|e| panic!("cannot open a storage on {base}: {e}"))
}

/// Persists everything from `from` under checkpoint `checkpoint` and waits for it;
/// returns the snapshot and the sequence number it ends at (exclusive), for a later
/// `confirm(from, to, checkpoint)`.
#[track_caller]
pub fn persist(writer: &Writer, from: u64, checkpoint: i64) -> (SnapshotResult, u64) {
    let to = writer.next_sequence_number().unwrap();
    let snapshot = writer.persist(from, checkpoint).unwrap().wait().unwrap();
    (snapshot, to)
}

/// [`persist`], then confirms what it persisted; returns the same.
#[track_caller]
pub fn persist_confirmed(writer: &Writer, from: u64, checkpoint: i64) -> (SnapshotResult, u64) {
    let (snapshot, to) = persist(writer, from, checkpoint);
    writer
        .confirm(from, to, checkpoint)
        .unwrap_or_else(|e| panic!("cannot confirm checkpoint {checkpoint}: {e}"));
    (snapshot, to)
}

/// One whole checkpoint: appends `value` (to key group `checkpoint mod 128`), persists
/// everything from `from` and confirms it. Returns the snapshot and the sequence number
/// the next checkpoint starts from, or the first error.
pub fn checkpoint(
    writer: &Writer,
    from: u64,
    checkpoint: i64,
    value: &[u8],
) -> Result<(SnapshotResult, u64), Error> {
    writer.append(checkpoint as i32 % 128, value)?;
    let to = writer.next_sequence_number()?;
    let snapshot = writer.persist(from, checkpoint)?.wait()?;
    writer.confirm(from, to, checkpoint)?;
    Ok((snapshot, to))
}

/// Reads `handle` back: `(key group, value)` of every change in order (metadata has key
/// group -1).
pub fn read_changes(
    storage: &ChangelogStorage,
    handle: &ChangelogHandle,
) -> Result<Vec<(i32, Vec<u8>)>, ReadError> {
    Ok(storage
        .read(handle)?
        .into_iter()
        .map(|c| (c.key_group, c.value))
        .collect())
}

/// [`read_changes`], which must succeed.
#[track_caller]
pub fn changes(storage: &ChangelogStorage, handle: &ChangelogHandle) -> Vec<(i32, Vec<u8>)> {
    read_changes(storage, handle).unwrap_or_else(|e| panic!("the handle does not read back: {e}"))
}

/// The values of every change of `handle` in order, without their key groups.
#[track_caller]
pub fn payloads(storage: &ChangelogStorage, handle: &ChangelogHandle) -> Vec<Vec<u8>> {
    changes(storage, handle)
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

/// Changes grouped by key group, each group in order: what a reader may rely on (the
/// order of groups within a change set is not part of the format).
pub fn by_key_group(
    changes: impl IntoIterator<Item = (i32, Vec<u8>)>,
) -> BTreeMap<i32, Vec<Vec<u8>>> {
    let mut groups: BTreeMap<i32, Vec<Vec<u8>>> = BTreeMap::new();
    for (key_group, value) in changes {
        groups.entry(key_group).or_default().push(value);
    }
    groups
}

/// The file of every entry of the snapshot's remote handle, in order (a file holding
/// several of its change sets appears once per change set).
pub fn remote_paths(snapshot: &SnapshotResult) -> Vec<String> {
    handle_paths(&snapshot.remote)
}

/// The file of every entry of the snapshot's local handle, in order; the snapshot must
/// have one.
#[track_caller]
pub fn local_paths(snapshot: &SnapshotResult) -> Vec<String> {
    let local = snapshot
        .local
        .as_ref()
        .expect("snapshot has a local handle");
    handle_paths(local)
}

/// Every file the snapshot names: its remote entries', then its local entries' (if it
/// has a local handle).
pub fn snapshot_paths(snapshot: &SnapshotResult) -> Vec<String> {
    let mut paths = remote_paths(snapshot);
    paths.extend(snapshot.local.iter().flat_map(handle_paths));
    paths
}

fn handle_paths(handle: &ChangelogHandle) -> Vec<String> {
    handle
        .entries
        .iter()
        .map(|e| e.handle.path.clone())
        .collect()
}

/// Every entry of `dir`, staging files of writes in progress (or left behind) included,
/// sorted. A directory that does not exist holds nothing; any other error fails the test.
#[track_caller]
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => panic!("cannot list {}: {e}", dir.display()),
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| {
            e.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
                .path()
        })
        .collect();
    files.sort();
    files
}

/// [`files`] without the hidden staging files a local store writes before linking a
/// file into place: the changelog files (or local copies) handles can name.
#[track_caller]
pub fn changelog_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = files(dir);
    files.retain(|p| {
        p.file_name()
            .is_some_and(|n| !n.to_string_lossy().starts_with('.'))
    });
    files
}

/// The paths as strings (how handles name files).
pub fn path_strings(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

/// Makes every upload into the directory `dir` fail: it becomes a regular file.
/// [`repair_dir`] undoes it.
#[track_caller]
pub fn break_dir(dir: &Path) {
    std::fs::remove_dir_all(dir).unwrap_or_else(|e| panic!("cannot remove {}: {e}", dir.display()));
    std::fs::write(dir, b"not a directory: every upload here fails")
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", dir.display()));
}

/// The typed cause of a persist that failed because its upload failed
/// ([`Error::Upload`]); panics on any other outcome.
#[track_caller]
pub fn upload_error<T: Debug>(result: Result<T, Error>) -> dstl::UploadError {
    match result {
        Err(Error::Upload { source, .. }) => source,
        other => panic!("expected an upload failure, got {other:?}"),
    }
}

/// Turns the file [`break_dir`] left back into an empty directory.
#[track_caller]
pub fn repair_dir(dir: &Path) {
    std::fs::remove_file(dir).unwrap_or_else(|e| panic!("cannot remove {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
}

/// The typed writer error inside `result`; anything else fails the test.
#[track_caller]
pub fn writer_error<T: Debug>(result: Result<T, Error>) -> WriterError {
    writer_error_for("", result)
}

/// [`writer_error`], naming `what` was called if it fails.
#[track_caller]
pub fn writer_error_for<T: Debug>(what: &str, result: Result<T, Error>) -> WriterError {
    match result {
        Err(Error::Writer { source, .. }) => source,
        other => {
            let what = if what.is_empty() {
                String::new()
            } else {
                format!("{what}: ")
            };
            panic!("{what}expected a typed writer error, got {other:?}")
        }
    }
}

/// What `dstl gc` classifies as orphans among `files` (a listing's files, without its
/// leases) against the `live` manifests, with grace `grace` at time `now`: the orphans'
/// paths, and the report for [`dstl::gc::delete`].
#[track_caller]
pub fn gc_orphans(
    files: Vec<StoredFile>,
    live: &gc::Live,
    grace: Duration,
    now: SystemTime,
) -> (Vec<String>, gc::Report) {
    let listing = gc::Listing {
        files,
        ..Default::default()
    };
    let report = gc::classify(&listing, live, grace, now)
        .unwrap_or_else(|e| panic!("gc cannot classify the files: {e}"));
    let orphans = report.orphans.iter().map(|o| o.file.path.clone()).collect();
    (orphans, report)
}

/// Runs `f` on a thread of its own; the receiver yields its result (use `recv_timeout` to
/// check that it is still blocked, or to bound the wait).
pub fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}
