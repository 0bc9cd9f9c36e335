#!/usr/bin/env node
// `dstl run` on the Node host: simulated operators append seeded changes and checkpoint
// (next-sequence-number, persist, confirm, truncate); every writer's latest manifest is
// rewritten after each checkpoint with `--manifests DIR`; at the end every writer's last
// checkpoint is read back and checked against the changes regenerated from the seed.
//
// Same options, same protocol (cli/src/workload/mod.rs), same changes for the same seed
// (copied from a pool of rand_chacha ChaCha8 bytes: run/workload.mjs), same manifest JSON
// and same `--json` summary fields as the wasmtime host's `dstl run`.

import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { ChangelogStorage, Config, DstlError, digest, storeManifest } from './lib/index.mjs';
import { BATCH, Changes, Pool } from './run/workload.mjs';

const USAGE = `usage: dstl-run [options]   (or: node dstl-run.mjs [options])

  --dir DIR               base directory of the changelog files (default ./dstl-data)
  --writers N             simulated operators, one writer each (default 4)
  --changes N             changes in total, split evenly across writers (default 400000)
  --change-size BYTES     bytes per change (default 100)
  --key-groups K          key groups per writer, 0..K-1 (default 128)
  --checkpoint-every N    appends per writer between checkpoints (default 10000)
  --max-pending-checkpoints N
                          a checkpoint due while a writer has N pending waits until one
                          completes; the writer goes on appending (default 64)
  --compression           Snappy-framed files
  --seed S                seed of the change bytes (default 42)
  --manifests DIR         after each checkpoint, atomically rewrite DIR/<writer>.json
  --conf KEY=VALUE        any configuration key (repeatable)
  --json                  print the summary as one JSON object on stdout
  --wasm PATH             a dstl_guest.wasm to run instead of the packaged component
                          (default: $DSTL_GUEST_WASM; transpiling it needs @bytecodealliance/jco)
  -h, --help              this text`;

class UsageError extends Error {}

function integer(name, value, min, max) {
  if (!/^[0-9]+$/.test(value)) throw new UsageError(`--${name} ${value}: expected a whole number`);
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < min || n > max) throw new UsageError(`--${name} ${value} must be between ${min} and ${max}`);
  return n;
}

function parseOptions(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: {
        dir: { type: 'string' },
        writers: { type: 'string', default: '4' },
        changes: { type: 'string', default: '400000' },
        'change-size': { type: 'string', default: '100' },
        'key-groups': { type: 'string', default: '128' },
        'checkpoint-every': { type: 'string', default: '10000' },
        'max-pending-checkpoints': { type: 'string', default: '64' },
        compression: { type: 'boolean', default: false },
        seed: { type: 'string', default: '42' },
        manifests: { type: 'string' },
        conf: { type: 'string', multiple: true, default: [] },
        json: { type: 'boolean', default: false },
        wasm: { type: 'string' },
        help: { type: 'boolean', short: 'h', default: false },
      },
      strict: true,
      allowPositionals: false,
    });
  } catch (e) {
    throw new UsageError(e.message);
  }
  const v = parsed.values;
  if (v.help) return { help: true };
  if (!/^[0-9]+$/.test(v.seed) || BigInt(v.seed) >= 1n << 64n) throw new UsageError(`--seed ${v.seed}: expected an unsigned 64-bit integer`);
  return {
    dir: v.dir,
    writers: integer('writers', v.writers, 1, 10_000),
    changes: integer('changes', v.changes, 0, Number.MAX_SAFE_INTEGER),
    changeSize: integer('change-size', v['change-size'], 0, 64 << 20),
    keyGroups: integer('key-groups', v['key-groups'], 1, 32_768),
    checkpointEvery: integer('checkpoint-every', v['checkpoint-every'], 1, Number.MAX_SAFE_INTEGER),
    maxPendingCheckpoints: integer('max-pending-checkpoints', v['max-pending-checkpoints'], 1, Number.MAX_SAFE_INTEGER),
    compression: v.compression,
    seed: BigInt(v.seed),
    manifests: v.manifests,
    conf: v.conf,
    json: v.json,
    wasm: v.wasm,
  };
}

function percentile(sorted, p) {
  if (sorted.length === 0) return 0;
  const i = Math.min(Math.max(Math.ceil(sorted.length * p), 1), sorted.length) - 1;
  return sorted[i];
}

/**
 * One operator, with the protocol of the Flink harness (as `dstl run`,
 * cli/src/workload/mod.rs `run_writer`): appends in packed batches; after every
 * `checkpointEvery` appends, `to = nextSequenceNumber()` and `persist(from = the end of
 * the last confirmed checkpoint)`. The operator never waits for a checkpoint (only the
 * in-flight limit holds it); after each batch it takes, in order, the persists that
 * completed meanwhile and confirms each (as the checkpoint coordinator would tell the
 * task), truncating to its end when that is past the confirmed end. A checkpoint due
 * while `maxPendingCheckpoints` are pending waits for the first batch boundary after one
 * completes. After the last append it takes a final checkpoint and waits for every
 * persist, in order.
 */
async function runWriter(storage, workload, pool, index, changes, progress) {
  const name = `op-${index}`;
  const writer = storage.createWriter(name, { start: 0, end: workload.keyGroups - 1 });
  const source = new Changes(pool, index, workload.keyGroups);
  const outcome = { latencies: [], checkpoints: 0, last: null };
  // The end of the last confirmed checkpoint: (sequence number, change index), where the
  // next persist starts.
  let confirmed = [0n, 0];
  /** A persist completed: confirm, truncate, record, write the manifest. */
  const confirm = async (checkpoint, snapshot) => {
    outcome.latencies.push(performance.now() - checkpoint.started);
    writer.confirm(checkpoint.from, checkpoint.to, checkpoint.id);
    if (checkpoint.to > confirmed[0]) {
      writer.truncate(checkpoint.to);
      confirmed = [checkpoint.to, checkpoint.changes[1]];
    }
    if (workload.manifests) {
      const path = join(workload.manifests, `${name}.json`);
      try {
        await storeManifest(path, snapshot, {
          writer: name,
          checkpointId: checkpoint.id,
          sequenceFrom: checkpoint.from,
          sequenceTo: checkpoint.to,
          changes: checkpoint.changes,
        });
      } catch (e) {
        throw new Error(`cannot write manifest ${path}: ${e.message}`);
      }
    }
    outcome.checkpoints++;
    outcome.last = { snapshot, from: checkpoint.changes[0], to: checkpoint.changes[1] };
  };
  /** @type {{settled: boolean, value?: object, error?: unknown, promise: Promise<object>, checkpoint: object}[]} */
  const pending = [];
  let done = 0;
  let sinceCheckpoint = 0;
  let checkpoint = 0;
  while (done < changes) {
    // Past a checkpoint deferred by the cap on pending ones: whole batches until it is taken.
    const untilCheckpoint = workload.checkpointEvery - sinceCheckpoint;
    const n = Math.min(BATCH, changes - done, untilCheckpoint > 0 ? untilCheckpoint : BATCH);
    // Back-pressure: the in-flight limit is an admission before appending (Node cannot
    // block inside the writer's upload import).
    if (!storage.isAvailable()) await storage.available();
    // The operator's input, copied from the pool as records arrive from upstream, into
    // the pool's one batch: appended before anything else runs.
    const { keyGroups, lengths, data } = source.batch(done, n);
    writer.appendBatch(keyGroups, lengths, data);
    done += n;
    sinceCheckpoint += n;
    progress(n);
    // Let uploads (and other writers) progress, as they would on their own threads.
    await yieldToEventLoop();
    // Persists that completed meanwhile, in order (a later one never completes before
    // an earlier one: its range holds the earlier one's).
    while (pending.length > 0 && pending[0].settled) {
      const finished = pending.shift();
      if (finished.error !== undefined) throw finished.error;
      await confirm(finished.checkpoint, finished.value);
    }
    const due = sinceCheckpoint >= workload.checkpointEvery && pending.length < workload.maxPendingCheckpoints;
    if (due || done === changes) {
      checkpoint++;
      const to = writer.nextSequenceNumber();
      const [from, first] = confirmed;
      const started = performance.now();
      const entry = {
        settled: false,
        promise: writer.persist(from, checkpoint),
        checkpoint: { started, id: checkpoint, from, to, changes: [first, done] },
      };
      const settle = (outcome) => Object.assign(entry, { settled: true }, outcome);
      entry.promise.then((value) => settle({ value }), (error) => settle({ error }));
      pending.push(entry);
      sinceCheckpoint = 0;
    }
  }
  for (const { promise, checkpoint: finished } of pending) await confirm(finished, await promise);
  writer.close();
  return outcome;
}

/** Resolves after the event loop's next turn (I/O callbacks included). */
function yieldToEventLoop() {
  return new Promise((resolve) => setImmediate(resolve));
}

/** The changes [from, to) of writer `index`, regenerated from the seed. */
function expectedChanges(workload, pool, index, from, to) {
  const source = new Changes(pool, index, workload.keyGroups);
  const out = [];
  for (let i = from; i < to; i++) out.push([source.keyGroup(i), source.value(i)]);
  return out;
}

/** Compares per key group, in append order (the format keeps no order across them). */
function verify(workload, pool, index, changes, from, to) {
  const group = (list) => {
    const map = new Map();
    for (const [kg, value] of list) {
      if (!map.has(kg)) map.set(kg, []);
      map.get(kg).push(Buffer.from(value).toString('base64'));
    }
    return map;
  };
  const want = group(expectedChanges(workload, pool, index, from, to));
  const got = group(changes.map((c) => [c.keyGroup, c.value]));
  if (want.size !== got.size) return false;
  for (const [kg, values] of want) {
    const other = got.get(kg);
    if (!other || other.length !== values.length || other.some((v, i) => v !== values[i])) return false;
  }
  return true;
}

async function main(argv) {
  const workload = parseOptions(argv);
  if (workload.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  // As `dstl run`: defaults, then --conf, then --dir and --compression.
  const config = new Config();
  for (const pair of workload.conf) {
    const eq = pair.indexOf('=');
    if (eq < 0) throw new UsageError(`--conf ${pair} is not of the form key=value`);
    config.set(pair.slice(0, eq).trim(), pair.slice(eq + 1));
  }
  if (workload.dir !== undefined) config.set('dstl.dfs.base-path', workload.dir);
  if (workload.compression) config.compression = true;
  if (workload.manifests) {
    try {
      await mkdir(workload.manifests, { recursive: true });
    } catch (e) {
      throw new Error(`cannot create the manifest directory ${workload.manifests}: ${e.message}`);
    }
  }
  const storage = await ChangelogStorage.open(config, { wasm: workload.wasm });
  let appended = 0;
  let lastShown = 0;
  const showProgress = !workload.json && process.stderr.isTTY;
  const progress = (n) => {
    appended += n;
    const now = performance.now();
    if (showProgress && now - lastShown > 250) {
      lastShown = now;
      process.stderr.write(`\r${appended} / ${workload.changes} changes`);
    }
  };
  const share = (i) => Math.floor(workload.changes / workload.writers) + (i < workload.changes % workload.writers ? 1 : 0);
  // The input pool, before the clock starts (as `dstl run`).
  const pool = new Pool(workload.seed, workload.changeSize);
  const started = performance.now();
  const outcomes = await Promise.all(
    Array.from({ length: workload.writers }, (_, i) =>
      runWriter(storage, workload, pool, i, share(i), progress).catch((e) => {
        e.message = `writer op-${i}: ${e.message}`;
        throw e;
      }),
    ),
  );
  await storage.idle();
  const wall = (performance.now() - started) / 1000;
  // The workload's memory, before verification reads the last checkpoints back.
  const peakRssMb = process.resourceUsage().maxRSS / 1024;
  if (showProgress) process.stderr.write('\n');
  let verified = true;
  const latencies = [];
  const digests = {};
  let checkpoints = 0;
  for (const [i, outcome] of outcomes.entries()) {
    latencies.push(...outcome.latencies);
    checkpoints += outcome.checkpoints;
    if (!outcome.last) {
      verified &&= share(i) === 0;
      continue;
    }
    const changes = await storage.read(outcome.last.snapshot.remote);
    digests[`op-${i}`] = `changes=${changes.length} sha256=${digest(changes)}`;
    if (!verify(workload, pool, i, changes, outcome.last.from, outcome.last.to)) {
      throw new Error(
        `verification failed: the last checkpoint of op-${i} read back ${changes.length} changes but changes ${outcome.last.from}..${outcome.last.to} were appended, or their bytes differ`,
      );
    }
  }
  latencies.sort((a, b) => a - b);
  const metrics = storage.metrics();
  await storage.close();
  const payload = workload.changes * workload.changeSize;
  const summary = {
    writers: workload.writers,
    changes: workload.changes,
    payload_bytes: payload,
    checkpoints,
    files: metrics.uploaded_files,
    bytes_written: metrics.written_bytes,
    wall_s: wall,
    appends_per_s: workload.changes / wall,
    payload_mb_per_s: payload / 1e6 / wall,
    persist_p50_ms: percentile(latencies, 0.5),
    persist_p99_ms: percentile(latencies, 0.99),
    peak_rss_mb: peakRssMb,
    verified,
    dir: storage.config.jobDir(),
    metrics,
    digests,
  };
  if (workload.json) {
    process.stdout.write(`${JSON.stringify(summary)}\n`);
  } else {
    const lines = [
      `dstl run (Node host): ${summary.writers} writers, ${summary.changes} changes of ${workload.changeSize} B`,
      `  ${summary.checkpoints} checkpoints, ${summary.files} files, ${summary.bytes_written} bytes written to ${summary.dir}`,
      `  ${summary.wall_s.toFixed(2)} s, ${Math.round(summary.appends_per_s)} appends/s, ${summary.payload_mb_per_s.toFixed(1)} MB/s payload`,
      `  persist p50 ${summary.persist_p50_ms.toFixed(2)} ms, p99 ${summary.persist_p99_ms.toFixed(2)} ms, peak RSS ${summary.peak_rss_mb.toFixed(0)} MB`,
      `  last checkpoints read back and verified: ${summary.verified}`,
      ...Object.entries(digests).map(([w, d]) => `  ${w}: ${d}`),
    ];
    process.stdout.write(`${lines.join('\n')}\n`);
  }
  return verified ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (e) => {
    if (e instanceof UsageError) {
      process.stderr.write(`error: ${e.message}\n\n${USAGE}\n`);
      process.exitCode = 2;
    } else {
      process.stderr.write(`error: ${e instanceof DstlError ? e.message : e?.stack ?? e}\n`);
      process.exitCode = 1;
    }
  },
);


