//! File ownership (spec §8): the task registry reference-counts uploaded files that no
//! confirmed checkpoint owns yet, and the local registry owns local copies per writer and
//! checkpoint. Deletions run on a bounded pool of `dstl.dfs.discard.num-threads` threads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::background::{Job, Outstanding};
use crate::store::Stores;

/// Identifies one writer of a storage (in the local registry, where ownership is per
/// writer).
pub type WriterId = u64;

/// Deletes files on `dstl.dfs.discard.num-threads` threads, off the callers' threads.
/// After [`Discarder::close`] deletions run on the caller's thread, so none is lost.
#[derive(Clone)]
pub(crate) struct Discarder {
    inner: Arc<DiscardPool>,
}

struct DiscardPool {
    queue: Mutex<DiscardQueue>,
    wake: Condvar,
    stores: Stores,
    outstanding: Outstanding,
}

#[derive(Default)]
struct DiscardQueue {
    paths: VecDeque<(String, Job)>,
    /// Deletions running on a pool thread.
    running: usize,
    closed: bool,
}

impl Discarder {
    /// Starts `threads` deletion threads.
    pub fn new(threads: usize, outstanding: Outstanding, stores: Stores) -> std::io::Result<Self> {
        let inner = Arc::new(DiscardPool {
            queue: Mutex::new(DiscardQueue::default()),
            wake: Condvar::new(),
            stores,
            outstanding,
        });
        for n in 0..threads.max(1) {
            let pool = inner.clone();
            std::thread::Builder::new()
                .name(format!("dstl-discard-{n}"))
                .spawn(move || pool.work())?;
        }
        Ok(Self { inner })
    }

    /// Deletes `path` soon (at once, on this thread, once the pool is closed).
    pub fn discard(&self, path: String) {
        let mut queue = self.inner.queue.lock().unwrap();
        if queue.closed {
            drop(queue);
            self.inner.delete(&path);
            return;
        }
        queue
            .paths
            .push_back((path, self.inner.outstanding.start()));
        drop(queue);
        self.inner.wake.notify_one();
    }

    /// Lets the pool finish the deletions queued so far, for up to `grace`, and stops it.
    /// Returns the paths it could not delete in time: each is reported here, and
    /// `dstl gc` collects them. Later deletions run on their caller's thread.
    pub fn close(&self, grace: Duration) -> Vec<String> {
        let deadline = Instant::now() + grace;
        let mut queue = self.inner.queue.lock().unwrap();
        queue.closed = true;
        self.inner.wake.notify_all();
        while !queue.paths.is_empty() || queue.running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            queue = self.inner.wake.wait_timeout(queue, left).unwrap().0;
        }
        let abandoned: Vec<String> = queue.paths.drain(..).map(|(path, _job)| path).collect();
        for path in &abandoned {
            tracing::warn!(%path, "file not deleted before the storage closed; `dstl gc` collects it");
        }
        abandoned
    }
}

impl DiscardPool {
    fn work(&self) {
        let mut queue = self.queue.lock().unwrap();
        loop {
            if let Some((path, job)) = queue.paths.pop_front() {
                queue.running += 1;
                drop(queue);
                self.delete(&path);
                drop(job);
                queue = self.queue.lock().unwrap();
                queue.running -= 1;
                // `close` waits for the queue to run dry.
                self.wake.notify_all();
            } else if queue.closed {
                return;
            } else {
                queue = self.wake.wait(queue).unwrap();
            }
        }
    }

    fn delete(&self, path: &str) {
        match self.stores.delete(path) {
            Ok(()) => tracing::debug!(%path, "discarded changelog file"),
            Err(e) => tracing::warn!(%path, error = %e, "could not discard changelog file"),
        }
    }
}

/// Reference counts per file (Flink's `TaskChangelogRegistry`).
#[derive(Clone)]
pub struct TaskRegistry {
    counts: Arc<Mutex<HashMap<String, u64>>>,
    discarder: Discarder,
}

impl TaskRegistry {
    pub(crate) fn new(discarder: Discarder) -> Self {
        Self {
            counts: Arc::default(),
            discarder,
        }
    }

    /// Starts tracking a new file used by `count` change sets.
    pub fn start_tracking(&self, path: &str, count: u64) {
        assert!(
            count > 0,
            "initial reference count of {path} must be above zero"
        );
        let previous = self.counts.lock().unwrap().insert(path.to_string(), count);
        if previous.is_some() {
            tracing::warn!(%path, "file was already tracked; its count was replaced");
        }
    }

    /// Ownership moved to a confirmed checkpoint: never delete the file here.
    pub fn stop_tracking(&self, path: &str) {
        self.counts.lock().unwrap().remove(path);
    }

    /// One change set no longer needs the file; at zero it is deleted.
    pub fn release(&self, path: &str) {
        let mut counts = self.counts.lock().unwrap();
        let Some(count) = counts.get_mut(path) else {
            tracing::debug!(%path, "release of an untracked file (confirmed or already discarded)");
            return;
        };
        *count -= 1;
        if *count == 0 {
            counts.remove(path);
            drop(counts);
            self.discarder.discard(path.to_string());
        }
    }

    /// The count of a tracked file, `None` if untracked.
    pub fn count(&self, path: &str) -> Option<u64> {
        self.counts.lock().unwrap().get(path).copied()
    }

    /// Number of tracked files.
    pub fn tracked(&self) -> usize {
        self.counts.lock().unwrap().len()
    }
}

/// One writer's claim on a local copy.
#[derive(Debug, Default, Clone, Copy)]
struct Owner {
    /// Change sets in the file that the writer was given and has not released.
    refs: u64,
    /// A checkpoint of the writer was confirmed with the file: only a discard ends the claim.
    confirmed: bool,
    /// The highest checkpoint the writer registered the file under.
    last_checkpoint: Option<i64>,
}

/// Local copies (Flink's `LocalChangelogRegistry`), owned per writer: one local file holds
/// change sets of every writer in its batch, so one writer's confirm or abort discards only
/// that writer's claims, and the file is deleted once no writer claims it.
///
/// A writer claims a local copy when its upload result is handed to it. The claim ends when
/// the writer releases every change set in it without a confirm (as the task registry does
/// for remote files), or when a discard reaches the checkpoint it was last registered under.
#[derive(Clone)]
pub struct LocalRegistry {
    files: Arc<Mutex<HashMap<String, HashMap<WriterId, Owner>>>>,
    discarder: Discarder,
}

impl LocalRegistry {
    pub(crate) fn new(discarder: Discarder) -> Self {
        Self {
            files: Arc::default(),
            discarder,
        }
    }

    /// `writer` was given `count` change sets in the local file `path`.
    pub(crate) fn hold(&self, writer: WriterId, path: &str, count: u64) {
        let mut files = self.files.lock().unwrap();
        let owner = files
            .entry(path.to_string())
            .or_default()
            .entry(writer)
            .or_default();
        owner.refs += count;
    }

    /// `writer` no longer needs one change set in `path`.
    pub(crate) fn release(&self, writer: WriterId, path: &str) {
        self.update(path, writer, |owner| {
            owner.refs = owner.refs.saturating_sub(1);
            owner.refs > 0 || owner.confirmed
        });
    }

    /// A checkpoint of `writer` holding `path` was confirmed: the claim now lasts until a
    /// discard.
    pub(crate) fn stop_tracking(&self, writer: WriterId, path: &str) {
        self.update(path, writer, |owner| {
            owner.confirmed = true;
            true
        });
    }

    /// Marks `path` as used by `checkpoint` of `writer`, keeping the highest id.
    pub fn register(&self, writer: WriterId, path: &str, checkpoint: i64) {
        let mut files = self.files.lock().unwrap();
        let owner = files
            .entry(path.to_string())
            .or_default()
            .entry(writer)
            .or_default();
        owner.last_checkpoint = Some(
            owner
                .last_checkpoint
                .map_or(checkpoint, |l| l.max(checkpoint)),
        );
    }

    /// Ends every claim of `writer` last registered under a checkpoint below `checkpoint`
    /// and returns those paths (the writer must forget them); files that nobody claims any
    /// more are deleted.
    pub fn discard_up_to(&self, writer: WriterId, checkpoint: i64) -> Vec<String> {
        let mut discarded = Vec::new();
        let mut unclaimed = Vec::new();
        let mut files = self.files.lock().unwrap();
        files.retain(|path, owners| {
            if owners
                .get(&writer)
                .is_some_and(|o| o.last_checkpoint.is_some_and(|last| last < checkpoint))
            {
                owners.remove(&writer);
                discarded.push(path.clone());
                if owners.is_empty() {
                    unclaimed.push(path.clone());
                    return false;
                }
            }
            true
        });
        drop(files);
        for path in unclaimed {
            self.discarder.discard(path);
        }
        discarded.sort();
        discarded
    }

    /// The highest checkpoint any writer registered `path` under.
    pub fn last_used(&self, path: &str) -> Option<i64> {
        let files = self.files.lock().unwrap();
        files
            .get(path)?
            .values()
            .filter_map(|o| o.last_checkpoint)
            .max()
    }

    /// Whether `writer` claims `path`: false once its discard ended the claim.
    pub fn claims(&self, writer: WriterId, path: &str) -> bool {
        let files = self.files.lock().unwrap();
        files
            .get(path)
            .is_some_and(|owners| owners.contains_key(&writer))
    }

    /// Writers that claim `path`.
    pub fn owners(&self, path: &str) -> Vec<WriterId> {
        let files = self.files.lock().unwrap();
        let mut owners: Vec<WriterId> = files
            .get(path)
            .map(|o| o.keys().copied().collect())
            .unwrap_or_default();
        owners.sort();
        owners
    }

    /// Applies `f` to `writer`'s claim on `path`; `false` ends the claim, and the file is
    /// deleted when it was the last.
    fn update(&self, path: &str, writer: WriterId, f: impl FnOnce(&mut Owner) -> bool) {
        let mut files = self.files.lock().unwrap();
        let Some(owners) = files.get_mut(path) else {
            tracing::debug!(%path, writer, "local copy no longer claimed");
            return;
        };
        let Some(owner) = owners.get_mut(&writer) else {
            tracing::debug!(%path, writer, "local copy not claimed by this writer");
            return;
        };
        if f(owner) {
            return;
        }
        owners.remove(&writer);
        if owners.is_empty() {
            files.remove(path);
            drop(files);
            self.discarder.discard(path.to_string());
        }
    }
}
