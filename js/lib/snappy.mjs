// Snappy (raw format) and the Snappy framing format with masked CRC-32C checksums, as
// Flink's compressed changelog files use them (spec §6; the Rust host uses the `snap`
// crate). Pure JS: no native module to build.

const MAX_BLOCK = 65536;

// ---- CRC-32C (Castagnoli), slicing by 4 ----
const CRC_TABLES = (() => {
  const tables = [];
  for (let t = 0; t < 4; t++) tables.push(new Int32Array(256));
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    tables[0][n] = c;
  }
  for (let n = 0; n < 256; n++) {
    for (let t = 1; t < 4; t++) {
      const prev = tables[t - 1][n];
      tables[t][n] = (prev >>> 8) ^ tables[0][prev & 0xff];
    }
  }
  return tables;
})();

/**
 * CRC-32C of `bytes[start, end)`.
 * @returns {number} unsigned 32-bit
 */
export function crc32c(bytes, start = 0, end = bytes.length) {
  const [t0, t1, t2, t3] = CRC_TABLES;
  let crc = -1;
  let i = start;
  for (; i + 4 <= end; i += 4) {
    crc ^= bytes[i] | (bytes[i + 1] << 8) | (bytes[i + 2] << 16) | (bytes[i + 3] << 24);
    crc = t3[crc & 0xff] ^ t2[(crc >>> 8) & 0xff] ^ t1[(crc >>> 16) & 0xff] ^ t0[crc >>> 24];
  }
  for (; i < end; i++) crc = (crc >>> 8) ^ t0[(crc ^ bytes[i]) & 0xff];
  return ~crc >>> 0;
}

/** The checksum the framing format stores: CRC-32C, rotated and offset. */
export function maskedCrc(bytes, start, end) {
  const crc = crc32c(bytes, start, end);
  return (((crc >>> 15) | (crc << 17)) + 0xa282ead8) >>> 0;
}

// ---- raw Snappy ----
const HASH_BITS = 14;
const table = new Int32Array(1 << HASH_BITS);

function load32(b, i) {
  return b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24);
}

function hash(v) {
  return Math.imul(v, 0x1e35a7bd) >>> (32 - HASH_BITS);
}

class Out {
  constructor(capacity) {
    this.buf = new Uint8Array(capacity);
    this.pos = 0;
  }
  byte(b) {
    this.buf[this.pos++] = b;
  }
  literal(src, start, end) {
    const len = end - start;
    if (len === 0) return;
    const n = len - 1;
    if (n < 60) {
      this.byte(n << 2);
    } else if (n < 0x100) {
      this.byte(60 << 2);
      this.byte(n);
    } else if (n < 0x10000) {
      this.byte(61 << 2);
      this.byte(n & 0xff);
      this.byte(n >>> 8);
    } else {
      this.byte(62 << 2);
      this.byte(n & 0xff);
      this.byte((n >>> 8) & 0xff);
      this.byte(n >>> 16);
    }
    this.buf.set(src.subarray(start, end), this.pos);
    this.pos += len;
  }
  copy(offset, len) {
    while (len >= 68) {
      this.copy2(offset, 64);
      len -= 64;
    }
    if (len > 64) {
      this.copy2(offset, 60);
      len -= 60;
    }
    if (len >= 12 || offset >= 2048) {
      this.copy2(offset, len);
    } else {
      this.byte(1 | ((len - 4) << 2) | ((offset >>> 8) << 5));
      this.byte(offset & 0xff);
    }
  }
  copy2(offset, len) {
    this.byte(2 | ((len - 1) << 2));
    this.byte(offset & 0xff);
    this.byte(offset >>> 8);
  }
}

/**
 * Compresses `src[start, end)` (at most 64 KiB) into a raw Snappy block.
 * @returns {Uint8Array}
 */
export function compressBlock(src, start = 0, end = src.length) {
  const len = end - start;
  if (len > MAX_BLOCK) throw new RangeError(`snappy block of ${len} bytes exceeds ${MAX_BLOCK}`);
  const out = new Out(32 + len + Math.ceil(len / 6));
  // Preamble: the uncompressed length as a varint.
  let n = len;
  while (n >= 0x80) {
    out.byte((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.byte(n);
  let nextEmit = start;
  if (len >= 15) {
    table.fill(-1);
    const ipLimit = end - 4;
    let ip = start + 1;
    outer: for (;;) {
      let skip = 32;
      let candidate;
      for (;;) {
        if (ip > ipLimit) break outer;
        const v = load32(src, ip);
        const h = hash(v);
        candidate = table[h];
        table[h] = ip;
        if (candidate >= 0 && load32(src, candidate) === v) break;
        // Snappy's heuristic: the longer nothing matches, the faster it skips ahead.
        const step = skip >>> 5;
        skip += step;
        ip += step;
      }
      out.literal(src, nextEmit, ip);
      let matched = 4;
      while (ip + matched < end && src[candidate + matched] === src[ip + matched]) matched++;
      out.copy(ip - candidate, matched);
      ip += matched;
      nextEmit = ip;
      if (ip <= ipLimit) table[hash(load32(src, ip - 1))] = ip - 1;
    }
  }
  out.literal(src, nextEmit, end);
  return out.buf.subarray(0, out.pos);
}

/**
 * Decompresses a raw Snappy block.
 * @param {Uint8Array} src
 * @returns {Uint8Array}
 * @throws {Error} describing the corruption
 */
export function decompressBlock(src) {
  let pos = 0;
  let len = 0;
  for (let shift = 0; ; shift += 7) {
    if (pos >= src.length || shift > 28) throw new Error('invalid snappy length preamble');
    const b = src[pos++];
    len += (b & 0x7f) * 2 ** shift;
    if ((b & 0x80) === 0) break;
  }
  if (len > MAX_BLOCK * 16) throw new Error(`snappy block declares ${len} bytes`);
  const out = new Uint8Array(len);
  let op = 0;
  while (pos < src.length) {
    const tag = src[pos++];
    const kind = tag & 3;
    if (kind === 0) {
      let n = tag >>> 2;
      if (n >= 60) {
        const bytes = n - 59;
        if (pos + bytes > src.length) throw new Error('truncated snappy literal length');
        n = 0;
        for (let i = 0; i < bytes; i++) n += src[pos + i] * 2 ** (8 * i);
        pos += bytes;
      }
      n += 1;
      if (pos + n > src.length || op + n > len) throw new Error('snappy literal overruns its block');
      out.set(src.subarray(pos, pos + n), op);
      pos += n;
      op += n;
      continue;
    }
    let n;
    let offset;
    if (kind === 1) {
      if (pos >= src.length) throw new Error('truncated snappy copy');
      n = ((tag >>> 2) & 7) + 4;
      offset = ((tag >>> 5) << 8) | src[pos++];
    } else if (kind === 2) {
      if (pos + 2 > src.length) throw new Error('truncated snappy copy');
      n = (tag >>> 2) + 1;
      offset = src[pos] | (src[pos + 1] << 8);
      pos += 2;
    } else {
      if (pos + 4 > src.length) throw new Error('truncated snappy copy');
      n = (tag >>> 2) + 1;
      offset = (src[pos] | (src[pos + 1] << 8) | (src[pos + 2] << 16) | (src[pos + 3] << 24)) >>> 0;
      pos += 4;
    }
    if (offset === 0 || offset > op || op + n > len) throw new Error(`invalid snappy copy (offset ${offset}, length ${n}) at output position ${op}`);
    if (offset >= n) {
      out.copyWithin(op, op - offset, op - offset + n);
      op += n;
    } else {
      for (let i = 0; i < n; i++, op++) out[op] = out[op - offset];
    }
  }
  if (op !== len) throw new Error(`snappy block decoded to ${op} bytes but declares ${len}`);
  return out;
}

// ---- framing ----

/** The chunk that opens every framed stream. */
export const STREAM_IDENTIFIER = Uint8Array.of(0xff, 6, 0, 0, 0x73, 0x4e, 0x61, 0x50, 0x70, 0x59);

/**
 * Frames `data` as one Snappy framed stream: the stream identifier, then one chunk per
 * 64 KiB, compressed unless that saves less than 1/8 (as the `snap` crate does).
 * @param {Uint8Array} data
 * @returns {Uint8Array[]} the stream as parts
 */
export function frameCompress(data) {
  const parts = [STREAM_IDENTIFIER];
  for (let start = 0; start < data.length; start += MAX_BLOCK) {
    const end = Math.min(start + MAX_BLOCK, data.length);
    const crc = maskedCrc(data, start, end);
    const compressed = compressBlock(data, start, end);
    const raw = end - start;
    const useCompressed = compressed.length < raw - (raw >>> 3);
    const body = useCompressed ? compressed : data.subarray(start, end);
    const header = new Uint8Array(8);
    const chunkLen = body.length + 4;
    header[0] = useCompressed ? 0x00 : 0x01;
    header[1] = chunkLen & 0xff;
    header[2] = (chunkLen >>> 8) & 0xff;
    header[3] = chunkLen >>> 16;
    header[4] = crc & 0xff;
    header[5] = (crc >>> 8) & 0xff;
    header[6] = (crc >>> 16) & 0xff;
    header[7] = crc >>> 24;
    parts.push(header, Uint8Array.from(body));
  }
  return parts;
}

/**
 * Reads a Snappy framed stream back, checking every checksum.
 * @param {Uint8Array} stream
 * @returns {Uint8Array}
 * @throws {Error} describing the corruption
 */
export function frameDecompress(stream) {
  const out = [];
  let total = 0;
  let pos = 0;
  let seenIdentifier = false;
  while (pos < stream.length) {
    if (pos + 4 > stream.length) throw new Error(`truncated chunk header at ${pos}`);
    const type = stream[pos];
    const len = stream[pos + 1] | (stream[pos + 2] << 8) | (stream[pos + 3] << 16);
    const start = pos + 4;
    const end = start + len;
    if (end > stream.length) throw new Error(`chunk at ${pos} declares ${len} bytes, ${stream.length - start} left`);
    if (type === 0xff) {
      if (len !== 6 || !STREAM_IDENTIFIER.every((b, i) => stream[pos + i] === b)) {
        throw new Error(`invalid stream identifier at ${pos}`);
      }
      seenIdentifier = true;
    } else if (type === 0x00 || type === 0x01) {
      if (!seenIdentifier) throw new Error('stream does not start with the stream identifier');
      if (len < 4) throw new Error(`chunk at ${pos} too short for its checksum`);
      const expected = (stream[start] | (stream[start + 1] << 8) | (stream[start + 2] << 16) | (stream[start + 3] << 24)) >>> 0;
      const data = type === 0x00 ? decompressBlock(stream.subarray(start + 4, end)) : stream.subarray(start + 4, end);
      if (data.length > MAX_BLOCK) throw new Error(`chunk at ${pos} holds ${data.length} bytes, above 65536`);
      const actual = maskedCrc(data, 0, data.length);
      if (actual !== expected) throw new Error(`checksum mismatch in chunk at ${pos}`);
      out.push(data);
      total += data.length;
    } else if (type >= 0x02 && type <= 0x7f) {
      throw new Error(`unskippable reserved chunk type ${type} at ${pos}`);
    }
    pos = end;
  }
  if (!seenIdentifier) throw new Error('stream does not start with the stream identifier');
  const result = new Uint8Array(total);
  let offset = 0;
  for (const part of out) {
    result.set(part, offset);
    offset += part.length;
  }
  return result;
}
