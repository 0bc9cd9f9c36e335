//! Persist outcomes on their way to Java. Every persist's future is awaited on a small
//! runtime of the storage's own; its outcome is encoded and queued, and the Java
//! storage's daemon thread takes it with `nextCompletion` and completes the Flink future
//! through the writer's mailbox. dstl's threads never call into the JVM.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use dstl::{ChangelogHandle, PersistFuture, SnapshotResult};

/// How long `next` keeps waiting, after the storage closed, for persists still pending;
/// the storage's own close already waited for their uploads, so this only covers a
/// future that never resolves.
const CLOSE_GRACE: Duration = Duration::from_secs(30);

/// The queue of one storage, shared with the tasks awaiting its persists.
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

#[derive(Default)]
struct QueueState {
    ready: VecDeque<Vec<u8>>,
    pending: usize,
    closed_at: Option<Instant>,
}

/// Awaits persists and queues their encoded outcomes.
#[derive(Clone)]
pub struct Completions {
    runtime: Arc<tokio::runtime::Runtime>,
    queue: Arc<Queue>,
}

impl Completions {
    /// A runtime with one worker thread (it only waits on futures).
    pub fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dstl-flink-completions")
            .enable_time()
            .build()?;
        Ok(Self {
            runtime: Arc::new(runtime),
            queue: Arc::default(),
        })
    }

    /// Queues `future`'s outcome under `request` once it completes.
    pub fn deliver(&self, request: i64, future: PersistFuture) {
        let queue = self.queue.clone();
        queue.lock().pending += 1;
        self.runtime.spawn(async move {
            let encoded = encode(request, future.await);
            let mut state = queue.lock();
            state.pending -= 1;
            state.ready.push_back(encoded);
            queue.changed.notify_all();
        });
    }

    /// The next outcome, blocking; `None` once closed and nothing is left to deliver.
    pub fn next(&self) -> Option<Vec<u8>> {
        let mut state = self.queue.lock();
        loop {
            if let Some(item) = state.ready.pop_front() {
                return Some(item);
            }
            if let Some(closed_at) = state.closed_at
                && (state.pending == 0 || closed_at.elapsed() > CLOSE_GRACE)
            {
                return None;
            }
            state = self
                .queue
                .changed
                .wait_timeout(state, Duration::from_millis(500))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// No more persists come: `next` returns `None` once the pending ones are delivered.
    pub fn close(&self) {
        let mut state = self.queue.lock();
        state.closed_at.get_or_insert_with(Instant::now);
        self.queue.changed.notify_all();
    }

    /// Runs `future` to completion on the calling (Java) thread.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The version of the outcome format below; `Completion.java` reads only this one, so
/// a jar whose Java and native halves disagree fails with a message instead of reading
/// garbage.
pub const FORMAT_VERSION: u8 = 2;

/// The outcome as `Completion.java` reads it (big-endian, as `DataInputStream`):
/// `i64 request` (first in every version, so a reader of another version can still fail
/// the persist it answers), `u8 version` ([`FORMAT_VERSION`]), `u8 status` then, for 0 (done), the
/// remote handle, `u8 has local` and the local handle, as the writer built them (Java
/// computes nothing of its own); for 1 (failed), the message. Handles: `i64 state size,
/// i64 incremental size, i32 count`, then per entry `string path, i64 file size, i64
/// offset, i64 size`. Strings: `i32 length` and UTF-8.
fn encode(request: i64, outcome: Result<SnapshotResult, dstl::Error>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend(request.to_be_bytes());
    out.push(FORMAT_VERSION);
    match outcome {
        Ok(result) => {
            out.push(0);
            handle(&mut out, &result.remote);
            match &result.local {
                Some(local) => {
                    out.push(1);
                    handle(&mut out, local);
                }
                None => out.push(0),
            }
        }
        Err(error) => {
            out.push(1);
            string(&mut out, &format!("dstl: {}", dstl::describe(&error)));
        }
    }
    out
}

fn handle(out: &mut Vec<u8>, handle: &ChangelogHandle) {
    out.extend((handle.state_size as i64).to_be_bytes());
    out.extend((handle.incremental_size as i64).to_be_bytes());
    out.extend((handle.entries.len() as i32).to_be_bytes());
    for entry in &handle.entries {
        string(out, &entry.handle.path);
        out.extend((entry.handle.file_size as i64).to_be_bytes());
        out.extend((entry.offset as i64).to_be_bytes());
        out.extend((entry.size as i64).to_be_bytes());
    }
}

fn string(out: &mut Vec<u8>, text: &str) {
    out.extend((text.len() as i32).to_be_bytes());
    out.extend(text.as_bytes());
}
