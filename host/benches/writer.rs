//! Micro-benchmarks of the writer's hot paths and of the codec.
//!
//! `cargo bench -p dstl --bench writer` measures; `cargo test --release -p dstl
//! --benches` runs every benchmark once as a smoke test.
//!
//! - `append`: one buffered `Writer::append` of a 100-byte value (the host hands packed
//!   batches to the sandbox; the handover is part of the measured cost).
//! - `append_batch`: one `append_batch` call of 1000 packed 100-byte changes.
//! - `persist`: `next_sequence_number` + `persist(..).wait()` + `confirm` + `truncate` of
//!   1000 × 100 B, uploaded to a local directory.
//! - `decode`: the codec's `decode_change_set` of a 1000 × 100 B block and
//!   `logical_bytes` of a Snappy-compressed 1 MiB file.
//! - `append_native_baseline`: the same appends into a plain `Vec`, for comparison.
//!
//! With `DSTL_BENCH_RECORDER=prometheus` the Prometheus metrics recorder is installed
//! before the storages open, to measure what recording costs when a process exports
//! metrics (without it, no recorder: the cost of the facade's empty handles).

use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dstl::{ChangelogStorage, Config, KeyGroupRange, Writer};
use dstl_proto::codec::{decode_change_set, encode_change_set, encode_file, logical_bytes};

/// Payload bytes of every change.
const VALUE_LEN: usize = 100;
/// Changes per batch, per persist and per decoded block.
const BATCH: usize = 1000;
/// Key groups of the benchmark writers: `[0, KEY_GROUPS)`.
const KEY_GROUPS: i32 = 128;
/// Appends between two checkpoints in the `append` benchmark, so the writer's open
/// change set (and its sandbox memory) stays bounded however many iterations run.
const APPENDS_PER_CHECKPOINT: u64 = 100_000;
/// The native baseline's vector is cleared at this length.
const BASELINE_CAPACITY: usize = 10_000;

/// A deterministic, moderately compressible value (text-like: 16 distinct bytes).
fn value(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..VALUE_LEN)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 16) as u8
        })
        .collect()
}

/// `n` changes as packed columns: key groups, lengths, data.
fn packed(n: usize) -> (Vec<i32>, Vec<u32>, Vec<u8>) {
    let key_groups = (0..n).map(|i| i as i32 % KEY_GROUPS).collect();
    let lengths = vec![VALUE_LEN as u32; n];
    let data = (0..n as u64).flat_map(value).collect();
    (key_groups, lengths, data)
}

/// Installs the recorder `DSTL_BENCH_RECORDER` names, once.
fn install_recorder() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match std::env::var("DSTL_BENCH_RECORDER").as_deref() {
        Ok("prometheus") => {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("install the Prometheus recorder");
        }
        Ok(other) => panic!("DSTL_BENCH_RECORDER={other}: expected `prometheus`"),
        Err(_) => {}
    });
}

/// A storage writing to `tmp` that neither persists pre-emptively nor delays uploads.
fn open_storage(tmp: &tempfile::TempDir) -> ChangelogStorage {
    install_recorder();
    let mut c = Config::new();
    c.set_base_path(tmp.path()).unwrap();
    for (key, value) in [
        ("dstl.writer.max-writers", "4"),
        ("dstl.dfs.preemptive-persist-threshold", "1tb"),
        ("dstl.dfs.batch.persist-delay", "0"),
    ] {
        c.set(key, value).unwrap();
    }
    ChangelogStorage::open(c).expect("open the storage")
}

fn create_writer(storage: &ChangelogStorage, name: &str) -> Writer {
    storage
        .create_writer(
            name,
            KeyGroupRange {
                start: 0,
                end: KEY_GROUPS - 1,
            },
        )
        .expect("create a writer")
}

/// Checkpoints everything from `from` on as checkpoint `cp`: closes the open change set,
/// persists, confirms and truncates; returns the next `from` and the uploaded files.
fn checkpoint(writer: &Writer, from: u64, cp: i64) -> (u64, BTreeSet<String>) {
    let sqn = writer.next_sequence_number().unwrap();
    let snapshot = writer.persist(from, cp).unwrap().wait().unwrap();
    writer.confirm(from, sqn, cp).unwrap();
    writer.truncate(sqn).unwrap();
    let files = snapshot
        .remote
        .entries
        .into_iter()
        .map(|e| e.handle.path)
        .collect();
    (sqn, files)
}

/// Deletes confirmed files, as the job manager does once a checkpoint is subsumed, so the
/// benchmark's disk use stays bounded.
fn discard(storage: &ChangelogStorage, files: BTreeSet<String>) {
    for path in files {
        storage.store().delete(&path).unwrap();
    }
}

/// Running state of a benchmark writer across criterion's samples.
struct Session {
    writer: Writer,
    from: u64,
    cp: i64,
}

impl Session {
    fn new(storage: &ChangelogStorage, name: &str) -> Self {
        Self {
            writer: create_writer(storage, name),
            from: 0,
            cp: 0,
        }
    }

    fn checkpoint(&mut self, storage: &ChangelogStorage) {
        self.cp += 1;
        let (next, files) = checkpoint(&self.writer, self.from, self.cp);
        self.from = next;
        discard(storage, files);
    }
}

fn bench_append(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open_storage(&tmp);
    let mut session = Session::new(&storage, "bench-append");
    let mut group = c.benchmark_group("append");
    group.throughput(Throughput::Elements(1));
    for (name, size) in [("100B", 100), ("1KiB", 1024), ("4KiB", 4096)] {
        let values: Vec<Vec<u8>> = (0..KEY_GROUPS as u64)
            .map(|seed| value(seed).into_iter().cycle().take(size).collect())
            .collect();
        // The same values as `Bytes` the caller gives away: a clone is a reference count,
        // so the writer's own work is what is timed.
        let owned: Vec<bytes::Bytes> = values.iter().cloned().map(bytes::Bytes::from).collect();
        // The same bytes between checkpoints whatever the size, within the sandbox's memory.
        let per_checkpoint = APPENDS_PER_CHECKPOINT * 100 / size as u64;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                between_checkpoints(&storage, &mut session, iters, per_checkpoint, |w, i| {
                    let key_group = (i % KEY_GROUPS as u64) as usize;
                    w.append(key_group as i32, black_box(&values[key_group]))
                        .unwrap();
                })
            })
        });
        group.bench_function(format!("{name} owned"), |b| {
            b.iter_custom(|iters| {
                between_checkpoints(&storage, &mut session, iters, per_checkpoint, |w, i| {
                    let key_group = (i % KEY_GROUPS as u64) as usize;
                    w.append_owned(key_group as i32, black_box(owned[key_group].clone()))
                        .unwrap();
                })
            })
        });
    }
    group.finish();
}

/// The time `iters` calls of `call` take (given the writer and the call's number within
/// its round), with an untimed checkpoint after every `per_checkpoint` of them, so the
/// writer's memory stays bounded however many iterations criterion asks for.
fn between_checkpoints(
    storage: &ChangelogStorage,
    session: &mut Session,
    iters: u64,
    per_checkpoint: u64,
    mut call: impl FnMut(&Writer, u64),
) -> Duration {
    let mut measured = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let round = (iters - done).min(per_checkpoint);
        let start = Instant::now();
        for i in 0..round {
            call(&session.writer, i);
        }
        measured += start.elapsed();
        done += round;
        session.checkpoint(storage);
    }
    measured
}

fn bench_append_batch(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open_storage(&tmp);
    let mut session = Session::new(&storage, "bench-append-batch");
    let (key_groups, lengths, data) = packed(BATCH);
    let mut group = c.benchmark_group("append_batch");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("1000x100B", |b| {
        b.iter_custom(|iters| {
            let per_checkpoint = APPENDS_PER_CHECKPOINT / BATCH as u64;
            between_checkpoints(&storage, &mut session, iters, per_checkpoint, |w, _| {
                w.append_batch(&key_groups, &lengths, black_box(&data))
                    .unwrap();
            })
        })
    });
    group.finish();
}

fn bench_persist(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let storage = open_storage(&tmp);
    let mut session = Session::new(&storage, "bench-persist");
    let (key_groups, lengths, data) = packed(BATCH);
    let mut group = c.benchmark_group("persist");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("1000x100B", |b| {
        b.iter_custom(|iters| {
            let mut measured = Duration::ZERO;
            for _ in 0..iters {
                // `append_batch` hands the changes to the sandbox now, so the measured
                // part is the checkpoint alone (buffered appends would be flushed inside
                // `next_sequence_number`).
                session
                    .writer
                    .append_batch(&key_groups, &lengths, &data)
                    .unwrap();
                session.cp += 1;
                let start = Instant::now();
                let (next, files) = checkpoint(&session.writer, session.from, session.cp);
                measured += start.elapsed();
                session.from = next;
                discard(&storage, files);
            }
            measured
        })
    });
    group.finish();
}

/// An encoded change-set block of `BATCH` changes with the values of seeds `first..`.
fn change_set_block(first: u64) -> Vec<u8> {
    let changes: Vec<(i32, Vec<u8>)> = (first..first + BATCH as u64)
        .map(|i| (i as i32 % KEY_GROUPS, value(i)))
        .collect();
    encode_change_set(changes.iter().map(|(k, v)| (*k, v.as_slice())))
}

fn bench_decode(c: &mut Criterion) {
    let block = change_set_block(0);
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("decode_change_set/1000x100B", |b| {
        b.iter(|| decode_change_set(black_box(&block), 0).unwrap())
    });

    // Blocks of 1000 × 100 B (each with other values) up to 1 MiB of logical bytes.
    let mut blocks = Vec::new();
    let mut logical_len = 0;
    while logical_len < 1 << 20 {
        let block = change_set_block(blocks.len() as u64 * BATCH as u64);
        logical_len += block.len();
        blocks.push(block);
    }
    let (file, _) = encode_file(&blocks, true).unwrap();
    assert_eq!(logical_bytes(&file).unwrap().len(), logical_len);
    group.throughput(Throughput::Bytes(logical_len as u64));
    group.bench_function("logical_bytes/snappy-1MiB", |b| {
        b.iter(|| logical_bytes(black_box(&file)).unwrap())
    });
    group.finish();
}

fn bench_native_baseline(c: &mut Criterion) {
    let values: Vec<Vec<u8>> = (0..KEY_GROUPS as u64).map(value).collect();
    let mut log: Vec<(i32, Vec<u8>)> = Vec::with_capacity(BASELINE_CAPACITY);
    let mut i = 0usize;
    let mut group = c.benchmark_group("append_native_baseline");
    group.throughput(Throughput::Elements(1));
    group.bench_function("100B", |b| {
        b.iter(|| {
            if log.len() == BASELINE_CAPACITY {
                log.clear();
            }
            let key_group = i % KEY_GROUPS as usize;
            i += 1;
            log.push((key_group as i32, black_box(&values[key_group]).to_vec()));
        })
    });
    group.finish();
    black_box(&log);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_append, bench_append_batch, bench_persist, bench_decode, bench_native_baseline
}
criterion_main!(benches);
