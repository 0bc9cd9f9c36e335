// Manifest files: the JSON is dstl-proto's `manifest` (through the rules component, WIT
// interface `records`), as the Rust host writes and reads it; this module reads the file
// and writes it atomically.

import { readFile, rename } from 'node:fs/promises';
import { dirname } from 'node:path';

import { s64, u64 } from './args.mjs';
import { errorMessage, sharedRules } from './component.mjs';
import { InvalidArgumentError, ReadError } from './errors.mjs';
import { syncDir, writeSynced } from './store.mjs';

const { records } = await sharedRules();

/**
 * The text of the manifest file of a snapshot, with the optional extra fields.
 * @param {object} snapshot as a persist resolves it
 * @param {{writer?: string, checkpointId?: bigint|number, sequenceFrom?: bigint|number, sequenceTo?: bigint|number, changes?: [number, number]}} [extra]
 * @returns {string} indented JSON ending in a newline
 * @throws {InvalidArgumentError} when an extra field is not an integer of its WIT type
 */
export function manifestJson(snapshot, extra = {}) {
  if (extra.writer !== undefined && typeof extra.writer !== 'string') {
    throw new InvalidArgumentError(`the writer of a manifest must be a string, got ${typeof extra.writer}`);
  }
  let changes;
  if (extra.changes !== undefined) {
    if (!Array.isArray(extra.changes) || extra.changes.length !== 2) {
      throw new InvalidArgumentError('the changes of a manifest must be a pair [first, end]');
    }
    changes = extra.changes.map((c) => u64(c, 'change index'));
  }
  /** An extra field: absent stays absent. */
  const optional = (check, value, what) => (value === undefined || value === null ? undefined : check(value, what));
  return records.manifestJson(snapshot, {
    writer: extra.writer,
    checkpointId: optional(s64, extra.checkpointId, 'checkpoint id'),
    sequenceFrom: optional(u64, extra.sequenceFrom, 'sequence number'),
    sequenceTo: optional(u64, extra.sequenceTo, 'sequence number'),
    changes,
  });
}

/**
 * Reads a manifest file back into handles.
 * @param {string} path
 * @returns {Promise<{remote: object, local: object|undefined, extra: {writer?: string, checkpointId?: bigint, sequenceFrom?: bigint, sequenceTo?: bigint, changes?: [bigint, bigint]}}>}
 * @throws {ReadError} naming the file and what does not parse
 */
export async function loadManifest(path) {
  let text;
  try {
    text = await readFile(path, 'utf8');
  } catch (e) {
    throw new ReadError(`cannot read manifest ${path}: ${e.message}`);
  }
  try {
    return records.parseManifest(text);
  } catch (e) {
    throw new ReadError(`invalid manifest ${path}: ${errorMessage(e)}`);
  }
}

/**
 * Writes the manifest of `snapshot` (see {@link manifestJson}) to `path` atomically
 * (temporary file, fsync, rename, directory fsync): a reader sees the old or the new one
 * whole.
 */
export async function storeManifest(path, snapshot, extra = {}) {
  const json = manifestJson(snapshot, extra);
  const tmp = `${path}.tmp`;
  await writeSynced(tmp, 'w', (handle) => handle.writeFile(json));
  await rename(tmp, path);
  await syncDir(dirname(path) || '.');
}
