// Recovery: turns a handle back into its changes, in order (the Rust host's
// `recovery/reader.rs`). Each file is read once per handle however many change sets point
// into it (several files at once), and given whole to the component's reader
// (`reader.read-file`, dstl-proto's `read`), which checks its length, decodes the change
// sets the handle names and words every failure, naming the file and the offset, as the
// Rust host does.

import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';

import { sharedCodec } from './codec.mjs';
import { ReadError } from './errors.mjs';

/** Files one read fetches at once (as the Rust host's reader). */
const READ_AHEAD = 4;

/** Key group of a metadata change (the WIT's `change`). */
export const META_KEY_GROUP = -1;

/**
 * Reads every change of `handle`: change sets in handle order; within one, metadata
 * first, then key group by key group in append order. Each value is a view into one
 * buffer per file read.
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
  // The files in first-use order, each with the offsets its entries name, in order.
  const files = new Map();
  for (const entry of handle.entries) {
    const path = entry.handle.path;
    if (!files.has(path)) files.set(path, { logicalSize: BigInt(entry.handle.fileSize), offsets: [], sets: null, next: 0 });
    files.get(path).offsets.push(BigInt(entry.offset));
  }
  // Up to READ_AHEAD files are fetched at once, decoded in order as they arrive.
  const fetch = (path) =>
    Promise.resolve()
      .then(() => read(path))
      .then(
        (val) => ({ tag: 'ok', val }),
        (e) => ({ tag: 'err', val: String(e?.message ?? e) }),
      );
  const paths = [...files.keys()];
  const fetching = [];
  let next = 0;
  for (const path of paths) {
    while (next < paths.length && fetching.length < READ_AHEAD) fetching.push(fetch(paths[next++]));
    const fetched = await fetching.shift();
    const file = files.get(path);
    try {
      file.sets = codec.readFile(path, fetched, file.logicalSize, file.offsets);
    } catch (e) {
      throw new ReadError(e?.message ?? String(e));
    }
  }
  const changes = [];
  for (const entry of handle.entries) {
    const file = files.get(entry.handle.path);
    for (const change of file.sets[file.next++]) changes.push(change);
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
