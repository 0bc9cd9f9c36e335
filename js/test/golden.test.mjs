// Files Apache Flink 2.3.0 wrote (Snappy-framed by xerial) read back exactly as Flink's
// own reader reads them, through the Node host's reader (the component's codec).

import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { ComponentCodec, digest, readHandle } from '../lib/index.mjs';

const FIXTURES = join(dirname(fileURLToPath(import.meta.url)), 'fixtures', 'flink-golden');

for (const set of readdirSync(FIXTURES).filter((n) => !n.includes('.'))) {
  test(`Flink-written golden set ${set}`, async () => {
    const manifestPath = join(FIXTURES, set, 'manifest.json');
    const manifest = JSON.parse(readFileSync(manifestPath, 'utf8'));
    const codec = await ComponentCodec.open();
    assert.ok(manifest.snapshots.length > 0);
    for (const snapshot of manifest.snapshots) {
      const entries = snapshot.handles.map((h) => ({
        handle: { path: resolve(dirname(manifestPath), h.path), fileSize: BigInt(h.fileSize) },
        offset: BigInt(h.offset),
      }));
      // With the shared codec, and with one of its own.
      for (const changes of [await readHandle({ entries }), await readHandle({ entries }, undefined, codec)]) {
        assert.equal(changes.length, snapshot.expectedCount, snapshot.name);
        assert.equal(digest(changes), snapshot.expectedTotalSha256, snapshot.name);
      }
    }
  });
}
