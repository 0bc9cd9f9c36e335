// The seeded input of `dstl-run.mjs`, exactly as `dstl run` makes it
// (cli/src/workload/input.rs), at the cost of the Flink harness's: each value is copied
// from a seeded, pre-generated random pool at an offset derived from the change's index,
// with the index in its first 8 bytes, and key group `index % key_groups`. Regenerable from
// the seed for verification.
//
// - the pool: `span = max(size * 4, 1 MiB).next_power_of_two() * 2`, `span + size` bytes
//   filled by rand_chacha 0.9's `ChaCha8Rng::seed_from_u64(seed).fill_bytes`
// - change `index` (writer-local, from 0) of writer `w`: `pool[off .. off + size]` with
//   `off = (index * 8191 + w * 131) & (span - 1)` (wrapping u64 arithmetic), its first
//   `min(8, size)` bytes overwritten by `index` as a big-endian u64

import { ChaCha8Rng } from './chacha.mjs';

/** Appends per packed batch (as `dstl run`: cli/src/workload/mod.rs `BATCH`). */
export const BATCH = 512;

/**
 * The random bytes values are cut from (one per run, shared by every writer), followed in
 * the same memory by the room for one packed batch: a value is copied into a batch with
 * one `copyWithin`, without a view or a call into the runtime per value. The batch is
 * shared by every writer, which is safe because Node runs one at a time and a batch is
 * filled and appended with no await in between (`appendBatch` copies it).
 */
export class Pool {
  /**
   * A pool for values of `size` bytes: at least 2 MiB, and 8 values' worth.
   * @param {bigint|number} seed an unsigned 64-bit seed
   * @param {number} size bytes per value
   */
  constructor(seed, size) {
    let span = 1;
    while (span < Math.max(size * 4, 1 << 20)) span *= 2;
    span *= 2;
    const length = span + size;
    /** The pool, then the batch's values. */
    this.arena = new Uint8Array(length + BATCH * size);
    /** The pool: `span + size` bytes. */
    this.bytes = this.arena.subarray(0, length);
    ChaCha8Rng.seedFromU64(BigInt(seed)).fillBytes(this.bytes);
    /** A power of two: offsets are taken modulo it, so a value never runs past the end. */
    this.span = span;
    this.size = size;
    this.view = new DataView(this.arena.buffer);
    /** Where the batch's values start in the arena. */
    this.batchAt = length;
    /** The batch's packed columns, for up to {@link BATCH} changes. */
    this.batch = {
      keyGroups: new Int32Array(BATCH),
      lengths: new Uint32Array(BATCH).fill(size),
      data: this.arena.subarray(length),
    };
  }
}

/** Writes `index` as a big-endian u64, its first `n` bytes, into `out` at `at`. */
function tag(out, at, index, n) {
  const hi = Math.floor(index / 4294967296);
  const lo = index >>> 0;
  for (let b = 0; b < n; b++) out[at + b] = b < 4 ? hi >>> ((3 - b) * 8) : lo >>> ((7 - b) * 8);
}

/** The changes of one writer. */
export class Changes {
  /**
   * @param {Pool} pool
   * @param {number} writer the writer's index (`op-<writer>`)
   * @param {number} keyGroups key groups `0..keyGroups`
   */
  constructor(pool, writer, keyGroups) {
    this.pool = pool;
    this.size = pool.size;
    this.keyGroups = keyGroups;
    // The writer's term of the offset, reduced modulo the span (a power of two at most
    // 2^29, so the low bits of the wrapping u64 sum are the exact sum's).
    this.writerTerm = (writer * 131) % pool.span;
  }

  /** The key group of change `index`. */
  keyGroup(index) {
    return index % this.keyGroups;
  }

  /** The pool offset of change `index`'s value. */
  offset(index) {
    // (index mod span) * 8191 < 2^42: exact in a double.
    return ((index % this.pool.span) * 8191 + this.writerTerm) % this.pool.span;
  }

  /**
   * The value of change `index`, in a new array.
   * @param {number} index a safe integer
   * @returns {Uint8Array}
   */
  value(index) {
    const off = this.offset(index);
    const out = this.pool.bytes.slice(off, off + this.size);
    tag(out, 0, index, Math.min(8, this.size));
    return out;
  }

  /**
   * Changes `[from, from + n)` as packed columns, in the pool's batch: valid until the
   * next call on any writer's `Changes` of this pool (append it before awaiting).
   * @param {number} from
   * @param {number} n at most {@link BATCH}
   * @returns {{keyGroups: Int32Array, lengths: Uint32Array, data: Uint8Array}}
   */
  batch(from, n) {
    const { arena, view, span, batchAt, batch } = this.pool;
    const size = this.size;
    const groups = this.keyGroups;
    const keyGroups = batch.keyGroups;
    let off = this.offset(from);
    let kg = from % groups;
    let at = batchAt;
    for (let i = 0; i < n; i++) {
      keyGroups[i] = kg;
      arena.copyWithin(at, off, off + size);
      at += size;
      off += 8191;
      if (off >= span) off -= span;
      if (++kg === groups) kg = 0;
    }
    // The index tags, as big-endian u64s (their first min(8, size) bytes).
    at = batchAt;
    if (size >= 8) {
      for (let i = 0, index = from; i < n; i++, index++, at += size) {
        view.setUint32(at, Math.floor(index / 4294967296));
        view.setUint32(at + 4, index >>> 0);
      }
    } else {
      for (let i = 0; i < n; i++, at += size) tag(arena, at, from + i, size);
    }
    if (n === BATCH) return batch;
    return { keyGroups: keyGroups.subarray(0, n), lengths: batch.lengths.subarray(0, n), data: batch.data.subarray(0, n * size) };
  }
}
