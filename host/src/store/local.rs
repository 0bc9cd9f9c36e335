//! A local directory as a store: every file becomes visible only whole (written under a
//! temporary name, fsync'd, then moved into place without overwriting) and its
//! directory entry is fsync'd before the write counts (one directory fsync serves the
//! creates that finish together). Large fsync'd files bypass the page cache
//! (`direct.rs`) where the file system allows it.

use std::fs::{self, File};
use std::io::{IoSlice, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::sync::{CondvarExt, LockExt};

use super::direct;
use super::{Store, StoredFile};

/// A directory of changelog files.
#[derive(Debug, Clone)]
pub struct LocalStore {
    dir: PathBuf,
    /// Bytes handed to one `writev` (`dstl.dfs.upload.buffer-size`).
    buffer_size: usize,
    /// Fsync files and the directory before a create returns (`dstl.dfs.local.fsync`).
    fsync: bool,
    /// Directory syncs shared by the creates running at once.
    dir_sync: Arc<DirSync>,
    /// Direct (`O_DIRECT`) writes of large fsync'd files.
    direct: Arc<Direct>,
}

/// Whether and how this store writes large fsync'd files past the page cache.
#[derive(Debug)]
struct Direct {
    /// Off: every file goes through the page cache.
    enabled: bool,
    /// The file system refused `O_DIRECT` once (tmpfs, some FUSE and network file
    /// systems): later creates do not try again.
    refused: AtomicBool,
    buffers: direct::BufferPool,
}

impl Direct {
    fn new(enabled: bool) -> Arc<Self> {
        Arc::new(Self {
            enabled,
            refused: AtomicBool::new(false),
            buffers: direct::BufferPool::default(),
        })
    }
}

/// Group commit of directory syncs: a create that needs its new name durable waits for
/// one directory fsync that started after its link. Creates running at once share one
/// fsync instead of queueing one each.
#[derive(Debug, Default)]
struct DirSync {
    state: Mutex<DirSyncState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct DirSyncState {
    /// Links made so far (each create counts one).
    linked: u64,
    /// Links a completed fsync covers.
    synced: u64,
    /// An fsync is running.
    running: bool,
    /// Links that failed fsyncs covered, as `(first, last)`: those creates fail even if a
    /// later fsync succeeds (after a failed fsync the kernel may have dropped the dirty
    /// entries, so a later success says nothing about them). Failures are rare; the list
    /// keeps the latest few.
    failed: Vec<(u64, u64)>,
}

/// Failed-fsync ranges kept (a create waits at most for two fsyncs, so only the latest
/// ones can concern a waiting create).
const FAILED_RANGES: usize = 16;

impl DirSync {
    /// Returns once a directory fsync that started after this call has completed.
    fn sync(&self, dir: &Path) -> std::io::Result<()> {
        let mut state = self.state.locked();
        state.linked += 1;
        let mine = state.linked;
        loop {
            if state.failed.iter().any(|&(a, b)| a <= mine && mine <= b) {
                return Err(std::io::Error::other(format!(
                    "an fsync of the directory {} covering this file failed",
                    dir.display()
                )));
            }
            if state.synced >= mine {
                return Ok(());
            }
            if state.running {
                state = self.done.wait_locked(state);
                continue;
            }
            state.running = true;
            let (first, covers) = (state.synced + 1, state.linked);
            drop(state);
            let result = File::open(dir).and_then(|d| d.sync_all());
            state = self.state.locked();
            state.running = false;
            match &result {
                Ok(()) => state.synced = state.synced.max(covers),
                Err(_) => {
                    if state.failed.len() == FAILED_RANGES {
                        state.failed.remove(0);
                    }
                    state.failed.push((first, covers));
                }
            }
            self.done.notify_all();
            result?;
        }
    }
}

/// Moves `staging` to `target` unless `target` exists: `renameat2(RENAME_NOREPLACE)` where
/// the file system has it, else a hard link (which also refuses an existing name, and
/// leaves `staging` for the caller to remove). True if `staging` is gone.
fn publish(staging: &Path, target: &Path) -> std::io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let from = CString::new(staging.as_os_str().as_bytes())?;
        let to = CString::new(target.as_os_str().as_bytes())?;
        // SAFETY: both paths are NUL-terminated strings that live across the call.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        let error = std::io::Error::last_os_error();
        if !matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
            return Err(error);
        }
    }
    fs::hard_link(staging, target).map(|()| false)
}

/// Flink's default `dstl.dfs.upload.buffer-size`.
const DEFAULT_BUFFER_SIZE: usize = 1 << 20;

impl LocalStore {
    /// A store writing into `dir`, created if missing (durably: see
    /// [`create_dirs_durably`]). The path is made absolute so handles name files
    /// independently of the working directory.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        create_dirs_durably(dir)?;
        let dir = fs::canonicalize(dir)?;
        Ok(Self {
            dir,
            buffer_size: DEFAULT_BUFFER_SIZE,
            fsync: true,
            dir_sync: Arc::default(),
            direct: Direct::new(true),
        })
    }

    /// Whether fsync'd files of 256 KiB and more are written with `O_DIRECT`, past the
    /// page cache (on by default; where the file system refuses it, files go through
    /// the page cache as without). Files written without fsync always go through it.
    pub fn with_direct_io(mut self, enabled: bool) -> Self {
        self.direct = Direct::new(enabled);
        self
    }

    /// Whether a create fsyncs the file and the directory before it returns. Without,
    /// a file still appears only whole (written under a temporary name, then linked),
    /// but a power loss may take files whose uploads counted as done.
    pub fn with_fsync(mut self, fsync: bool) -> Self {
        self.fsync = fsync;
        self
    }

    /// Writes files in `writev` calls of about `bytes` each, straight from the blocks'
    /// pieces (nothing is gathered into a buffer first).
    pub fn with_buffer_size(mut self, bytes: usize) -> Self {
        self.buffer_size = bytes.max(1);
        self
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The files of the directory, sorted by path; with `staging`, also the hidden
    /// staging files that interrupted writes left behind (never referenced by a handle).
    pub fn files(&self, staging: bool) -> std::io::Result<Vec<StoredFile>> {
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            if !staging && entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let meta = entry.metadata()?;
            if meta.is_file() {
                files.push(StoredFile {
                    path: entry.path().to_string_lossy().into_owned(),
                    size: meta.len(),
                    modified: meta.modified()?,
                });
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// Refuses to touch a path outside this store's directory (a bad handle or manifest
    /// must never make the store read or delete someone else's file).
    fn check_inside(&self, path: &str) -> std::io::Result<()> {
        let inside = Path::new(path);
        if inside.parent() == Some(self.dir.as_path())
            && inside
                .file_name()
                .is_some_and(|n| n != "." && n != ".." && !n.is_empty())
        {
            Ok(())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{path} is not a file of the store {}", self.dir.display()),
            ))
        }
    }

    /// Creates `name` with `bytes`, atomically and durably; fails if it exists.
    /// A failed write leaves nothing behind.
    pub fn create(&self, name: &str, bytes: &[u8]) -> std::io::Result<String> {
        self.create_parts(name, &[bytes])
    }

    /// Creates `name` from `parts` written one after the other, atomically and durably.
    pub fn create_parts(&self, name: &str, parts: &[&[u8]]) -> std::io::Result<String> {
        let target = self.dir.join(name);
        // A staging name of this call alone: two creates of one name must not share it.
        static STAGED: AtomicU64 = AtomicU64::new(0);
        let staging = self.dir.join(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            STAGED.fetch_add(1, Ordering::Relaxed)
        ));
        let mut linked = false;
        let mut moved = false;
        let result = (|| {
            let file = self.write_staging(&staging, parts)?;
            if self.fsync {
                // The data and the size, which is all a new file needs to be read back.
                file.sync_data()?;
            }
            drop(file);
            // The name is taken only if it is free, so a file is never overwritten, and
            // it appears with all its bytes at once.
            moved = publish(&staging, &target)?;
            linked = true;
            if self.fsync {
                self.dir_sync.sync(&self.dir)?;
            }
            Ok(())
        })();
        if !moved {
            let _ = fs::remove_file(&staging);
        }
        if result.is_err() && linked {
            // The link was made but the directory sync failed: do not leave a file that
            // the caller will believe was never written.
            let _ = fs::remove_file(&target);
        }
        result.map(|()| target.to_string_lossy().into_owned())
    }

    /// Writes `parts` into the new file `staging`: directly for a large fsync'd file where
    /// the file system allows it, else through the page cache.
    fn write_staging(&self, staging: &Path, parts: &[&[u8]]) -> std::io::Result<File> {
        let length: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if self.fsync
            && self.direct.enabled
            && length >= direct::MIN_DIRECT_FILE
            && !self.direct.refused.load(Ordering::Relaxed)
        {
            let refused = |e: &std::io::Error| e.raw_os_error() == Some(libc::EINVAL);
            match direct::create_new(staging) {
                Ok(file) => match direct::write_parts(&file, parts, &self.direct.buffers) {
                    Ok(_) => return Ok(file),
                    // Opened but not written to directly: start over through the cache,
                    // for good if the file system refuses direct writes, for this file
                    // only after a short write that left the alignment.
                    Err(e) if refused(&e) || direct::ShortWrite::is(&e) => {
                        drop(file);
                        fs::remove_file(staging)?;
                        if refused(&e) {
                            self.refuse_direct(&e);
                        } else {
                            tracing::debug!(file = %staging.display(), error = %e, "writing this file through the page cache");
                        }
                    }
                    Err(e) => return Err(e),
                },
                Err(e) if refused(&e) => {
                    // Some file systems (ramfs; tmpfs before Linux 6.6) create the file
                    // and then refuse the flag: the staging name must be free again.
                    match fs::remove_file(staging) {
                        Ok(()) => {}
                        Err(gone) if gone.kind() == std::io::ErrorKind::NotFound => {}
                        Err(other) => return Err(other),
                    }
                    self.refuse_direct(&e);
                }
                Err(e) => return Err(e),
            }
        }
        let mut file = File::create_new(staging)?;
        write_vectored(&mut file, parts, self.buffer_size)?;
        Ok(file)
    }

    fn refuse_direct(&self, error: &std::io::Error) {
        if !self.direct.refused.swap(true, Ordering::Relaxed) {
            tracing::info!(dir = %self.dir.display(), %error, "the file system refuses O_DIRECT: files are written through the page cache");
        }
    }
}

impl Store for LocalStore {
    fn create(&self, name: &str, bytes: &[u8]) -> std::io::Result<String> {
        LocalStore::create(self, name, bytes)
    }

    fn create_parts(&self, name: &str, parts: &[&[u8]]) -> std::io::Result<String> {
        LocalStore::create_parts(self, name, parts)
    }

    fn delete(&self, path: &str) -> std::io::Result<()> {
        self.check_inside(path)?;
        delete(path)
    }

    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        self.check_inside(path)?;
        fs::read(path)
    }

    fn list(&self) -> std::io::Result<Vec<StoredFile>> {
        self.files(false)
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }
}

/// Writes `parts` one after the other with `writev`, about `batch` bytes per call: each
/// part goes from where it lies (a block in a sandbox's memory, say) straight into the
/// page cache, with no buffer between.
fn write_vectored(file: &mut File, parts: &[&[u8]], batch: usize) -> std::io::Result<()> {
    // At most IOV_MAX (1024 on Linux) slices per call.
    const MAX_SLICES: usize = 1024;
    let mut rest = parts.iter().filter(|p| !p.is_empty()).peekable();
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(MAX_SLICES.min(parts.len()));
    while rest.peek().is_some() {
        slices.clear();
        let mut bytes = 0usize;
        while let Some(part) = rest.next_if(|_| slices.len() < MAX_SLICES && bytes < batch) {
            bytes += part.len();
            slices.push(IoSlice::new(part));
        }
        let mut pending = &mut slices[..];
        while !pending.is_empty() {
            match file.write_vectored(pending) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut pending, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Creates `dir` and its missing parents, and fsyncs the parent of every directory it
/// creates: without that, a power loss can take a new directory, and the files already
/// acknowledged in it, away. Returns the directories created, outermost first.
pub fn create_dirs_durably(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut next = Some(dir);
    while let Some(d) = next.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        missing.push(d.to_path_buf());
        next = d.parent();
    }
    missing.reverse();
    for d in &missing {
        match fs::create_dir(d) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        sync_parent(d)?;
    }
    Ok(missing)
}

/// Fsyncs the directory holding `path` (the working directory for a bare name), so that
/// an entry made in it survives a power loss.
pub(crate) fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(parent)?.sync_all()
}

/// Deletes a file; a missing file counts as deleted.
pub fn delete(path: &str) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_directories_are_created_one_by_one_and_their_parents_synced() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("base/job/dstl");
        let created = create_dirs_durably(&dir).unwrap();
        assert_eq!(
            created,
            vec![
                tmp.path().join("base"),
                tmp.path().join("base/job"),
                tmp.path().join("base/job/dstl")
            ]
        );
        assert!(dir.is_dir());
        assert!(create_dirs_durably(&dir).unwrap().is_empty());
        // Opening a store goes through it.
        let store_dir = tmp.path().join("base/other/dstl");
        LocalStore::open(&store_dir).unwrap();
        assert!(store_dir.is_dir());
    }

    #[test]
    fn creates_running_at_once_share_directory_syncs_and_all_land() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalStore::open(tmp.path()).unwrap();
        std::thread::scope(|s| {
            for t in 0..8 {
                let store = &store;
                s.spawn(move || {
                    for i in 0..20 {
                        let name = format!("f{t}-{i}");
                        let path = store.create(&name, name.as_bytes()).unwrap();
                        assert_eq!(fs::read(path).unwrap(), name.as_bytes());
                    }
                });
            }
        });
        let files = store.files(true).unwrap();
        assert_eq!(
            files.len(),
            160,
            "every file landed and no staging file is left"
        );
        let state = store.dir_sync.state.locked();
        assert_eq!(state.linked, 160);
        assert_eq!(state.synced, 160, "the last create's link is covered");
    }

    /// A create whose link a failed directory fsync covered fails, even though it would
    /// have succeeded with an fsync of its own afterwards.
    #[test]
    fn creates_covered_by_a_failed_directory_fsync_fail() {
        let tmp = tempfile::tempdir().unwrap();
        // Opening a FIFO blocks until a writer comes, and fsync of a FIFO fails: an fsync
        // that is running, then fails, on cue.
        let fifo = |name: &str| {
            let path = tmp.path().join(name);
            let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            // SAFETY: a NUL-terminated path that lives across the call.
            assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
            path
        };
        let (first, second) = (fifo("first"), fifo("second"));
        let wait_until = |sync: &DirSync, done: &dyn Fn(&DirSyncState) -> bool| {
            while !done(&sync.state.locked()) {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        };
        // Which waiter runs the next fsync after a failure is up to the scheduler; the
        // case to check is the one where a create covered by a failing fsync has a
        // working directory of its own to retry on. Repeat until that case comes up.
        for _ in 0..100 {
            let sync = Arc::new(DirSync::default());
            let call = |dir: &Path| {
                let (sync, dir) = (sync.clone(), dir.to_path_buf());
                std::thread::spawn(move || sync.sync(&dir))
            };
            let failing = call(&first);
            wait_until(&sync, &|s| s.running);
            let covered_a = call(&second);
            wait_until(&sync, &|s| s.linked == 2);
            let covered_b = call(tmp.path());
            wait_until(&sync, &|s| s.linked == 3);
            let writer = fs::OpenOptions::new().write(true).open(&first).unwrap();
            assert!(failing.join().unwrap().is_err());
            drop(writer);
            std::thread::sleep(std::time::Duration::from_millis(50));
            if covered_b.is_finished() {
                // It ran an fsync of the real directory covering both: both are durable.
                assert!(covered_b.join().unwrap().is_ok());
                assert!(covered_a.join().unwrap().is_ok());
                continue;
            }
            // `covered_a` runs an fsync (of the FIFO) that covers `covered_b` too.
            let writer = fs::OpenOptions::new().write(true).open(&second).unwrap();
            assert!(covered_a.join().unwrap().is_err());
            let e = covered_b.join().unwrap().unwrap_err();
            assert!(e.to_string().contains("fsync"), "{e}");
            drop(writer);
            // A create linked after the failure is not covered by it.
            sync.sync(tmp.path()).unwrap();
            return;
        }
        panic!("the covered create never waited behind the failing fsync");
    }

    #[test]
    fn parts_smaller_than_the_buffer_are_gathered() {
        let tmp = tempfile::tempdir().unwrap();
        for buffer in [1, 3, 1 << 20] {
            let store = LocalStore::open(tmp.path())
                .unwrap()
                .with_buffer_size(buffer);
            let name = format!("f{buffer}");
            let path = store
                .create_parts(&name, &[b"ab", b"", b"cdefg", b"h"])
                .unwrap();
            assert_eq!(fs::read(path).unwrap(), b"abcdefgh");
        }
    }

    #[test]
    fn create_is_whole_and_never_overwrites() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalStore::open(&tmp.path().join("a/b")).unwrap();
        let path = PathBuf::from(store.create("f", b"hello").unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"hello");
        assert!(LocalStore::create(&store, "f", b"other").is_err());
        assert_eq!(fs::read(&path).unwrap(), b"hello");
        let names: Vec<_> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["f"]);
        Store::delete(&store, path.to_str().unwrap()).unwrap();
        Store::delete(&store, path.to_str().unwrap()).unwrap();
        let outside = tmp.path().join("a/escape");
        fs::write(&outside, b"x").unwrap();
        for bad in [
            outside.to_str().unwrap(),
            "/etc/passwd",
            &format!("{}/../escape", store.dir().display()),
        ] {
            let e = Store::delete(&store, bad).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{bad}");
        }
        assert!(outside.exists());
    }
}
