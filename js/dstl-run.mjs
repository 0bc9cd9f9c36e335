#!/usr/bin/env node
// `dstl run` on the Node host: simulated operators append seeded changes and checkpoint
// (next-sequence-number, persist, confirm, truncate); every writer's latest manifest is
// rewritten after each checkpoint with `--manifests DIR`; at the end every writer's last
// checkpoint is read back and checked against the changes regenerated from the seed.
//
// Same options, same changes for the same seed (the generator is rand_chacha's ChaCha8),
// same manifest JSON and same `--json` summary fields as the wasmtime host's `dstl run`.

import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { ChangelogStorage, Config, DstlError, digest, manifestFromSnapshot, storeManifest } from './lib/index.mjs';
import { Changes, generatedBatches } from './lib/workload.mjs';

const USAGE = `usage: node js/dstl-run.mjs [options]

  --dir DIR               base directory of the changelog files (default ./dstl-data)
  --writers N             simulated operators, one writer each (default 4)
  --changes N             changes in total, split evenly across writers (default 400000)
  --change-size BYTES     bytes per change (default 100)
  --key-groups K          key groups per writer, 0..K-1 (default 128)
  --checkpoint-every N    appends per writer between checkpoints (default 10000)
  --compression           Snappy-framed files
  --seed S                seed of the change bytes (default 42)
  --manifests DIR         after each checkpoint, atomically rewrite DIR/<writer>.json
  --conf KEY=VALUE        any configuration key (repeatable)
  --json                  print the summary as one JSON object on stdout
  --wasm PATH             the writer component (default: $DSTL_GUEST_WASM or the cargo build)
  -h, --help              this text`;

/** Checkpoints whose persist may run while the operator appends on. */
const OUTSTANDING_CHECKPOINTS = 2;

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
 * One operator: appends in packed batches and triggers a checkpoint every
 * `checkpointEvery` appends; completed persists are confirmed in order (as the
 * checkpoint coordinator would), truncating up to the end of the checkpoint before.
 * Checkpoint k persists from the end of checkpoint k-2 (as `dstl run`).
 */
async function runWriter(storage, workload, index, changes, progress) {
  const name = `op-${index}`;
  const writer = storage.createWriter(name, { start: 0, end: workload.keyGroups - 1 });
  const outcome = { latencies: [], checkpoints: 0, last: null };
  const inFlight = [];
  let coordinator = Promise.resolve();
  const confirmWhenDone = (pending) =>
    coordinator.then(async () => {
      const snapshot = await pending.promise;
      outcome.latencies.push(performance.now() - pending.started);
      writer.confirm(pending.from, pending.to, pending.checkpoint);
      writer.truncate(pending.truncateTo);
      if (workload.manifests) {
        const manifest = manifestFromSnapshot(snapshot, {
          writer: name,
          checkpointId: pending.checkpoint,
          sequenceFrom: pending.from,
          sequenceTo: pending.to,
          changes: pending.changes,
        });
        const path = join(workload.manifests, `${name}.json`);
        try {
          await storeManifest(path, manifest);
        } catch (e) {
          throw new Error(`cannot write manifest ${path}: ${e.message}`);
        }
      }
      outcome.checkpoints++;
      outcome.last = { snapshot, from: pending.changes[0], to: pending.changes[1] };
    });
  let done = 0;
  let sinceCheckpoint = 0;
  let checkpoint = 0;
  // (sequence number, change index) at the ends of the last two checkpoints.
  let ends = [
    [0n, 0],
    [0n, 0],
  ];
  // The operator's input: generated on a worker thread, as records arrive from upstream,
  // in packed batches that end at checkpoint boundaries.
  for await (const { keyGroups, lengths, data } of generatedBatches(workload, index, changes)) {
    const n = keyGroups.length;
    // The in-flight limit is an admission before appending: Node cannot block inside
    // the writer's upload import.
    if (!storage.isAvailable()) await storage.available();
    writer.appendBatch(keyGroups, lengths, data);
    done += n;
    sinceCheckpoint += n;
    progress(n);
    if (sinceCheckpoint === workload.checkpointEvery || done === changes) {
      checkpoint++;
      const to = writer.nextSequenceNumber();
      const [from, first] = ends[0];
      const pending = {
        started: performance.now(),
        promise: writer.persist(from, checkpoint),
        checkpoint,
        from,
        to,
        truncateTo: ends[1][0],
        changes: [first, done],
      };
      ends = [ends[1], [to, done]];
      coordinator = confirmWhenDone(pending);
      inFlight.push(coordinator);
      sinceCheckpoint = 0;
      // As `dstl run`: with this persist started, the operator waits while more than
      // OUTSTANDING_CHECKPOINTS are unconfirmed.
      while (inFlight.length > OUTSTANDING_CHECKPOINTS) await inFlight.shift();
    }
  }
  await coordinator;
  writer.close();
  return outcome;
}

/** The changes [from, to) of writer `index`, regenerated from the seed. */
function expectedChanges(workload, index, from, to) {
  const source = new Changes(workload, index);
  const kg = new Int32Array(1);
  const len = new Uint32Array(1);
  const out = [];
  const scratch = new Uint8Array(workload.changeSize);
  for (let i = 0; i < to; i++) {
    const value = i >= from ? new Uint8Array(workload.changeSize) : scratch;
    source.nextInto(kg, len, value, 0, 0);
    if (i >= from) out.push([kg[0], value]);
  }
  return out;
}

/** Compares per key group, in append order (the format keeps no order across them). */
function verify(workload, index, changes, from, to) {
  const group = (list) => {
    const map = new Map();
    for (const [kg, value] of list) {
      if (!map.has(kg)) map.set(kg, []);
      map.get(kg).push(Buffer.from(value).toString('base64'));
    }
    return map;
  };
  const want = group(expectedChanges(workload, index, from, to));
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
  const started = performance.now();
  const outcomes = await Promise.all(
    Array.from({ length: workload.writers }, (_, i) =>
      runWriter(storage, workload, i, share(i), progress).catch((e) => {
        e.message = `writer op-${i}: ${e.message}`;
        throw e;
      }),
    ),
  );
  await storage.idle();
  const wall = (performance.now() - started) / 1000;
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
    if (!verify(workload, i, changes, outcome.last.from, outcome.last.to)) {
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
    peak_rss_mb: process.resourceUsage().maxRSS / 1024,
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


