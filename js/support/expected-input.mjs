// `dstl run`'s input written out again from its definition (cli/src/workload/input.rs),
// independently of run/workload.mjs, for the tests: the pool from the ChaCha8 word stream
// (not `fillBytes`), the offset in wrapping u64 arithmetic with BigInt, the index tag with
// `setBigUint64`. And the digest `dstl read --digest` prints for a checkpoint holding
// changes [first, end), from the format's read order.

import { createHash } from 'node:crypto';

import { ChaCha8Rng } from '../run/chacha.mjs';

/** The pool of `seed` and `size`: `{bytes, mask}`. */
export function expectedPool(seed, size) {
  const floor = BigInt(Math.max(size * 4, 1 << 20));
  let span = 1n;
  while (span < floor) span <<= 1n;
  span *= 2n;
  const length = Number(span) + size;
  const rng = ChaCha8Rng.seedFromU64(BigInt(seed));
  const words = new DataView(new ArrayBuffer(Math.ceil(length / 4) * 4));
  for (let i = 0; i < words.byteLength; i += 4) words.setUint32(i, rng.nextU32(), true);
  return { bytes: new Uint8Array(words.buffer, 0, length), mask: span - 1n, size };
}

/** Change `index` of writer `writer`: `[keyGroup, value]`. */
export function expectedChange(pool, keyGroups, writer, index) {
  const i = BigInt(index);
  const offset = Number(BigInt.asUintN(64, i * 8191n + BigInt(writer) * 131n) & pool.mask);
  const value = pool.bytes.slice(offset, offset + pool.size);
  const tag = new Uint8Array(8);
  new DataView(tag.buffer).setBigUint64(0, i, false);
  value.set(tag.subarray(0, Math.min(8, pool.size)), 0);
  return [Number(i % BigInt(keyGroups)), value];
}

/**
 * What `dstl read --digest` prints for writer `writer`'s checkpoint holding changes
 * `[first, end)` (with no pre-emptive persist inside): change sets end at multiples of
 * `checkpointEvery`; each is read back by key group, in append order within one.
 */
export function expectedDigest(pool, { keyGroups, checkpointEvery }, writer, first, end) {
  const hash = createHash('sha256');
  const head = Buffer.alloc(8);
  let count = 0;
  for (let start = first; start < end; ) {
    const stop = Math.min(end, (Math.floor(start / checkpointEvery) + 1) * checkpointEvery);
    const groups = new Map();
    for (let i = start; i < stop; i++) {
      const [keyGroup, value] = expectedChange(pool, keyGroups, writer, i);
      if (!groups.has(keyGroup)) groups.set(keyGroup, []);
      groups.get(keyGroup).push(value);
    }
    for (const keyGroup of [...groups.keys()].sort((a, b) => a - b)) {
      for (const value of groups.get(keyGroup)) {
        head.writeInt32BE(keyGroup, 0);
        head.writeUInt32BE(value.length, 4);
        hash.update(head);
        hash.update(value);
        count++;
      }
    }
    start = stop;
  }
  return `changes=${count} sha256=${hash.digest('hex')}`;
}
