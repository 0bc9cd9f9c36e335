//! A store that injects faults: a real local directory ([`LocalStore`]) whose creates fail,
//! hang or are delayed — as planned by the test ([`FaultStore::plan`]), for good
//! ([`FaultStore::set_broken`]) or at random from a seeded generator
//! ([`RandomFaults`]) — whose deletions can be held back, and which records every file it
//! wrote (optionally with the change sets each holds, see [`FaultOptions::indexer`]).
//!
//! The scheduler tests and the shared scenarios plan their faults one by one; the seeded
//! simulation draws them at random and indexes every file. All use this one type. With
//! nothing planned or drawn it behaves exactly as the [`LocalStore`] it wraps (the store
//! conformance suite checks that).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use dstl::{LocalStore, Store, StoredFile};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What one planned `create` does (see [`FaultStore::plan`]).
#[derive(Debug, Clone)]
pub enum Fault {
    /// Fails with an I/O error, writing nothing.
    Fail,
    /// Waits until the gate opens ([`FaultStore::open_gate`]), then writes.
    Hang,
    /// Takes this long, then writes.
    Delay(Duration),
}

/// Faults drawn for every create that has no planned [`Fault`]: first a delay (with
/// probability `delay_p`, uniform in `0..=max_delay`), then a failure (with probability
/// `fail_p`). The draws come from one generator seeded with `seed`, in the order the
/// creates reach the store.
#[derive(Debug, Clone)]
pub struct RandomFaults {
    /// Seeds the generator.
    pub seed: u64,
    /// Probability that a create fails (after its delay).
    pub fail_p: f64,
    /// Probability that a create is delayed.
    pub delay_p: f64,
    /// The longest delay.
    pub max_delay: Duration,
}

/// One change set in a written file, as the test's indexer names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Block {
    /// The writer, by a test-chosen id.
    pub writer: u16,
    /// The change set's sequence number.
    pub sqn: u64,
    /// Its logical offset in the file.
    pub offset: u64,
}

/// Reads the change sets out of a file's bytes (see [`FaultOptions::indexer`]).
pub type Indexer = dyn Fn(&[u8]) -> Result<Vec<Block>, String> + Send + Sync;

/// How a [`FaultStore`] behaves besides planned faults. The default injects nothing at
/// random and indexes nothing.
#[derive(Default)]
pub struct FaultOptions {
    /// Random failures and delays for creates without a planned fault.
    pub random: Option<RandomFaults>,
    /// Called with the bytes of every file about to be written; its blocks are recorded
    /// in [`Written::blocks`]. An error is recorded in [`FaultStore::errors`] (a panic on
    /// an upload thread would only fail that attempt) and the file is written anyway.
    pub indexer: Option<Box<Indexer>>,
}

/// One file the store wrote (a create that succeeded).
#[derive(Debug, Clone)]
pub struct Written {
    /// The path handles name it by.
    pub path: String,
    /// The file name the uploader chose (local copies have the same name).
    pub name: String,
    /// Its change sets, if an indexer is set.
    pub blocks: Vec<Block>,
}

/// A gate threads wait at while it is closed.
struct Gate {
    open: Mutex<bool>,
    changed: Condvar,
}

impl Gate {
    fn new(open: bool) -> Self {
        Self {
            open: Mutex::new(open),
            changed: Condvar::new(),
        }
    }

    fn set(&self, open: bool) {
        *self.open.lock().unwrap() = open;
        self.changed.notify_all();
    }

    fn pass(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.changed.wait(open).unwrap();
        }
    }
}

/// A local directory whose creates fail, hang or are delayed as planned or at random, and
/// whose deletions can be held back. Reads and listings go straight to the directory.
///
/// A create takes, in this order: the broken switch (fail), the next planned fault, or —
/// if none is planned — a random fault. Failed creates write nothing.
pub struct FaultStore {
    inner: LocalStore,
    plan: Mutex<VecDeque<Fault>>,
    random: Option<(RandomFaults, Mutex<ChaCha8Rng>)>,
    indexer: Option<Box<Indexer>>,
    /// Where [`Fault::Hang`] waits.
    gate: Gate,
    broken: AtomicBool,
    /// Deletions wait while this is closed.
    delete_gate: Gate,
    /// Deletions running now, and the most that ever ran at once.
    deleting: Mutex<(u32, u32)>,
    creates: AtomicU64,
    failures: AtomicU64,
    written: Mutex<Vec<Written>>,
    errors: Mutex<Vec<String>>,
}

impl FaultStore {
    /// A store over `dir` (created if missing) that injects only planned faults.
    pub fn new(dir: &Path) -> Arc<Self> {
        Self::open(dir, FaultOptions::default())
    }

    /// A store over `dir` (created if missing) with `options`.
    pub fn open(dir: &Path, options: FaultOptions) -> Arc<Self> {
        let random = options.random.map(|r| {
            let rng = ChaCha8Rng::seed_from_u64(r.seed);
            (r, Mutex::new(rng))
        });
        Arc::new(Self {
            inner: LocalStore::open(dir)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", dir.display())),
            plan: Mutex::new(VecDeque::new()),
            random,
            indexer: options.indexer,
            gate: Gate::new(false),
            broken: AtomicBool::new(false),
            delete_gate: Gate::new(true),
            deleting: Mutex::new((0, 0)),
            creates: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            written: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
        })
    }

    /// The directory (absolute).
    pub fn dir(&self) -> &Path {
        self.inner.dir()
    }

    /// Queues faults for the next creates, one each, in order.
    pub fn plan(&self, faults: impl IntoIterator<Item = Fault>) {
        self.plan.lock().unwrap().extend(faults);
    }

    /// Releases every create waiting in a [`Fault::Hang`], and all later ones until
    /// [`FaultStore::close_gate`].
    pub fn open_gate(&self) {
        self.gate.set(true);
    }

    /// Closes the gate again (it starts closed): creates that take a [`Fault::Hang`] wait
    /// until [`FaultStore::open_gate`].
    pub fn close_gate(&self) {
        self.gate.set(false);
    }

    /// While broken, every create fails (before any planned fault is taken).
    pub fn set_broken(&self, broken: bool) {
        self.broken.store(broken, Ordering::SeqCst);
    }

    /// Closed, deletions wait until it opens again; open (the default), they run.
    pub fn set_delete_gate(&self, open: bool) {
        self.delete_gate.set(open);
    }

    /// The most deletions that ever ran at once.
    pub fn max_concurrent_deletes(&self) -> u32 {
        self.deleting.lock().unwrap().1
    }

    /// Creates that reached the store, failed or not.
    pub fn creates(&self) -> u64 {
        self.creates.load(Ordering::SeqCst)
    }

    /// Creates that failed by injection (broken, planned or random).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }

    /// Every file written so far, in the order the creates completed.
    pub fn written(&self) -> Vec<Written> {
        self.written.lock().unwrap().clone()
    }

    /// Problems the indexer reported.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    /// The files in the directory now, sorted, including staging files of writes in
    /// progress (or left behind).
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.inner.dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    }

    fn fail(&self, why: &str) -> std::io::Error {
        self.failures.fetch_add(1, Ordering::SeqCst);
        std::io::Error::other(format!("injected: {why}"))
    }

    /// Applies the fault this create gets; `Err` if it fails.
    fn inject(&self) -> std::io::Result<()> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        if self.broken.load(Ordering::SeqCst) {
            return Err(self.fail("the store is down"));
        }
        let planned = self.plan.lock().unwrap().pop_front();
        match planned {
            Some(Fault::Fail) => return Err(self.fail("transient failure")),
            Some(Fault::Hang) => self.gate.pass(),
            Some(Fault::Delay(pause)) => std::thread::sleep(pause),
            None => {
                if let Some((faults, rng)) = &self.random {
                    let (fail, delay) = {
                        let mut rng = rng.lock().unwrap();
                        let fail = rng.random_bool(faults.fail_p);
                        let delay = if rng.random_bool(faults.delay_p) {
                            let max = faults.max_delay.as_micros() as u64;
                            Duration::from_micros(rng.random_range(0..=max))
                        } else {
                            Duration::ZERO
                        };
                        (fail, delay)
                    };
                    if !delay.is_zero() {
                        std::thread::sleep(delay);
                    }
                    if fail {
                        return Err(self.fail("create failed"));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Store for FaultStore {
    fn create(&self, name: &str, bytes: &[u8]) -> std::io::Result<String> {
        self.create_parts(name, &[bytes])
    }

    fn create_parts(&self, name: &str, parts: &[&[u8]]) -> std::io::Result<String> {
        self.inject()?;
        let blocks = match &self.indexer {
            Some(index) => index(&parts.concat()).unwrap_or_else(|e| {
                self.errors
                    .lock()
                    .unwrap()
                    .push(format!("upload of {name} is not a valid file: {e}"));
                Vec::new()
            }),
            None => Vec::new(),
        };
        let path = self.inner.create_parts(name, parts)?;
        self.written.lock().unwrap().push(Written {
            path: path.clone(),
            name: name.to_string(),
            blocks,
        });
        Ok(path)
    }

    fn delete(&self, path: &str) -> std::io::Result<()> {
        {
            let mut deleting = self.deleting.lock().unwrap();
            deleting.0 += 1;
            deleting.1 = deleting.1.max(deleting.0);
        }
        self.delete_gate.pass();
        let result = Store::delete(&self.inner, path);
        self.deleting.lock().unwrap().0 -= 1;
        result
    }

    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        self.inner.read(path)
    }

    fn list(&self) -> std::io::Result<Vec<StoredFile>> {
        self.inner.list()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
