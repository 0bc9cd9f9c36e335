#!/usr/bin/env node
// Turns dstl manifests (as `node js/dstl-run.mjs --manifests DIR` or `dstl run` write
// them) into a handle list for Flink's own reader (the harness's `run.sh read LIST`):
//   node js/manifest-to-flink.mjs M/op-0.json [M/op-1.json ...] > list.json
// One snapshot per manifest, its (path, offset, fileSize) handles in order.

import { readFileSync } from 'node:fs';
import { basename } from 'node:path';

const files = process.argv.slice(2);
if (files.length === 0) {
  process.stderr.write('usage: node js/manifest-to-flink.mjs MANIFEST.json... > list.json\n');
  process.exit(2);
}
try {
  const snapshots = files.map((file) => {
    const m = JSON.parse(readFileSync(file, 'utf8'));
    return {
      name: m.writer ?? basename(file, '.json'),
      keyGroupRange: [m.key_group_range.start, m.key_group_range.end],
      handles: m.entries.map((e) => ({ path: e.path, offset: e.offset, fileSize: e.file_size })),
    };
  });
  process.stdout.write(`${JSON.stringify({ snapshots }, null, 2)}\n`);
} catch (e) {
  process.stderr.write(`error: ${e.message}\n`);
  process.exit(1);
}
