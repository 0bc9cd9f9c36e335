//! A writer on an S3-compatible object store, with the endpoint and credentials taken
//! from the environment as every AWS tool takes them: `AWS_ENDPOINT_URL` (omit it for
//! AWS itself), `AWS_REGION` (else `us-east-1`), `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`. Nothing secret goes into the configuration.
//!
//! ```sh
//! AWS_ENDPOINT_URL=http://127.0.0.1:8333 AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \
//!   cargo run --release -p dstl --features s3 --example s3 -- s3://bucket/prefix
//! ```
//!
//! The URL may also come from `DSTL_S3_URL`. The example writes three checkpoints of one
//! writer, reads the last one back from the store, and lists the objects it wrote.

use std::error::Error;

use dstl::{ChangelogStorage, Config, KeyGroupRange};

fn main() -> Result<(), Box<dyn Error>> {
    let Some(url) = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DSTL_S3_URL").ok())
    else {
        eprintln!("usage: s3 s3://bucket/prefix (or set DSTL_S3_URL)");
        std::process::exit(2);
    };
    let mut config = Config::default();
    // Only the location is configured; `dstl.s3.*` keys left unset fall back to the
    // AWS_* environment variables.
    config.set("dstl.dfs.base-path", &url)?;
    let storage = ChangelogStorage::open(config)?;
    println!("writing to {}", storage.store().describe());

    let writer = storage.create_writer("orders", KeyGroupRange { start: 0, end: 15 })?;
    let mut from = writer.initial_sequence_number()?;
    let mut last = None;
    for checkpoint in 1..=3i64 {
        for order in 0..1_000u32 {
            let record = format!("checkpoint {checkpoint} order {order}");
            writer.append((order % 16) as i32, record.as_bytes())?;
        }
        let to = writer.next_sequence_number()?;
        let snapshot = writer.persist(from, checkpoint)?.wait()?;
        writer.confirm(from, to, checkpoint)?;
        writer.truncate(to)?;
        from = to;
        last = Some(snapshot);
    }
    let last = last.expect("three checkpoints");
    let changes = storage.read(&last.remote)?;
    println!(
        "the last checkpoint holds {} changes, read back from the store",
        changes.len()
    );
    for entry in &last.remote.entries {
        println!(
            "  {} (offset {}, {} bytes)",
            entry.handle.path, entry.offset, entry.size
        );
    }
    if changes.len() != 1_000 {
        return Err(format!("expected 1000 changes, read {}", changes.len()).into());
    }
    writer.close()?;
    storage.close();
    Ok(())
}
