// `node dstl-run.mjs`: the same changes and protocol as the wasmtime host's `dstl run` for
// the same seed (digests below were printed by `dstl read --digest` on manifests `dstl run`
// wrote with the same options), manifests, and errors.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { loadManifest, readHandle, digest } from '../lib/index.mjs';
import { expectedDigest, expectedPool } from '../support/expected-input.mjs';

const run = promisify(execFile);
const CLI = fileURLToPath(new URL('../dstl-run.mjs', import.meta.url));
const base = mkdtempSync(join(tmpdir(), 'dstl-cli-'));
after(() => rmSync(base, { recursive: true, force: true }));

async function cli(args) {
  try {
    const { stdout, stderr } = await run(process.execPath, [CLI, ...args]);
    return { code: 0, stdout, stderr };
  } catch (e) {
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

// A batching delay longer than the run holds every upload until all checkpoints are
// taken; as the operator never waits for a checkpoint, its last one then persists from 0
// and holds every change, whatever the machine's speed. Its digest is what `dstl read
// --digest` printed for the manifest `dstl run` wrote with the same options.
const HELD = ['--conf', 'dstl.dfs.batch.persist-delay=2s'];

test('seed 42, 1 writer: the digest dstl run gives', async () => {
  const dir = join(base, 'a');
  const out = await cli(['--dir', join(dir, 'data'), '--manifests', join(dir, 'm'), '--writers', '1', '--changes', '20000', '--checkpoint-every', '5000', '--seed', '42', ...HELD, '--json']);
  assert.equal(out.code, 0, out.stderr);
  const summary = JSON.parse(out.stdout);
  assert.equal(summary.verified, true);
  assert.equal(summary.changes, 20000);
  assert.equal(summary.checkpoints, 4);
  for (const key of ['writers', 'payload_bytes', 'files', 'bytes_written', 'wall_s', 'appends_per_s', 'payload_mb_per_s', 'persist_p50_ms', 'persist_p99_ms', 'peak_rss_mb', 'dir', 'metrics']) {
    assert.ok(key in summary, key);
  }
  const expected = 'changes=20000 sha256=8fcfc3949f37427d6e15f6a018cf5d38999263c606eef3c25bfaba566eaeb9fe';
  assert.equal(summary.digests['op-0'], expected);
  const manifest = JSON.parse(readFileSync(join(dir, 'm', 'op-0.json'), 'utf8'));
  assert.deepEqual(Object.keys(manifest), ['storage_id', 'key_group_range', 'state_size', 'incremental_size', 'entries', 'local', 'writer', 'checkpoint_id', 'sequence_from', 'sequence_to', 'changes']);
  assert.equal(manifest.checkpoint_id, 4);
  assert.equal(manifest.sequence_from, 0);
  assert.deepEqual(manifest.changes, [0, 20000]);
  const { remote } = await loadManifest(join(dir, 'm', 'op-0.json'));
  const changes = await readHandle(remote);
  assert.equal(`changes=${changes.length} sha256=${digest(changes)}`, expected);
  assert.equal(expectedDigest(expectedPool(42n, 100), { keyGroups: 128, checkpointEvery: 5000 }, 0, 0, 20000), expected);
});

test('two writers, compressed, odd sizes: the digests dstl run gives', async () => {
  const dir = join(base, 'b');
  const out = await cli(['--dir', join(dir, 'data'), '--manifests', join(dir, 'm'), '--writers', '2', '--changes', '20000', '--checkpoint-every', '3000', '--key-groups', '16', '--change-size', '37', '--seed', '9', '--compression', ...HELD, '--json']);
  assert.equal(out.code, 0, out.stderr);
  const summary = JSON.parse(out.stdout);
  assert.equal(summary.verified, true);
  assert.equal(summary.checkpoints, 8);
  assert.equal(summary.digests['op-0'], 'changes=10000 sha256=bd23455c5931d4e1a725d0d52784d32ab2cfdcee7f06ce75c36a811e72e0aa73');
  assert.equal(summary.digests['op-1'], 'changes=10000 sha256=4741f532fe54c45689a081d59b32f415d6206c21a1ca2f7ecc2b7dae6f17d88c');
  const manifest = JSON.parse(readFileSync(join(dir, 'm', 'op-1.json'), 'utf8'));
  assert.deepEqual(manifest.changes, [0, 10000]);
  assert.equal(readFileSync(manifest.entries[0].path)[0], 1, 'Snappy-framed');
});

test('whichever checkpoint comes last, it holds changes [first, end) of the formula', async () => {
  // The default batching delay: which persists completed before the last checkpoint (so
  // where it starts) depends on timing; what it holds must not.
  const dir = join(base, 'c');
  const workload = { keyGroups: 32, checkpointEvery: 5000 };
  const out = await cli(['--dir', join(dir, 'data'), '--manifests', join(dir, 'm'), '--writers', '2', '--changes', '60001', '--checkpoint-every', '5000', '--key-groups', '32', '--change-size', '64', '--seed', '7', '--json']);
  assert.equal(out.code, 0, out.stderr);
  const summary = JSON.parse(out.stdout);
  assert.equal(summary.verified, true);
  assert.equal(summary.checkpoints, 13);
  const pool = expectedPool(7n, 64);
  for (const [i, end, checkpoints] of [[0, 30001, 7], [1, 30000, 6]]) {
    const manifest = JSON.parse(readFileSync(join(dir, 'm', `op-${i}.json`), 'utf8'));
    const [first, last] = manifest.changes;
    assert.equal(last, end, `op-${i}`);
    assert.equal(first % 5000, 0, `op-${i} starts at a checkpoint: ${first}`);
    assert.equal(manifest.checkpoint_id, checkpoints, `op-${i}`);
    const want = expectedDigest(pool, workload, i, first, last);
    assert.equal(summary.digests[`op-${i}`], want, `op-${i} [${first}, ${last})`);
    const { remote } = await loadManifest(join(dir, 'm', `op-${i}.json`));
    const changes = await readHandle(remote);
    assert.equal(`changes=${changes.length} sha256=${digest(changes)}`, want, `op-${i} read back`);
  }
});

test('bad options fail with exit status 2 and a message naming the value', async () => {
  for (const [args, message] of [
    [['--writers', '0'], '--writers 0 must be between 1 and 10000'],
    [['--max-pending-checkpoints', '0'], '--max-pending-checkpoints 0 must be between 1 and'],
    [['--key-groups', 'many'], '--key-groups many: expected a whole number'],
    [['--frobnicate'], "Unknown option '--frobnicate'"],
    [['--conf', 'dstl.dfs.upload.timeout=soon'], 'invalid value `soon` for `dstl.dfs.upload.timeout`'],
    [['--conf', 'nonsense'], '--conf nonsense is not of the form key=value'],
  ]) {
    const out = await cli(['--dir', join(base, 'bad'), ...args]);
    assert.notEqual(out.code, 0, args.join(' '));
    assert.ok(out.stderr.includes(message), `${args.join(' ')}: ${out.stderr}`);
    assert.equal(out.stdout, '');
  }
});

test('--max-pending-checkpoints 1 defers the checkpoints due while one is pending; the last still holds every change', async () => {
  const dir = join(base, 'capped');
  const out = await cli(['--dir', join(dir, 'data'), '--manifests', join(dir, 'm'), '--writers', '1', '--changes', '20000', '--checkpoint-every', '5000', '--max-pending-checkpoints', '1', '--seed', '42', ...HELD, '--json']);
  assert.equal(out.code, 0, out.stderr);
  const summary = JSON.parse(out.stdout);
  assert.equal(summary.verified, true);
  // The first checkpoint is held for the batching delay, so the two due after it are
  // deferred; the final one is always taken.
  assert.equal(summary.checkpoints, 2);
  const manifest = JSON.parse(readFileSync(join(dir, 'm', 'op-0.json'), 'utf8'));
  assert.equal(manifest.checkpoint_id, 2);
  assert.deepEqual(manifest.changes, [0, 20000]);
  const { remote } = await loadManifest(join(dir, 'm', 'op-0.json'));
  const changes = await readHandle(remote);
  assert.equal(`changes=${changes.length} sha256=${digest(changes)}`, summary.digests['op-0']);
});

test('--help prints the options; --conf sets the base path unless --dir is given', async () => {
  const help = await cli(['--help']);
  assert.equal(help.code, 0);
  for (const option of ['--dir', '--writers', '--changes', '--change-size', '--key-groups', '--checkpoint-every', '--max-pending-checkpoints', '--compression', '--seed', '--manifests', '--conf', '--json']) {
    assert.ok(help.stdout.includes(option), option);
  }
  const dir = join(base, 'conf-dir');
  const out = await cli(['--conf', `dstl.dfs.base-path=${dir}`, '--conf', 'dstl.job-id=0123456789abcdef0123456789abcdef', '--writers', '1', '--changes', '100', '--json']);
  assert.equal(out.code, 0, out.stderr);
  assert.equal(JSON.parse(out.stdout).dir, join(dir, '0123456789abcdef0123456789abcdef', 'dstl'));
});
