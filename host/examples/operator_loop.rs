//! Embedding a writer in an operator: a word count whose state lives in memory and whose
//! every update is logged to dstl, checkpointed the way Flink's changelog state backend
//! does it, then restored from the last checkpoint and compared with the live state.
//!
//! The model: the operator's state at checkpoint `k` is its last *materialization* (a
//! full copy taken at sequence number `m`) plus the changes logged since, `[m, to)`.
//! `persist(m, k)` makes those changes durable; when the checkpoint is confirmed the
//! writer is told (`confirm`), and the changes below `m` are dropped (`truncate`): no
//! checkpoint needs them any more.
//!
//! ```sh
//! cargo run --release -p dstl --example operator_loop [-- DIR]
//! ```
//!
//! Files go to `DIR` (a temporary directory by default, removed at the end).

use std::collections::{HashMap, VecDeque};
use std::error::Error;
use std::path::PathBuf;

use dstl::{ChangelogStorage, Config, KeyGroupRange, PersistFuture, SnapshotResult};

/// Key groups of the operator (Flink's maximum parallelism).
const KEY_GROUPS: i32 = 128;
/// Records between two checkpoints.
const CHECKPOINT_EVERY: usize = 2_000;
/// Every this many checkpoints the operator materializes its state.
const MATERIALIZE_EVERY: i64 = 3;

type State = HashMap<String, u64>;

/// A checkpoint whose persist is running.
struct Pending {
    id: i64,
    /// The materialization it builds on: a copy of the state and its sequence number.
    base: (State, u64),
    /// The end of its changes (exclusive).
    to: u64,
    persist: PersistFuture,
}

/// A completed checkpoint: what a restore needs.
struct Completed {
    id: i64,
    base: (State, u64),
    snapshot: SnapshotResult,
}

/// The key group of a key, as a stable hash modulo the key groups.
fn key_group(key: &str) -> i32 {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (hash % KEY_GROUPS as u64) as i32
}

/// The input: an endless, deterministic stream of words.
fn words() -> impl Iterator<Item = String> {
    const WORDS: &[&str] = &[
        "state",
        "change",
        "log",
        "durable",
        "checkpoint",
        "writer",
        "operator",
        "key",
        "group",
        "upload",
        "confirm",
        "truncate",
        "recover",
        "stream",
        "flink",
        "wasm",
    ];
    (0u64..).map(|i| {
        let x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 33;
        format!("{}-{}", WORDS[(x % 16) as usize], x % 50)
    })
}

fn main() -> Result<(), Box<dyn Error>> {
    // The files go to DIR, else to a temporary directory (made either way, removed at the end).
    let tmp = tempfile::tempdir()?;
    let dir = std::env::args_os()
        .nth(1)
        .map_or_else(|| tmp.path().to_path_buf(), PathBuf::from);
    let mut config = Config::default();
    config.set("dstl.dfs.base-path", &dir.to_string_lossy())?;
    let storage = ChangelogStorage::open(config)?;
    let writer = storage.create_writer(
        "word-count",
        KeyGroupRange {
            start: 0,
            end: KEY_GROUPS - 1,
        },
    )?;

    let mut state = State::new();
    let mut materialized: (State, u64) = (State::new(), writer.initial_sequence_number()?);
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut completed: Option<Completed> = None;
    let mut checkpoint = 0i64;

    for (record, word) in words().take(20_000).enumerate() {
        // Process the record: update the state and log the change (the new value).
        let count = state.entry(word.clone()).or_default();
        *count += 1;
        writer.append(key_group(&word), format!("{word}={count}").as_bytes())?;

        // The checkpoint coordinator asks for a checkpoint: the operator does not wait
        // for it, it goes on processing while the upload runs.
        if (record + 1) % CHECKPOINT_EVERY == 0 {
            checkpoint += 1;
            let to = writer.next_sequence_number()?;
            if checkpoint % MATERIALIZE_EVERY == 0 {
                materialized = (state.clone(), to);
            }
            pending.push_back(Pending {
                id: checkpoint,
                base: materialized.clone(),
                to,
                persist: writer.persist(materialized.1, checkpoint)?,
            });
        }

        // Checkpoints whose persist completed: the coordinator confirms them.
        while let Some(outcome) = pending.front_mut().and_then(|p| p.persist.try_wait()) {
            let done = pending.pop_front().expect("the front");
            completed = Some(confirm(&writer, done.id, done.base, done.to, outcome?)?);
        }
    }
    // The input ended: wait for the checkpoints still running.
    for done in pending {
        let snapshot = done.persist.wait()?;
        completed = Some(confirm(&writer, done.id, done.base, done.to, snapshot)?);
    }
    let last = completed.ok_or("no checkpoint completed")?;

    // Restore from the last checkpoint: the materialized copy, then the logged changes.
    let (mut restored, from) = last.base.clone();
    let changes = storage.read(&last.snapshot.remote)?;
    for change in &changes {
        let text = std::str::from_utf8(&change.value)?;
        let (word, count) = text.split_once('=').ok_or("a change is word=count")?;
        restored.insert(word.to_string(), count.parse()?);
    }
    let files: std::collections::BTreeSet<_> = last
        .snapshot
        .remote
        .entries
        .iter()
        .map(|e| &e.handle.path)
        .collect();
    println!(
        "checkpoint {}: materialized at sequence number {from}, {} changes logged since, in {} file(s)",
        last.id,
        changes.len(),
        files.len()
    );
    if restored != state {
        return Err("the restored state differs from the live state".into());
    }
    println!(
        "restored {} keys from checkpoint {}: identical to the live state",
        restored.len(),
        last.id
    );
    writer.close()?;
    storage.close();
    Ok(())
}

/// The coordinator confirmed checkpoint `done`: tell the writer, and drop the changes
/// below its materialization (no later checkpoint needs them).
fn confirm(
    writer: &dstl::Writer,
    id: i64,
    base: (State, u64),
    to: u64,
    snapshot: SnapshotResult,
) -> Result<Completed, dstl::Error> {
    writer.confirm(base.1, to, id)?;
    writer.truncate(base.1)?;
    Ok(Completed { id, base, snapshot })
}
