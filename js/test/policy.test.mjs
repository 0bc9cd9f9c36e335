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

/** A retry step with its attempts as a plain array (jco gives a `Uint32Array`). */
function step({ start, outcome, timeout }) {
  return { start: [...start], outcome, timeout };
}

test('a retry machine starts a speculative attempt at the timeout and words the failure as the Rust host', async () => {
  const storage = await open();
  try {
    const { Retry } = storage.ownership.policy;
    const retry = new Retry({ kind: 'fixed', maxAttempts: 2, timeoutMs: 1000n, delayMs: 500n }, 0n);
    assert.deepEqual(step(retry.poll()), { start: [1], outcome: undefined, timeout: 1000n });
    assert.deepEqual(step(retry.poll()).start, [], 'an attempt to start is named once');
    assert.deepEqual(step(retry.handleTimeout(999n)), { start: [], outcome: undefined, timeout: 1000n }, 'not before the deadline');
    assert.deepEqual(step(retry.handleTimeout(1000n)).start, [2], 'attempt 2 beside the hung attempt 1');
    assert.throws(() => retry.mayStart(1), (cause) => cause === 'attempt 1 timed out before it started', 'worded by the machine');
    assert.equal(retry.mayStart(2), undefined, 'attempt 2 may start');
    const failed = { tag: 'failed', val: 'upload failed after 2 attempts; last: attempt 2 timed out after 1000 ms' };
    assert.deepEqual(step(retry.handleTimeout(2000n)), { start: [], outcome: failed, timeout: undefined });
    // A result after the decision loses.
    assert.deepEqual(retry.attemptFinished(1, 'succeeded', '', 2500n).outcome, failed);

    const io = new Retry({ kind: 'fixed', maxAttempts: 3, timeoutMs: 0n, delayMs: 500n }, 0n);
    assert.deepEqual(step(io.poll()).start, [1]);
    assert.deepEqual(step(io.attemptFinished(1, 'retryable', 'could not write x: disk full', 10n)), { start: [], outcome: undefined, timeout: 510n }, 'the delay after a failure');
    assert.deepEqual(step(io.handleTimeout(510n)).start, [2]);
    assert.deepEqual(io.attemptFinished(2, 'fatal', 'the codec failed', 600n).outcome, { tag: 'failed', val: 'upload failed after 2 attempts; last: attempt 2: the codec failed' });
    // Flink's `none`: one attempt, no timer, whatever the other settings say.
    const none = new Retry({ kind: 'none', maxAttempts: 3, timeoutMs: 1000n, delayMs: 500n }, 0n);
    assert.deepEqual(step(none.poll()), { start: [1], outcome: undefined, timeout: undefined });
    assert.deepEqual(none.attemptFinished(1, 'retryable', 'disk full', 10n).outcome, { tag: 'failed', val: 'upload failed after 1 attempts; last: attempt 1: disk full' });

    // Restarted for another upload: its first step, nothing of the last one.
    assert.deepEqual(step(io.restart(700n)), { start: [1], outcome: undefined, timeout: undefined });
    assert.deepEqual(io.attemptFinished(1, 'succeeded', '', 710n).outcome, { tag: 'succeeded', val: 1 });
  } finally {
    await storage.close();
  }
});

test('a batcher holds tasks for the delay, sends them at the size threshold, and a large one at once unless it is background; closed, it refuses', async () => {
  const storage = await open();
  try {
    const batcher = new storage.ownership.policy.Batcher(10n, 1000n);
    /** A batch step with its numbers as a plain array (jco gives a `BigUint64Array`). */
    const step = ({ leaving, timeout }) => ({ leaving: leaving && [...leaving], timeout });
    assert.deepEqual(step(batcher.push(1n, 100n, 0n)), { leaving: undefined, timeout: 10n });
    assert.deepEqual(step(batcher.push(2n, 100n, 5n)), { leaving: undefined, timeout: 10n }, 'the first task sets the deadline');
    assert.deepEqual(step(batcher.handleTimeout(9n)), { leaving: undefined, timeout: 10n });
    assert.deepEqual(step(batcher.handleTimeout(10n)), { leaving: [1n, 2n], timeout: undefined });
    assert.equal(batcher.push(3n, 400n, 20n).leaving, undefined);
    assert.deepEqual(step(batcher.push(4n, 600n, 21n)), { leaving: [3n, 4n], timeout: undefined }, 'at the size threshold');
    assert.equal(batcher.push(5n, 100n, 30n).leaving, undefined);
    assert.deepEqual(step(batcher.push(6n, 500n, 31n)).leaving, [5n, 6n], 'half the threshold leaves at once, with what waited');
    assert.equal(batcher.push(7n, 1n, 40n).leaving, undefined);
    assert.deepEqual(step(batcher.pushBackground(8n, 600n, 41n)), { leaving: undefined, timeout: 50n }, 'a large background task waits for company');
    const { queued, cause } = batcher.close();
    assert.deepEqual([...queued], [7n, 8n]);
    assert.equal(cause, 'the changelog storage was closed before the upload started');
    assert.throws(() => batcher.push(9n, 1n, 50n), (e) => e === 'the changelog storage is closed', 'refused once closed');
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

test('pre-emptive uploads wait in their batch for company whatever their size; a persist\'s large task leaves at once', async () => {
  // Tasks of 600 bytes or more are over half the 1000-byte threshold: a persist's leaves
  // at once, pre-emptive ones wait (an hour) until the batch reaches the threshold.
  const storage = await open({ 'dstl.dfs.preemptive-persist-threshold': '600b', 'dstl.dfs.batch.persist-delay': '1h', 'dstl.dfs.batch.persist-size-threshold': '1000b' });
  try {
    const a = storage.createWriter('a', { start: 0, end: 127 });
    const b = storage.createWriter('b', { start: 0, end: 127 });
    a.append(1, new Uint8Array(600));
    assert.equal(storage.scheduler.queueSize(), 1, "a's pre-emptive upload waits");
    b.append(1, new Uint8Array(600));
    await storage.idle();
    assert.equal(storage.scheduler.queueSize(), 0, 'together at the threshold');
    assert.equal(storage.metrics().uploaded_files, 1, 'one file for both');
    const c = storage.createWriter('c', { start: 0, end: 127 });
    c.append(1, new Uint8Array(500));
    const persisted = c.persist(0, 1);
    assert.equal(storage.scheduler.queueSize(), 0, 'the persist\'s task left at once');
    await persisted;
    for (const w of [a, b, c]) w.close();
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
