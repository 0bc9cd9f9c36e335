// The ownership rules as the Node host runs them: dstl-proto's `ownership` through the
// component's `ownership` export (lib/ownership.mjs), deleting real files. The rules'
// own cases are dstl-proto's unit tests; these check the wiring and that a guest fault
// reads as the Rust host's.

import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';

import { LocalStore } from '../lib/index.mjs';
import { loadRules } from '../lib/component.mjs';
import { Discarder, Outstanding, Ownership } from '../lib/ownership.mjs';

const dir = mkdtempSync(join(tmpdir(), 'dstl-ownership-'));
after(() => rmSync(dir, { recursive: true, force: true }));

async function open() {
  const remote = await LocalStore.open(join(dir, 'remote'));
  const local = await LocalStore.open(join(dir, 'local'));
  const outstanding = new Outstanding();
  const logged = [];
  const discarder = new Discarder({ remote, local }, outstanding, (level, message) => logged.push(`${level} ${message}`));
  const ownership = new Ownership(await loadRules(), discarder, (level, message) => logged.push(`${level} ${message}`));
  const file = (store, name) => {
    const path = join(store.dir, name);
    writeFileSync(path, 'x');
    return path;
  };
  return { ownership, outstanding, logged, remote: (n) => file(remote, n), local: (n) => file(local, n) };
}

function result(sequenceNumber, remote, local = null) {
  return {
    sequenceNumber: BigInt(sequenceNumber),
    remote: { path: remote, fileSize: 100n },
    offset: BigInt(sequenceNumber) * 10n,
    local: local ? { handle: { path: local, fileSize: 100n }, offset: BigInt(sequenceNumber) * 10n } : undefined,
    size: 10n,
  };
}

test('a store file is deleted when its last change set is released, never after a confirm', async () => {
  const { ownership, outstanding, remote } = await open();
  const [a, b] = [remote('a'), remote('b')];
  ownership.uploaded({ remote: a, local: null, changeSets: 2, perTask: [[{}], [{}]] }, [0, 1]);
  ownership.uploaded({ remote: b, local: null, changeSets: 1, perTask: [[{}]] }, [0]);
  assert.equal(ownership.tracked(), 2);
  ownership.release(0, a, false);
  assert.equal(ownership.count(a), 1n);
  ownership.stopTracking(0, b, false);
  ownership.release(0, b, false);
  ownership.release(1, a, false);
  await outstanding.idle();
  assert.equal(existsSync(a), false, 'released by both writers');
  assert.equal(existsSync(b), true, 'a confirmed checkpoint owns it');
  assert.equal(ownership.tracked(), 0);
});

test('a local copy is deleted once no writer claims it', async () => {
  const { ownership, outstanding, remote, local } = await open();
  const [r, l] = [remote('r'), local('l')];
  ownership.uploaded({ remote: r, local: l, changeSets: 2, perTask: [[{}], [{}]] }, [0, 1]);
  ownership.stopTracking(0, l, true);
  ownership.register(0, l, 5n);
  ownership.release(1, l, true);
  await outstanding.idle();
  assert.equal(existsSync(l), true, 'writer 0 still claims it');
  assert.deepEqual(ownership.discardUpTo(0, 5n), [], 'registered under 5, not below');
  assert.deepEqual(ownership.discardUpTo(0, 6n), [l]);
  await outstanding.idle();
  assert.equal(existsSync(l), false);
});

test('holdings: a guest naming a file it does not hold is a fault worded as in the Rust host', async () => {
  const { ownership, outstanding, remote } = await open();
  const [a, b] = [remote('ha'), remote('hb')];
  ownership.uploaded({ remote: a, local: null, changeSets: 2, perTask: [[{}, {}]] }, [7]);
  ownership.uploaded({ remote: b, local: null, changeSets: 1, perTask: [[{}]] }, [7]);
  const holdings = ownership.newHoldings();
  holdings.add([result(0, a), result(1, a), result(2, b)]);
  // The guest releases one change set of a (as the writer's `release` import does).
  const local = holdings.release(a);
  assert.equal(local, false, 'a store file, not a local copy');
  ownership.release(7, a, local);
  assert.throws(() => holdings.check('/elsewhere', 'stop-tracking'), (e) => e === 'guest fault: stop-tracking of /elsewhere, a file this writer does not hold');
  const snapshot = (path, offset) => ({
    remote: {
      entries: [{ handle: { path, fileSize: 100n }, offset, size: 10n }],
      keyGroupRange: { start: 0, end: 1 },
      stateSize: 10n,
      incrementalSize: 10n,
      storageId: 'x',
    },
    local: undefined,
  });
  assert.throws(() => holdings.handOut(snapshot(a, 99n)), /never delivered to this writer/);
  holdings.handOut(snapshot(b, 20n));
  // The guest is gone: a's remaining reference is released (a is deleted), b stays, as a
  // returned snapshot names it.
  ownership.releaseUnreturned(7, holdings);
  await outstanding.idle();
  assert.equal(existsSync(a), false);
  assert.equal(existsSync(b), true);
  assert.equal(ownership.count(b), 1n);
});
