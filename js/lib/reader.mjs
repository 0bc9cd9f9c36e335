// Recovery: turns a handle back into its changes, in order (the Rust host's reader.rs).
// Each file is read, and decompressed if needed, once per handle however many change
// sets point into it. Every error names the file and the offset.

import { readFile } from 'node:fs/promises';

import { decodeChangeSet, logicalBytes } from './codec.mjs';
import { ReadError } from './errors.mjs';

/**
 * Reads every change of `handle`: change sets in handle order; within one, metadata
 * first, then key group by key group in append order.
 * @param {{entries: {handle: {path: string, fileSize: bigint|number}, offset: bigint|number}[]}} handle
 * @param {(path: string) => Promise<Uint8Array>} [read]
 * @returns {Promise<{keyGroup: number, value: Uint8Array}[]>}
 * @throws {ReadError}
 */
export async function readHandle(handle, read = readFile) {
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
        logical = logicalBytes(file);
      } catch (e) {
        throw new ReadError(`corrupt changelog file ${path} at logical offset ${entry.offset}: ${e.message}`);
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
      for (const change of decodeChangeSet(logical, Number(entry.offset))) changes.push(change);
    } catch (e) {
      throw new ReadError(`corrupt changelog file ${path} at logical offset ${entry.offset}: ${e.message}`);
    }
  }
  return changes;
}
