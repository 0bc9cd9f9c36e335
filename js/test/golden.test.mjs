// Files Apache Flink 2.3.0 wrote (Snappy-framed by xerial) read back exactly as Flink's
// own reader reads them, through the Node host's reader and through the component's.

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { digest, loadComponent, readHandle } from '../lib/index.mjs';
import { IMPORT_KEYS } from '../lib/component.mjs';
import { Capture, wasiImports } from '../lib/wasi.mjs';

const FIXTURES = join(dirname(fileURLToPath(import.meta.url)), 'fixtures', 'flink-golden');

for (const set of readdirSync(FIXTURES).filter((n) => !n.includes('.'))) {
  test(`Flink-written golden set ${set}`, async () => {
    const manifestPath = join(FIXTURES, set, 'manifest.json');
    const manifest = JSON.parse(readFileSync(manifestPath, 'utf8'));
    const component = await loadComponent();
    const noop = () => {};
    const { reader } = component.instantiate(
      {
        ...wasiImports(new Capture()),
        [IMPORT_KEYS.uploader]: { schedule: noop },
        [IMPORT_KEYS.registry]: { release: noop, stopTracking: noop },
        [IMPORT_KEYS.localRegistry]: { register: noop, discardUpTo: () => [] },
        [IMPORT_KEYS.logging]: { log: noop },
      },
      256 << 20,
    );
    assert.ok(manifest.snapshots.length > 0);
    for (const snapshot of manifest.snapshots) {
      const entries = snapshot.handles.map((h) => ({
        handle: { path: resolve(dirname(manifestPath), h.path), fileSize: BigInt(h.fileSize) },
        offset: BigInt(h.offset),
      }));
      const changes = await readHandle({ entries });
      assert.equal(changes.length, snapshot.expectedCount, snapshot.name);
      assert.equal(digest(changes), snapshot.expectedTotalSha256, snapshot.name);
      const viaComponent = [];
      for (const entry of entries) {
        const logical = reader.logicalBytes(readFileSync(entry.handle.path));
        for (const c of reader.decodeChangeSet(logical, entry.offset)) viaComponent.push(c);
      }
      assert.equal(digest(viaComponent), snapshot.expectedTotalSha256, `${snapshot.name} through the component`);
    }
  });
}
