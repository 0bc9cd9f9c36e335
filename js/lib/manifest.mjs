// The manifest JSON of one snapshot, field for field as the Rust host writes it
// (`host/src/manifest.rs`), written atomically.

import { open, readFile, rename } from 'node:fs/promises';
import { dirname } from 'node:path';

import { ReadError } from './errors.mjs';
import { syncDir } from './store.mjs';

function num(value, what) {
  const n = Number(value);
  if (!Number.isSafeInteger(n)) throw new RangeError(`${what} ${value} does not fit a JSON number`);
  return n;
}

function entries(handle) {
  return handle.entries.map((e) => ({
    path: e.handle.path,
    file_size: num(e.handle.fileSize, 'file size'),
    offset: num(e.offset, 'offset'),
    size: num(e.size, 'size'),
  }));
}

/**
 * The manifest of a snapshot result, with the optional extra fields.
 * @param {object} snapshot as a persist resolves it
 * @param {{writer?: string, checkpointId?: bigint|number, sequenceFrom?: bigint|number, sequenceTo?: bigint|number, changes?: [number, number]}} [extra]
 * @returns {object} ready for `JSON.stringify`
 */
export function manifestFromSnapshot(snapshot, extra = {}) {
  const remote = snapshot.remote;
  const manifest = {
    storage_id: remote.storageId,
    key_group_range: { start: remote.keyGroupRange.start, end: remote.keyGroupRange.end },
    state_size: num(remote.stateSize, 'state size'),
    incremental_size: num(remote.incrementalSize, 'incremental size'),
    entries: entries(remote),
    local: snapshot.local
      ? {
          storage_id: snapshot.local.storageId,
          key_group_range: { start: snapshot.local.keyGroupRange.start, end: snapshot.local.keyGroupRange.end },
          state_size: num(snapshot.local.stateSize, 'state size'),
          incremental_size: num(snapshot.local.incrementalSize, 'incremental size'),
          entries: entries(snapshot.local),
        }
      : null,
  };
  if (extra.writer !== undefined) manifest.writer = extra.writer;
  if (extra.checkpointId !== undefined) manifest.checkpoint_id = num(extra.checkpointId, 'checkpoint id');
  if (extra.sequenceFrom !== undefined) manifest.sequence_from = num(extra.sequenceFrom, 'sequence number');
  if (extra.sequenceTo !== undefined) manifest.sequence_to = num(extra.sequenceTo, 'sequence number');
  if (extra.changes !== undefined) manifest.changes = extra.changes.map((c) => num(c, 'change index'));
  return manifest;
}

function toHandle(m) {
  return {
    entries: m.entries.map((e) => ({
      handle: { path: e.path, fileSize: BigInt(e.file_size) },
      offset: BigInt(e.offset),
      size: BigInt(e.size),
    })),
    keyGroupRange: { start: m.key_group_range.start, end: m.key_group_range.end },
    stateSize: BigInt(m.state_size),
    incrementalSize: BigInt(m.incremental_size),
    storageId: m.storage_id,
  };
}

/**
 * Reads a manifest file back into handles.
 * @param {string} path
 * @returns {Promise<{manifest: object, remote: object, local: object|null}>}
 * @throws {ReadError}
 */
export async function loadManifest(path) {
  let manifest;
  try {
    manifest = JSON.parse(await readFile(path, 'utf8'));
  } catch (e) {
    throw new ReadError(`invalid manifest ${path}: ${e.message}`);
  }
  if (!manifest || !Array.isArray(manifest.entries) || !manifest.key_group_range) {
    throw new ReadError(`invalid manifest ${path}: missing entries or key_group_range`);
  }
  try {
    return { manifest, remote: toHandle(manifest), local: manifest.local ? toHandle(manifest.local) : null };
  } catch (e) {
    throw new ReadError(`invalid manifest ${path}: ${e.message}`);
  }
}

/**
 * Writes `manifest` to `path` atomically (temporary file, fsync, rename, directory
 * fsync): a reader sees the old or the new one whole.
 */
export async function storeManifest(path, manifest) {
  const tmp = `${path}.tmp`;
  const handle = await open(tmp, 'w');
  try {
    await handle.writeFile(`${JSON.stringify(manifest, null, 2)}\n`);
    await handle.sync();
  } finally {
    await handle.close();
  }
  await rename(tmp, path);
  await syncDir(dirname(path) || '.');
}
