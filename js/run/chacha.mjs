// The seeded generator of `dstl run`'s changes: rand_chacha 0.9's `ChaCha8Rng`, seeded
// with rand_core's `seed_from_u64`, and rand 0.9's `random_range` for `i32` ranges, so
// `node dstl-run.mjs` appends exactly the bytes `dstl run` appends for the same seed.

const MASK64 = (1n << 64n) - 1n;

/** rand_chacha's `ChaCha8Rng` (4 blocks per refill, 64-bit block counter, nonce 0). */
export class ChaCha8Rng {
  /** @param {Uint8Array} seed 32 bytes */
  constructor(seed) {
    const words = new DataView(seed.buffer, seed.byteOffset, 32);
    this.key = new Uint32Array(8);
    for (let i = 0; i < 8; i++) this.key[i] = words.getUint32(i * 4, true);
    this.counter = 0n;
    this.results = new Uint32Array(64);
    this.bytes = new Uint8Array(this.results.buffer);
    this.index = 64;
  }

  /**
   * rand_core's `SeedableRng::seed_from_u64`: PCG32 expands the u64 into the seed.
   * @param {bigint} state
   */
  static seedFromU64(state) {
    const seed = new Uint8Array(32);
    const view = new DataView(seed.buffer);
    let s = BigInt.asUintN(64, state);
    for (let i = 0; i < 8; i++) {
      s = (s * 6364136223846793005n + 11634580027462260723n) & MASK64;
      const xorshifted = Number(((s >> 18n) ^ s) >> 27n & 0xffffffffn) >>> 0;
      const rot = Number(s >> 59n);
      const x = ((xorshifted >>> rot) | (xorshifted << ((32 - rot) & 31))) >>> 0;
      view.setUint32(i * 4, x, true);
    }
    return new ChaCha8Rng(seed);
  }

  #refill() {
    const out = this.results;
    const k = this.key;
    for (let block = 0; block < 4; block++) {
      const counter = this.counter + BigInt(block);
      const c0 = Number(counter & 0xffffffffn) >>> 0;
      const c1 = Number((counter >> 32n) & 0xffffffffn) >>> 0;
      let x0 = 0x61707865, x1 = 0x3320646e, x2 = 0x79622d32, x3 = 0x6b206574;
      let x4 = k[0], x5 = k[1], x6 = k[2], x7 = k[3], x8 = k[4], x9 = k[5], x10 = k[6], x11 = k[7];
      let x12 = c0, x13 = c1, x14 = 0, x15 = 0;
      for (let r = 0; r < 4; r++) {
        // Columns.
        x0 = (x0 + x4) | 0; x12 ^= x0; x12 = (x12 << 16) | (x12 >>> 16);
        x8 = (x8 + x12) | 0; x4 ^= x8; x4 = (x4 << 12) | (x4 >>> 20);
        x0 = (x0 + x4) | 0; x12 ^= x0; x12 = (x12 << 8) | (x12 >>> 24);
        x8 = (x8 + x12) | 0; x4 ^= x8; x4 = (x4 << 7) | (x4 >>> 25);
        x1 = (x1 + x5) | 0; x13 ^= x1; x13 = (x13 << 16) | (x13 >>> 16);
        x9 = (x9 + x13) | 0; x5 ^= x9; x5 = (x5 << 12) | (x5 >>> 20);
        x1 = (x1 + x5) | 0; x13 ^= x1; x13 = (x13 << 8) | (x13 >>> 24);
        x9 = (x9 + x13) | 0; x5 ^= x9; x5 = (x5 << 7) | (x5 >>> 25);
        x2 = (x2 + x6) | 0; x14 ^= x2; x14 = (x14 << 16) | (x14 >>> 16);
        x10 = (x10 + x14) | 0; x6 ^= x10; x6 = (x6 << 12) | (x6 >>> 20);
        x2 = (x2 + x6) | 0; x14 ^= x2; x14 = (x14 << 8) | (x14 >>> 24);
        x10 = (x10 + x14) | 0; x6 ^= x10; x6 = (x6 << 7) | (x6 >>> 25);
        x3 = (x3 + x7) | 0; x15 ^= x3; x15 = (x15 << 16) | (x15 >>> 16);
        x11 = (x11 + x15) | 0; x7 ^= x11; x7 = (x7 << 12) | (x7 >>> 20);
        x3 = (x3 + x7) | 0; x15 ^= x3; x15 = (x15 << 8) | (x15 >>> 24);
        x11 = (x11 + x15) | 0; x7 ^= x11; x7 = (x7 << 7) | (x7 >>> 25);
        // Diagonals.
        x0 = (x0 + x5) | 0; x15 ^= x0; x15 = (x15 << 16) | (x15 >>> 16);
        x10 = (x10 + x15) | 0; x5 ^= x10; x5 = (x5 << 12) | (x5 >>> 20);
        x0 = (x0 + x5) | 0; x15 ^= x0; x15 = (x15 << 8) | (x15 >>> 24);
        x10 = (x10 + x15) | 0; x5 ^= x10; x5 = (x5 << 7) | (x5 >>> 25);
        x1 = (x1 + x6) | 0; x12 ^= x1; x12 = (x12 << 16) | (x12 >>> 16);
        x11 = (x11 + x12) | 0; x6 ^= x11; x6 = (x6 << 12) | (x6 >>> 20);
        x1 = (x1 + x6) | 0; x12 ^= x1; x12 = (x12 << 8) | (x12 >>> 24);
        x11 = (x11 + x12) | 0; x6 ^= x11; x6 = (x6 << 7) | (x6 >>> 25);
        x2 = (x2 + x7) | 0; x13 ^= x2; x13 = (x13 << 16) | (x13 >>> 16);
        x8 = (x8 + x13) | 0; x7 ^= x8; x7 = (x7 << 12) | (x7 >>> 20);
        x2 = (x2 + x7) | 0; x13 ^= x2; x13 = (x13 << 8) | (x13 >>> 24);
        x8 = (x8 + x13) | 0; x7 ^= x8; x7 = (x7 << 7) | (x7 >>> 25);
        x3 = (x3 + x4) | 0; x14 ^= x3; x14 = (x14 << 16) | (x14 >>> 16);
        x9 = (x9 + x14) | 0; x4 ^= x9; x4 = (x4 << 12) | (x4 >>> 20);
        x3 = (x3 + x4) | 0; x14 ^= x3; x14 = (x14 << 8) | (x14 >>> 24);
        x9 = (x9 + x14) | 0; x4 ^= x9; x4 = (x4 << 7) | (x4 >>> 25);
      }
      const o = block * 16;
      out[o] = x0 + 0x61707865; out[o + 1] = x1 + 0x3320646e; out[o + 2] = x2 + 0x79622d32; out[o + 3] = x3 + 0x6b206574;
      out[o + 4] = x4 + k[0]; out[o + 5] = x5 + k[1]; out[o + 6] = x6 + k[2]; out[o + 7] = x7 + k[3];
      out[o + 8] = x8 + k[4]; out[o + 9] = x9 + k[5]; out[o + 10] = x10 + k[6]; out[o + 11] = x11 + k[7];
      out[o + 12] = x12 + c0; out[o + 13] = x13 + c1; out[o + 14] = x14; out[o + 15] = x15;
    }
    this.counter += 4n;
    this.index = 0;
  }

  /** @returns {number} the next u32 */
  nextU32() {
    if (this.index >= 64) this.#refill();
    return this.results[this.index++];
  }

  /** Fills `dest` as rand_core's `BlockRng::fill_bytes` does (little-endian words). */
  fillBytes(dest) {
    let read = 0;
    while (read < dest.length) {
      if (this.index >= 64) this.#refill();
      const availableBytes = (64 - this.index) * 4;
      const n = Math.min(availableBytes, dest.length - read);
      dest.set(this.bytes.subarray(this.index * 4, this.index * 4 + n), read);
      this.index += Math.ceil(n / 4);
      read += n;
    }
  }

  /**
   * rand 0.9's `random_range(0..k)` for `i32` (Canon's method, the biased default).
   * @param {number} k above 0
   * @returns {number}
   */
  rangeI32(k) {
    // The 64-bit product x * k, exactly, in doubles: x = xh * 2^16 + xl.
    const wmul = (x) => {
      const a = (x >>> 16) * k;
      const aHi = Math.floor(a / 65536);
      const s = (a % 65536) * 65536 + (x & 0xffff) * k;
      return [aHi + Math.floor(s / 4294967296), s % 4294967296];
    };
    let [result, lo] = wmul(this.nextU32());
    if (lo > 4294967296 - k) {
      const [hi2] = wmul(this.nextU32());
      if (lo + hi2 > 0xffffffff) result += 1;
    }
    return result;
  }
}
