// `dstl-run.mjs`'s input (run/workload.mjs) against `dstl run`'s definition
// (cli/src/workload/input.rs): values printed by that formula written out in Rust with
// rand_chacha 0.9 itself, and the formula written out again in support/expected-input.mjs.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BATCH, Changes, Pool } from '../run/workload.mjs';
import { expectedChange, expectedPool } from '../support/expected-input.mjs';

const hex = (bytes) => Buffer.from(bytes).toString('hex');
const sha256 = async (bytes) => (await import('node:crypto')).createHash('sha256').update(bytes).digest('hex');

// seed, size, writer, index → value (hex), or its length and sha256 when long. From a
// Rust program with rand_chacha 0.9.0's ChaCha8Rng::seed_from_u64(seed).fill_bytes and the
// offset and tag of input.rs.
const PINNED = [
  [42n, 100, 0, 0, '000000000000000088917925c63f45f38c53b6c508b7716d52671658f9b29aa0b042b6bcd849e1499e825da45bb463261413875001bfdb4e8428122a0d9bcacd000ccea0628f70c598314bd383ec133d28065689f706c281a35be8609b92dce62d40c795'],
  [42n, 100, 0, 1, '0000000000000001bb2c73f75a769c41851a0a83ec5d79d8a7ea58a0c913d025af7b0e45ddebc845b57ec631e2f3fdde2f6c320eea130a8c603474a76baf42ce34c7c09b3c84675121aa0eab329f1a56937779d43c2337211d69fc9df210536a767b8cae'],
  [42n, 100, 1, 300, '000000000000012cabe92fc42c20092713594d9cc21e98bfef216f209c20c45922c5fbc0c5575a1086acadc28ec27cb6a1ed85f71d7b7461ed9e08e0c3f84361b3875481dcf3adb1f15dcab74f2ba5c864bdf07109f490bc67a31df88432a37b3f27554f'],
  [42n, 100, 7, 1_999_999, '00000000001e847f36d5a19442914f9b9bf9409d3bd42dca04dd65b11c8993ca5590a871ea84104fe97a44cfa43e44c4920a0da093b7b58b966e399c80070368598daef3bdf3e600f9607ec08d9bc7e5732cc7927b026957245eec30f91b4322f2ae65fe'],
  [9n, 37, 1, 4321, '00000000000010e1ca4c4f0fa4b5175144ad68c82ef3a4b258aa13d57f51dcea538b4ec78a'],
  [9n, 37, 3, 2 ** 32 + 7, '00000001000000072a690c476767ea1fd0e793531546443385c64903376eaba043ec509906'],
  [1n, 3, 0, 7, '000000'],
  [1n, 3, 2, 0x010203040506, '000001'],
  [1n, 12, 2, 0x010203040506, '0000010203040506dcecc248'],
  [7n, 5000, 9999, Number.MAX_SAFE_INTEGER, { length: 5000, sha256: '8f0c62975b1bfcd2b872b21fd2bfc68f315436d76be03b90a71988c9e27de634' }],
  [18446744073709551615n, 8, 5, 256, '0000000000000100'],
];

test('values equal those rand_chacha and the Rust formula give', async () => {
  const pools = new Map();
  for (const [seed, size, writer, index, want] of PINNED) {
    const key = `${seed}/${size}`;
    if (!pools.has(key)) pools.set(key, new Pool(seed, size));
    const changes = new Changes(pools.get(key), writer, 128);
    const value = changes.value(index);
    const what = `seed ${seed} size ${size} writer ${writer} index ${index}`;
    if (typeof want === 'string') assert.equal(hex(value), want, what);
    else assert.deepEqual({ length: value.length, sha256: await sha256(value) }, want, what);
    // The packed path gives the same bytes.
    const batch = changes.batch(index, 1);
    assert.equal(hex(batch.data), hex(value), `${what}, packed`);
    assert.equal(batch.keyGroups[0], index % 128);
    assert.equal(batch.lengths[0], size);
  }
});

test('the pool is as large as input.rs makes it', () => {
  for (const [size, span] of [[0, 2 << 20], [100, 2 << 20], [262_144, 2 << 20], [262_145, 4 << 20], [5000, 2 << 20], [1 << 20, 8 << 20]]) {
    const pool = new Pool(1n, size);
    assert.equal(pool.span, span, `size ${size}`);
    assert.equal(pool.bytes.length, span + size, `size ${size}`);
  }
});

test('packed batches equal the formula, change by change, across the pool wrap and key groups', () => {
  for (const [seed, size, keyGroups, writers] of [[42n, 100, 128, 3], [9n, 37, 16, 2], [3n, 5, 7, 2], [5n, 0, 1, 1]]) {
    const pool = new Pool(seed, size);
    const expected = expectedPool(seed, size);
    assert.ok(Buffer.from(pool.bytes).equals(Buffer.from(expected.bytes)), `pool of seed ${seed}, size ${size}`);
    for (let writer = 0; writer < writers; writer++) {
      const changes = new Changes(pool, writer, keyGroups);
      // 8191 * 300 passes 2 MiB: offsets wrap inside the first batches; the last range
      // starts at a large index (past 2^32) that is not a multiple of the batch size.
      for (const start of [0, 1000, 2 ** 32 - 100]) {
        for (const [from, n] of [[start, BATCH], [start + BATCH, BATCH - 7], [start + 2 * BATCH - 7, 1], [start + 2 * BATCH - 6, BATCH]]) {
          const batch = changes.batch(from, n);
          assert.equal(batch.keyGroups.length, n);
          assert.equal(batch.data.length, n * size);
          for (let i = 0; i < n; i++) {
            const [keyGroup, value] = expectedChange(expected, keyGroups, writer, from + i);
            const what = `seed ${seed} size ${size} writer ${writer} change ${from + i}`;
            assert.equal(batch.keyGroups[i], keyGroup, what);
            assert.equal(batch.lengths[i], size, what);
            assert.equal(hex(batch.data.subarray(i * size, (i + 1) * size)), hex(value), what);
          }
        }
      }
    }
  }
});
