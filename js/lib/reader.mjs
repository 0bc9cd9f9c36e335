// Recovery: turns a handle back into its changes, in order (the Rust host's
// `recovery/reader.rs`). Each file is read, and turned into its logical bytes, once per
// handle however many change sets point into it; the component's codec (`codec.mjs`)
// does the format. Every error names the file and the offset.

import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';

import { sharedCodec } from './codec.mjs';
import { ReadError } from './errors.mjs';

/** Key group of a metadata change (the WIT's `change`). */
export const META_KEY_GROUP = -1;

/**
 * Reads every change of `handle`: change sets in handle order; within one, metadata
 * first, then key group by key group in append order.
 * @param {{entries: {handle: {path: string, fileSize: bigint|number}, offset: bigint|number}[]}} handle
 * @param {(path: string) => Promise<Uint8Array>} [read]
 * @param {import('./codec.mjs').ComponentCodec} [codec] default: one shared codec over the packaged component (or `$DSTL_GUEST_WASM`'s)
 * @returns {Promise<{keyGroup: number, value: Uint8Array}[]>}
 * @throws {ReadError}
 */
export async function readHandle(handle, read = readFile, codec = undefined) {
  if (!codec) {
    try {
      codec = await sharedCodec();
    } catch (e) {
      throw new ReadError(`cannot load the component's codec: ${e?.message ?? e}`);
    }
  }
  const corrupt = (path, entry, e) =>
    new ReadError(`corrupt changelog file ${path} at logical offset ${entry.offset}: ${e?.message ?? e}`);
  const cache = new Map();
  const changes = [];
  for (const entry of handle.entries) {
    const path = entry.handle.path;
    let logical = cache.get(path);
    if (!logical) {
      let file;
      try {
        file = await read(path);
      } catch (e) {
        throw new ReadError(`cannot read changelog file ${path}: ${e.message}`);
      }
      try {
        logical = codec.logicalBytes(file);
      } catch (e) {
        throw corrupt(path, entry, e);
      }
      const expected = Number(entry.handle.fileSize);
      if (logical.length !== expected) {
        throw new ReadError(
          `changelog file ${path} has ${logical.length} logical bytes but the handle records ${expected}: the file was truncated or replaced`,
        );
      }
      cache.set(path, logical);
    }
    try {
      for (const change of codec.decodeChangeSet(logical, BigInt(entry.offset))) changes.push(change);
    } catch (e) {
      throw corrupt(path, entry, e);
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
