#!/usr/bin/env node
// Benchmarks of the Node host, shaped like the wasmtime host's (`cargo bench -p dstl
// --bench writer`, `dstl bench --workload small|density`), for BENCHMARKS.md:
//
// - append/100B: one buffered `append` of a 100-byte value (host-side packed batches; the
//   handover into the sandbox is part of the measured cost)
// - append_batch/1000x100B: one `appendBatch` call of 1000 packed 100-byte changes, per change
// - persist/1000x100B: next-sequence-number + persist (awaited) + confirm + truncate of
//   1000 × 100 B, uploaded to a local directory with fsync (no batching delay)
// - new writer: instantiating one more writer (its own component instance), and the
//   resident memory per idle writer
// - small, fanout, large, small-z: `node dstl-run.mjs` on `dstl bench`'s standard
//   workloads (same writers, changes, sizes, compression, seed; checkpoint every
//   10,000 / writers appends per writer), each in a fresh directory
//
// usage: node js/bench.mjs [--quick] [--json] [--only NAME,...]

import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { promisify } from 'node:util';

import { ChangelogStorage } from './lib/index.mjs';

const { values: options } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    json: { type: 'boolean', default: false },
    only: { type: 'string' },
  },
});
const only = options.only ? new Set(options.only.split(',')) : null;
const VALUE_LEN = 100;
const BATCH = 1000;
const KEY_GROUPS = 128;
const APPENDS_PER_CHECKPOINT = 100_000;
const RANGE = { start: 0, end: KEY_GROUPS - 1 };

/** The Rust bench's values: text-like, 16 distinct bytes, xorshift from the seed. */
function value(seed) {
  let x = BigInt.asUintN(64, BigInt(seed) * 0x9e3779b97f4a7c15n) | 1n;
  const out = new Uint8Array(VALUE_LEN);
  for (let i = 0; i < VALUE_LEN; i++) {
    x ^= BigInt.asUintN(64, x << 13n);
    x ^= x >> 7n;
    x ^= BigInt.asUintN(64, x << 17n);
    out[i] = 97 + Number(x % 16n);
  }
  return out;
}

function packed(n) {
  const keyGroups = Int32Array.from({ length: n }, (_, i) => i % KEY_GROUPS);
  const lengths = new Uint32Array(n).fill(VALUE_LEN);
  const data = new Uint8Array(n * VALUE_LEN);
  for (let i = 0; i < n; i++) data.set(value(i), i * VALUE_LEN);
  return { keyGroups, lengths, data };
}

async function openStorage(dir) {
  return ChangelogStorage.open(
    {
      'dstl.dfs.base-path': dir,
      'dstl.dfs.preemptive-persist-threshold': '1tb',
      'dstl.dfs.batch.persist-delay': '0',
    },
    { logger: () => {} },
  );
}

/** A writer with its checkpoint state; checkpoints delete their files (as the JM would). */
class Session {
  constructor(storage, name) {
    this.storage = storage;
    this.writer = storage.createWriter(name, RANGE);
    this.from = 0n;
    this.cp = 0n;
  }
  async checkpoint() {
    this.cp++;
    const sqn = this.writer.nextSequenceNumber();
    const snapshot = await this.writer.persist(this.from, this.cp);
    this.writer.confirm(this.from, sqn, this.cp);
    this.writer.truncate(sqn);
    this.from = sqn;
    for (const path of new Set(snapshot.remote.entries.map((e) => e.handle.path))) await this.storage.stores.remote.delete(path);
  }
}

/** Runs `sample` (returning [elapsed ms, elements]) until `seconds` passed; best of rounds. */
async function measure(seconds, sample) {
  const results = [];
  const end = performance.now() + seconds * 1000;
  while (performance.now() < end || results.length < 3) {
    const [ms, elements] = await sample();
    results.push((ms * 1e6) / elements);
  }
  results.sort((a, b) => a - b);
  return { best_ns: results[0], median_ns: results[Math.floor(results.length / 2)], samples: results.length };
}

const seconds = options.quick ? 0.3 : 3;
const results = {};

/** `measure` of `sample(session)` on a writer of its own, closed with its storage afterwards. */
async function measureSession(dir, name, sample) {
  const storage = await openStorage(dir);
  const session = new Session(storage, name);
  const r = await measure(seconds, () => sample(session));
  session.writer.close();
  await storage.close();
  return r;
}

async function benchAppend(dir) {
  const values = Array.from({ length: KEY_GROUPS }, (_, i) => value(i));
  const n = options.quick ? 10_000 : APPENDS_PER_CHECKPOINT;
  return measureSession(dir, 'bench-append', async (session) => {
    const start = performance.now();
    for (let i = 0; i < n; i++) session.writer.append(i % KEY_GROUPS, values[i % KEY_GROUPS]);
    const ms = performance.now() - start;
    await session.checkpoint();
    return [ms, n];
  });
}

async function benchAppendBatch(dir) {
  const { keyGroups, lengths, data } = packed(BATCH);
  const rounds = (options.quick ? 10_000 : APPENDS_PER_CHECKPOINT) / BATCH;
  return measureSession(dir, 'bench-append-batch', async (session) => {
    const start = performance.now();
    for (let i = 0; i < rounds; i++) session.writer.appendBatch(keyGroups, lengths, data);
    const ms = performance.now() - start;
    await session.checkpoint();
    return [ms, rounds * BATCH];
  });
}

async function benchPersist(dir) {
  const { keyGroups, lengths, data } = packed(BATCH);
  const r = await measureSession(dir, 'bench-persist', async (session) => {
    session.writer.appendBatch(keyGroups, lengths, data);
    const start = performance.now();
    await session.checkpoint();
    return [performance.now() - start, 1];
  });
  return { best_ms: r.best_ns / 1e6, median_ms: r.median_ns / 1e6, samples: r.samples };
}

function rssMb() {
  return process.memoryUsage().rss / 1e6;
}

async function benchNewWriter(dir) {
  const storage = await openStorage(dir);
  storage.createWriter('warm-up', RANGE).dispose();
  const n = options.quick ? 100 : 1000;
  globalThis.gc?.();
  const before = rssMb();
  const alive = [];
  const start = performance.now();
  for (let i = 0; i < n; i++) alive.push(storage.createWriter(`op-${i}`, RANGE));
  const elapsed = performance.now() - start;
  const after = rssMb();
  for (const w of alive) w.dispose();
  await storage.close();
  return { writers: n, us_per_writer: (elapsed * 1000) / n, kib_per_writer: ((after - before) * 1e6) / 1024 / n };
}

/**
 * Reading handles back (`storage.read`): 4 writers, 20 checkpoints of 1,000 changes of
 * 100 B each, every persist from sequence number 0, so each last snapshot names 20
 * change sets in 20 files shared by the writers; the four are read back per sample.
 */
async function benchRead(dir) {
  const storage = await openStorage(dir);
  const writers = Array.from({ length: 4 }, (_, i) => storage.createWriter(`op-${i}`, RANGE));
  const { keyGroups, lengths, data } = packed(BATCH);
  let snapshots = [];
  for (let cp = 1; cp <= 20; cp++) {
    snapshots = await Promise.all(
      writers.map((w) => {
        w.appendBatch(keyGroups, lengths, data);
        w.nextSequenceNumber();
        return w.persist(0, cp);
      }),
    );
  }
  const r = await measure(seconds, async () => {
    const start = performance.now();
    let changes = 0;
    for (const s of snapshots) changes += (await storage.read(s.remote)).length;
    return [performance.now() - start, changes];
  });
  for (const w of writers) w.close();
  await storage.close();
  return { best_ns: r.best_ns, median_ns: r.median_ns, samples: r.samples };
}

/**
 * `dstl bench`'s standard workloads (cli/src/workload/mod.rs `Workload::standard`): 128
 * key groups, seed 42, 10,000 appends over all writers between checkpoints.
 */
const WORKLOADS = {
  small: { writers: 1, changes: 2_000_000, changeSize: 100, compression: false },
  fanout: { writers: 8, changes: 2_000_000, changeSize: 100, compression: false },
  large: { writers: 1, changes: 200_000, changeSize: 4096, compression: false },
  'small-z': { writers: 1, changes: 2_000_000, changeSize: 100, compression: true },
};

/** `node dstl-run.mjs` on a standard workload, in a fresh directory (as `dstl bench`). */
async function benchWorkload(name, dir) {
  const load = WORKLOADS[name];
  const run = promisify(execFile);
  const cli = fileURLToPath(new URL('./dstl-run.mjs', import.meta.url));
  let changes = load.changes;
  let checkpointEvery = Math.floor(10_000 / load.writers);
  if (options.quick) {
    // As `dstl bench --quick`: a hundredth of the work.
    changes = Math.floor(changes / 100);
    checkpointEvery = Math.ceil(checkpointEvery / 100);
  }
  const args = [cli, '--dir', dir, '--writers', String(load.writers), '--changes', String(changes), '--change-size', String(load.changeSize), '--key-groups', '128', '--checkpoint-every', String(checkpointEvery), '--seed', '42', '--json'];
  if (load.compression) args.push('--compression');
  const start = performance.now();
  const { stdout } = await run(process.execPath, args, { maxBuffer: 1 << 24 });
  const processS = (performance.now() - start) / 1000;
  const s = JSON.parse(stdout);
  return {
    appends_per_s: s.appends_per_s,
    payload_mb_per_s: s.payload_mb_per_s,
    persist_p50_ms: s.persist_p50_ms,
    persist_p99_ms: s.persist_p99_ms,
    peak_rss_mb: s.peak_rss_mb,
    wall_s: s.wall_s,
    process_s: processS,
    checkpoints: s.checkpoints,
    files: s.files,
    verified: s.verified,
  };
}

const benches = [
  ['append', benchAppend],
  ['append_batch', benchAppendBatch],
  ['persist', benchPersist],
  ['new_writer', benchNewWriter],
  ['read', benchRead],
  ...Object.keys(WORKLOADS).map((name) => [name, (dir) => benchWorkload(name, dir)]),
];
for (const [name, bench] of benches) {
  if (only && !only.has(name)) continue;
  const dir = mkdtempSync(join(tmpdir(), `dstl-bench-${name}-`));
  try {
    results[name] = await bench(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  if (!options.json) process.stderr.write(`${name}: ${JSON.stringify(results[name])}\n`);
}
if (options.json) process.stdout.write(`${JSON.stringify({ node: process.version, ...results })}\n`);
else {
  const f = (x, d = 1) => x.toFixed(d);
  const lines = [];
  if (results.append) lines.push(`append/100B              ${f(results.append.best_ns)} ns per change (median ${f(results.append.median_ns)})`);
  if (results.append_batch) lines.push(`append_batch/1000x100B   ${f(results.append_batch.best_ns)} ns per change (median ${f(results.append_batch.median_ns)})`);
  if (results.persist) lines.push(`persist/1000x100B        ${f(results.persist.best_ms, 2)} ms per persist (median ${f(results.persist.median_ms, 2)})`);
  if (results.new_writer) lines.push(`new writer               ${f(results.new_writer.us_per_writer)} µs, ${f(results.new_writer.kib_per_writer)} KiB per idle writer (${results.new_writer.writers} writers)`);
  if (results.read) lines.push(`read/20x1000x100B        ${f(results.read.best_ns)} ns per change read back (median ${f(results.read.median_ns)})`);
  for (const name of Object.keys(WORKLOADS)) {
    const s = results[name];
    if (!s) continue;
    lines.push(`${name.padEnd(25)}${(s.appends_per_s / 1e6).toFixed(2)} M appends/s, ${f(s.payload_mb_per_s)} MB/s, persist p50 ${f(s.persist_p50_ms)} / p99 ${f(s.persist_p99_ms)} ms, peak RSS ${f(s.peak_rss_mb, 0)} MB, process ${f(s.process_s, 2)} s, verified ${s.verified}`);
  }
  process.stdout.write(`${lines.join('\n')}\n`);
}
