// `node dstl-run.mjs`: the same changes as the wasmtime host's `dstl run` for the same
// seed (digests below were printed by `dstl read --digest` on manifests `dstl run` wrote
// with the same options), manifests, and errors.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { loadManifest, readHandle, digest } from '../lib/index.mjs';

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

test('seed 42, 1 writer: the digest dstl run gives', async () => {
  const dir = join(base, 'a');
  const out = await cli(['--dir', join(dir, 'data'), '--manifests', join(dir, 'm'), '--writers', '1', '--changes', '20000', '--checkpoint-every', '5000', '--seed', '42', '--json']);
  assert.equal(out.code, 0, out.stderr);
  const summary = JSON.parse(out.stdout);
  assert.equal(summary.verified, true);
  assert.equal(summary.changes, 20000);
  assert.equal(summary.checkpoints, 4);
  for (const key of ['writers', 'payload_bytes', 'files', 'bytes_written', 'wall_s', 'appends_per_s', 'payload_mb_per_s', 'persist_p50_ms', 'persist_p99_ms', 'peak_rss_mb', 'dir', 'metrics']) {
    assert.ok(key in summary, key);
  }
  const expected = 'changes=10000 sha256=e92113cadb07e1c045666b0cfa4e197183040728d319dc4f7fcfd444ee0ea7cc';
  assert.equal(summary.digests['op-0'], expected);
  const manifest = JSON.parse(readFileSync(join(dir, 'm', 'op-0.json'), 'utf8'));
  assert.deepEqual(Object.keys(manifest), ['storage_id', 'key_group_range', 'state_size', 'incremental_size', 'entries', 'local', 'writer', 'checkpoint_id', 'sequence_from', 'sequence_to', 'changes']);
  assert.equal(manifest.checkpoint_id, 4);
  assert.deepEqual(manifest.changes, [10000, 20000]);
  const { remote } = await loadManifest(join(dir, 'm', 'op-0.json'));
  const changes = await readHandle(remote);
  assert.equal(`changes=${changes.length} sha256=${digest(changes)}`, expected);
});

test('two writers, compressed, odd sizes: the digests dstl run gives', async () => {
  const dir = join(base, 'b');
  const out = await cli(['--dir', join(dir, 'data'), '--manifests', join(dir, 'm'), '--writers', '2', '--changes', '20000', '--checkpoint-every', '3000', '--key-groups', '16', '--change-size', '37', '--seed', '9', '--compression', '--json']);
  assert.equal(out.code, 0, out.stderr);
  const summary = JSON.parse(out.stdout);
  assert.equal(summary.verified, true);
  assert.equal(summary.digests['op-0'], 'changes=4000 sha256=f91f358dac82cf1885a2ed7333d323b6b84ad30194354ec3e13bb2b8d19b63c4');
  assert.equal(summary.digests['op-1'], 'changes=4000 sha256=3ef9087edbaf87098f69f9ab79148325782567cdc7c5da158081f3506a01b9f0');
  const manifest = JSON.parse(readFileSync(join(dir, 'm', 'op-1.json'), 'utf8'));
  assert.equal(readFileSync(manifest.entries[0].path)[0], 1, 'Snappy-framed');
});

test('bad options fail with exit status 2 and a message naming the value', async () => {
  for (const [args, message] of [
    [['--writers', '0'], '--writers 0 must be between 1 and 10000'],
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

test('--help prints the options; --conf sets the base path unless --dir is given', async () => {
  const help = await cli(['--help']);
  assert.equal(help.code, 0);
  for (const option of ['--dir', '--writers', '--changes', '--change-size', '--key-groups', '--checkpoint-every', '--compression', '--seed', '--manifests', '--conf', '--json']) {
    assert.ok(help.stdout.includes(option), option);
  }
  const dir = join(base, 'conf-dir');
  const out = await cli(['--conf', `dstl.dfs.base-path=${dir}`, '--conf', 'dstl.job-id=0123456789abcdef0123456789abcdef', '--writers', '1', '--changes', '100', '--json']);
  assert.equal(out.code, 0, out.stderr);
  assert.equal(JSON.parse(out.stdout).dir, join(dir, '0123456789abcdef0123456789abcdef', 'dstl'));
});
