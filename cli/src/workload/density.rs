//! The density benchmark: many idle writers in one process.

use std::time::Instant;

use serde::Serialize;

use super::measure::current_rss_mb;
use dstl::{ChangelogStorage, KeyGroupRange};

/// What the density benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct Density {
    /// Writers created.
    pub writers: usize,
    /// Mean time to create one writer (instantiate its sandbox), in µs.
    pub us_per_writer: f64,
    /// Resident memory before creating them.
    pub rss_before_mb: f64,
    /// Resident memory with all of them alive and idle.
    pub rss_after_mb: f64,
    /// Resident memory per idle writer.
    pub kib_per_writer: f64,
}

/// Creates `writers` writers in one process and measures time and memory per writer.
pub fn density(storage: &ChangelogStorage, writers: usize) -> anyhow::Result<Density> {
    let range = KeyGroupRange { start: 0, end: 127 };
    // Warm up: the first instance pays one-time costs.
    drop(storage.create_writer("warm-up", range)?);
    let rss_before_mb = current_rss_mb();
    let started = Instant::now();
    let mut alive = Vec::with_capacity(writers);
    for i in 0..writers {
        alive.push(storage.create_writer(&format!("op-{i}"), range)?);
    }
    let elapsed = started.elapsed();
    let rss_after_mb = current_rss_mb();
    drop(alive);
    Ok(Density {
        writers,
        us_per_writer: elapsed.as_secs_f64() * 1e6 / writers.max(1) as f64,
        rss_before_mb,
        rss_after_mb,
        kib_per_writer: (rss_after_mb - rss_before_mb) * 1e6 / 1024.0 / writers.max(1) as f64,
    })
}
