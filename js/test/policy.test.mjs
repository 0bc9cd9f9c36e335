// The upload policy as the Node host runs it: dstl-proto's `retry`, `batch` and `handoff`
// through the component's `policy` export, on simulated milliseconds. The machines' own
// cases are dstl-proto's unit tests; these check the wiring, the wording the Rust host
// shares, and that the writer's hand-off budget hands buffered appends over exactly at the
// pre-emptive threshold.

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';

import { ChangelogStorage } from '../lib/index.mjs';

const dir = mkdtempSync(join(tmpdir(), 'dstl-policy-'));
after(() => rmSync(dir, { recursive: true, force: true }));

let count = 0;
async function open(settings = {}) {
  return ChangelogStorage.open({ 'dstl.dfs.base-path': join(dir, String(count++)), ...settings });
}

/** Drains the attempts a retry machine says to start. */
function starts(retry) {
  const started = [];
  for (let n = retry.pollStart(); n !== undefined; n = retry.pollStart()) started.push(n);
  return started;
}

test('a retry machine starts a speculative attempt at the timeout and words the failure as the Rust host', async () => {
  const storage = await open();
  try {
    const { Retry } = storage.ownership.policy;
    const retry = new Retry({ maxAttempts: 2, timeoutMs: 1000n, delayMs: 500n }, 0n);
    assert.deepEqual(starts(retry), [1]);
    assert.equal(retry.pollTimeout(), 1000n);
    retry.handleTimeout(999n);
    assert.deepEqual(starts(retry), [], 'not before the deadline');
    retry.handleTimeout(1000n);
    assert.deepEqual(starts(retry), [2], 'attempt 2 beside the hung attempt 1');
    assert.equal(retry.mayStart(1), false);
    assert.equal(retry.mayStart(2), true);
    retry.handleTimeout(2000n);
    assert.deepEqual(retry.outcome(), { tag: 'failed', val: 'upload failed after 2 attempts; last: attempt 2 timed out after 1000 ms' });
    // A result after the decision loses.
    retry.attemptFinished(1, 'succeeded', '', 2500n);
    assert.equal(retry.outcome().tag, 'failed');

    const io = new Retry({ maxAttempts: 3, timeoutMs: undefined, delayMs: 500n }, 0n);
    starts(io);
    io.attemptFinished(1, 'retryable', 'could not write x: disk full', 10n);
    assert.equal(io.pollTimeout(), 510n, 'the delay after a failure');
    io.handleTimeout(510n);
    assert.deepEqual(starts(io), [2]);
    io.attemptFinished(2, 'fatal', 'the codec failed', 600n);
    assert.deepEqual(io.outcome(), { tag: 'failed', val: 'upload failed after 2 attempts; last: attempt 2: the codec failed' });
  } finally {
    await storage.close();
  }
});

test('a batcher holds tasks for the delay, sends them at the size threshold, and a large one at once', async () => {
  const storage = await open();
  try {
    const batcher = new storage.ownership.policy.Batcher(10n, 1000n);
    assert.equal(batcher.push(1n, 100n, 0n), undefined);
    assert.equal(batcher.pollTimeout(), 10n);
    assert.equal(batcher.push(2n, 100n, 5n), undefined);
    assert.equal(batcher.handleTimeout(9n), undefined);
    assert.deepEqual([...batcher.handleTimeout(10n)], [1n, 2n]);
    assert.equal(batcher.pollTimeout(), undefined);
    assert.equal(batcher.push(3n, 400n, 20n), undefined);
    assert.deepEqual([...batcher.push(4n, 600n, 21n)], [3n, 4n], 'at the size threshold');
    assert.equal(batcher.push(5n, 100n, 30n), undefined);
    assert.deepEqual([...batcher.push(6n, 500n, 31n)], [5n, 6n], 'half the threshold leaves at once, with what waited');
    assert.equal(batcher.push(7n, 1n, 40n), undefined);
    assert.deepEqual([...batcher.take()], [7n]);
  } finally {
    await storage.close();
  }
});

test('buffered appends reach the writer exactly when its open change set reaches the threshold', async () => {
  // A long persist delay keeps a scheduled task in the queue, where it can be seen.
  const storage = await open({ 'dstl.dfs.preemptive-persist-threshold': '1000b', 'dstl.dfs.batch.persist-delay': '1 min' });
  try {
    const w = storage.createWriter('w', { start: 0, end: 127 });
    // The writer answers 900 open bytes; the budget left is 100.
    w.appendBatch([1], [900], new Uint8Array(900));
    w.append(1, new Uint8Array(60));
    assert.equal(storage.scheduler.queueSize(), 0, 'buffered: 960 bytes open');
    w.append(2, new Uint8Array(40));
    assert.equal(storage.scheduler.queueSize(), 1, 'at 1000 bytes the writer uploads, at this append');
    // The upload emptied the open set: a whole threshold again.
    w.append(3, new Uint8Array(999));
    assert.equal(storage.scheduler.queueSize(), 1);
    w.append(3, new Uint8Array(1));
    assert.equal(storage.scheduler.queueSize(), 2);
    // A refused persist leaves the budget as it was; a new sequence number empties the set.
    assert.throws(() => w.persist(7, 1), (e) => e.kind === 'not-yet-appended');
    w.append(4, new Uint8Array(999));
    assert.equal(storage.scheduler.queueSize(), 2);
    assert.equal(w.nextSequenceNumber(), 3n);
    w.append(4, new Uint8Array(999));
    assert.equal(storage.scheduler.queueSize(), 2, 'a rollover emptied the set');
    w.close();
  } finally {
    await storage.close();
  }
});

test('durations below a millisecond drive the machines, rounded up', async () => {
  const storage = await open({ 'dstl.dfs.batch.persist-delay': '500us', 'dstl.dfs.upload.next-attempt-delay': '10us', 'dstl.dfs.upload.timeout': '30 s' });
  try {
    const w = storage.createWriter('w', { start: 0, end: 127 });
    w.append(1, Buffer.from('x'));
    const snapshot = await w.persist(0, 1);
    assert.equal(snapshot.remote.entries.length, 1);
    w.close();
  } finally {
    await storage.close();
  }
});
