// The changelog file format on the host side (spec §6; `guest/src/codec.rs` is the
// reference): a flag byte, then the logical stream of change-set blocks, plain or as one
// Snappy framed stream. Blocks are encoded by the writer component; the host only lays
// them into files and, for recovery, decodes them back (checked against the component's
// own `reader` export in the tests).

import { createHash } from 'node:crypto';

import { frameCompress, frameDecompress } from './snappy.mjs';

/** Key group of a metadata change. */
export const META_KEY_GROUP = -1;
/** Flag byte of an uncompressed file. */
export const FLAG_PLAIN = 0;
/** Flag byte of a Snappy-framed file. */
export const FLAG_SNAPPY = 1;

/** A decoding failure; `message` matches the Rust codec's `FormatError`. */
export class FormatError extends Error {
  constructor(message) {
    super(message);
    this.name = 'FormatError';
  }
}

/**
 * A file holding `blocks` in order, as parts to write one after the other.
 * @param {Uint8Array[]} blocks encoded change-set blocks
 * @param {boolean} compression
 * @returns {{parts: Uint8Array[], offsets: number[], logical: number}} the parts, each
 *   block's logical offset and the logical length
 */
export function encodeFile(blocks, compression) {
  const { offsets, logical } = layout(blocks);
  if (!compression) {
    return { parts: [Uint8Array.of(FLAG_PLAIN), ...blocks], offsets, logical };
  }
  return { parts: [Uint8Array.of(FLAG_SNAPPY), ...frameCompress(join(blocks, logical))], offsets, logical };
}

/**
 * Like {@link encodeFile}, with the Snappy framing done by `compress` (a worker pool).
 * @param {Uint8Array[]} blocks
 * @param {boolean} compression
 * @param {(data: Uint8Array) => Promise<Uint8Array>} compress
 */
export async function encodeFileAsync(blocks, compression, compress) {
  if (!compression) return encodeFile(blocks, false);
  const { offsets, logical } = layout(blocks);
  return { parts: [Uint8Array.of(FLAG_SNAPPY), await compress(join(blocks, logical))], offsets, logical };
}

function layout(blocks) {
  const offsets = [];
  let logical = 0;
  for (const block of blocks) {
    offsets.push(logical);
    logical += block.length;
  }
  return { offsets, logical };
}

/** The blocks as one buffer of its own (safe to move to a worker). */
function join(blocks, logical) {
  const out = new Uint8Array(logical);
  let offset = 0;
  for (const block of blocks) {
    out.set(block, offset);
    offset += block.length;
  }
  return out;
}

/**
 * The logical bytes of a whole file (flag byte and body).
 * @param {Uint8Array} file
 * @returns {Uint8Array}
 * @throws {FormatError}
 */
export function logicalBytes(file) {
  if (file.length === 0) throw new FormatError('empty file: no compression flag byte');
  if (file[0] === FLAG_PLAIN) return file.subarray(1);
  if (file[0] === FLAG_SNAPPY) {
    try {
      return frameDecompress(file.subarray(1));
    } catch (e) {
      throw new FormatError(`corrupt snappy framed stream: ${e.message}`);
    }
  }
  throw new FormatError(`unknown compression flag 0x${file[0].toString(16).padStart(2, '0')} (expected 0x00 or 0x01)`);
}

/**
 * Decodes the change-set block at `offset` of `logical`: metadata first, then key group
 * by key group in append order. Never trusts a count or length.
 * @param {Uint8Array} logical
 * @param {number} offset
 * @returns {{keyGroup: number, value: Uint8Array}[]}
 * @throws {FormatError}
 */
export function decodeChangeSet(logical, offset) {
  const len = logical.length;
  if (offset > len) throw new FormatError(`offset ${offset} is beyond the logical length ${len}`);
  const view = new DataView(logical.buffer, logical.byteOffset, logical.byteLength);
  let pos = offset;
  const readI32 = () => {
    if (pos + 4 > len) {
      throw new FormatError(`truncated change set at logical position ${pos}: need 4 more bytes, ${len - pos} left`);
    }
    const v = view.getInt32(pos);
    pos += 4;
    return v;
  };
  const readCount = (what, minUnit) => {
    const position = pos;
    const value = readI32();
    if (value < 0 || value * minUnit > len - pos) {
      throw new FormatError(`invalid ${what} ${value} at logical position ${position}`);
    }
    return value;
  };
  const changes = [];
  const groups = readCount('group count', 8);
  for (let g = 0; g < groups; g++) {
    const count = readCount('change count', 4);
    const keyGroup = readI32();
    if (keyGroup < META_KEY_GROUP) {
      throw new FormatError(`invalid key group ${keyGroup} at logical position ${pos - 4}`);
    }
    for (let c = 0; c < count; c++) {
      const position = pos;
      const n = readI32();
      if (n < 0) throw new FormatError(`invalid value length ${n} at logical position ${position}`);
      if (n > len - pos) {
        throw new FormatError(`truncated change set at logical position ${pos}: need ${n} more bytes, ${len - pos} left`);
      }
      changes.push({ keyGroup, value: logical.subarray(pos, pos + n) });
      pos += n;
    }
  }
  return changes;
}

/**
 * SHA-256 over every change in order: key group and value length as 4-byte big-endian,
 * then the value (what `dstl read --digest` prints).
 * @param {Iterable<{keyGroup: number, value: Uint8Array}>} changes
 * @returns {string} lowercase hex
 */
export function digest(changes) {
  const hash = createHash('sha256');
  const head = Buffer.alloc(8);
  for (const change of changes) {
    head.writeInt32BE(change.keyGroup, 0);
    head.writeUInt32BE(change.value.length, 4);
    hash.update(head);
    hash.update(change.value);
  }
  return hash.digest('hex');
}
