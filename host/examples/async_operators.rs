//! Writers in async code: operators as tokio tasks that wait on the storage's
//! availability signal instead of blocking their thread when the uploads in flight reach
//! `dstl.dfs.upload.max-in-flight`, and await their persists.
//!
//! A writer call never waits for an upload, with one exception: an upload it starts (a
//! persist, or an append that reaches the pre-emptive threshold) waits while the bytes in
//! flight are at the limit (back-pressure, as in Flink). An async operator checks
//! `availability.is_available()` before it processes more input and, when it is not,
//! awaits `availability.available()`, so the runtime's threads keep running other tasks.
//! The limit here is small, so the signal flips often.
//!
//! ```sh
//! cargo run --release -p dstl --example async_operators [-- DIR]
//! ```

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;

use dstl::{ChangelogStorage, Config, KeyGroupRange};

const OPERATORS: usize = 4;
const RECORDS: u64 = 20_000;
const CHECKPOINT_EVERY: u64 = 1_000;

/// What one operator did.
struct Stats {
    name: String,
    checkpoints: u64,
    /// How often it found the storage unavailable and waited.
    waits: u64,
    /// Changes its last checkpoint reads back.
    last_changes: usize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    // The files go to DIR, else to a temporary directory (made either way, removed at the end).
    let tmp = tempfile::tempdir()?;
    let dir = std::env::args_os()
        .nth(1)
        .map_or_else(|| tmp.path().to_path_buf(), PathBuf::from);
    let mut config = Config::default();
    config.apply_pairs([
        format!("dstl.dfs.base-path={}", dir.display()).as_str(),
        // Little room in flight and uploads that wait a little: back-pressure happens.
        "dstl.dfs.upload.max-in-flight=256kb",
        "dstl.dfs.batch.persist-size-threshold=128kb",
        "dstl.dfs.batch.persist-delay=5 ms",
        "dstl.dfs.preemptive-persist-threshold=64kb",
    ])?;
    let storage = Arc::new(ChangelogStorage::open(config)?);

    let mut operators = tokio::task::JoinSet::new();
    for index in 0..OPERATORS {
        operators.spawn(operator(storage.clone(), index));
    }
    while let Some(stats) = operators.join_next().await {
        let stats = stats??;
        println!(
            "{}: {} checkpoints, waited for availability {} times, last checkpoint holds {} changes",
            stats.name, stats.checkpoints, stats.waits, stats.last_changes
        );
    }
    let metrics = storage.metrics();
    println!(
        "{} files, {} bytes written, {} bytes in flight at the end",
        metrics.uploaded_files, metrics.written_bytes, metrics.bytes_in_flight
    );
    // Closing waits for running uploads: a blocking call, so off the async threads.
    let storage = Arc::into_inner(storage).ok_or("the operators still hold the storage")?;
    tokio::task::spawn_blocking(move || storage.close()).await?;
    Ok(())
}

/// One operator: appends records, checkpoints every `CHECKPOINT_EVERY`, and waits on the
/// availability signal rather than blocking.
async fn operator(
    storage: Arc<ChangelogStorage>,
    index: usize,
) -> Result<Stats, Box<dyn Error + Send + Sync>> {
    let name = format!("op-{index}");
    let writer = storage.create_writer(&name, KeyGroupRange { start: 0, end: 127 })?;
    let mut availability = storage.availability();
    let mut stats = Stats {
        name,
        checkpoints: 0,
        waits: 0,
        last_changes: 0,
    };
    let mut from = writer.initial_sequence_number()?;
    let mut last = None;
    let value = vec![index as u8; 200];
    for record in 0..RECORDS {
        if !availability.is_available() {
            stats.waits += 1;
            availability.available().await;
        }
        writer.append((record % 128) as i32, &value)?;
        if (record + 1) % CHECKPOINT_EVERY == 0 {
            let checkpoint = ((record + 1) / CHECKPOINT_EVERY) as i64;
            let to = writer.next_sequence_number()?;
            // Awaiting the persist suspends this task only.
            let snapshot = writer.persist(from, checkpoint)?.await?;
            writer.confirm(from, to, checkpoint)?;
            writer.truncate(to)?;
            stats.checkpoints += 1;
            last = Some(snapshot);
            from = to;
        }
        // Let the other operators run between records, as an input source would.
        if record % 64 == 0 {
            tokio::task::yield_now().await;
        }
    }
    writer.close()?;
    // Reading files is blocking I/O: off the async threads too.
    if let Some(snapshot) = last {
        let changes = tokio::task::spawn_blocking(move || storage.read(&snapshot.remote)).await??;
        stats.last_changes = changes.len();
    }
    Ok(stats)
}
