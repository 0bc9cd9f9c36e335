// A local directory as a store, writing exactly as the Rust host's `LocalStore`
// (`host/src/store/local.rs`): a file is written under the temporary name
// `.NAME.PID.N.tmp` (N counts this process's creates), fsync'd, hard-linked into place
// (which fails rather than overwrite), and the directory fsync'd before the write
// counts; a failed write leaves nothing. Directories the store creates are made durable
// in their parents.

import { link, mkdir, open, readdir, readFile, realpath, rm, stat, unlink } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';

/** Creates so far in this process: each gets a staging name of its own. */
let staged = 0;

/**
 * The store interface the host uploads through (tests substitute their own):
 * `createParts(name, parts) → Promise<path>`, `delete(path)`, `read(path)`,
 * `list() → Promise<{path, size, modifiedMs}[]>`, `describe() → string`, `contains(path)`.
 * @typedef {object} Store
 */

async function writeAll(handle, parts) {
  let pending = parts.filter((p) => p.length > 0);
  while (pending.length > 0) {
    const { bytesWritten } = await handle.writev(pending);
    let left = bytesWritten;
    const rest = [];
    for (const part of pending) {
      if (left >= part.length) {
        left -= part.length;
      } else {
        rest.push(part.subarray(left));
        left = 0;
      }
    }
    pending = rest;
  }
}

/**
 * Opens `path` with `flags`, lets `write` write through the handle, then fsyncs and
 * closes it (closed also when the write or the fsync fails).
 * @param {string} path
 * @param {string} flags
 * @param {(handle: import('node:fs/promises').FileHandle) => Promise<void>|void} [write] none: only the fsync
 */
export async function writeSynced(path, flags, write = () => {}) {
  const handle = await open(path, flags);
  try {
    await write(handle);
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** Fsyncs a directory so the names in it are durable. */
export function syncDir(dir) {
  return writeSynced(dir, 'r');
}

/**
 * Creates `dir` and its missing ancestors, fsyncing each new directory's parent so the
 * new names survive a power loss, as `create_dirs_durably` in the Rust host does.
 * Returns the directories it created, outermost first.
 * @param {string} dir
 * @returns {Promise<string[]>}
 */
export async function createDirsDurably(dir) {
  const missing = [];
  for (let d = resolve(dir); ; d = dirname(d)) {
    try {
      await stat(d);
      break;
    } catch (e) {
      if (e.code !== 'ENOENT') throw e;
      missing.push(d);
    }
    if (dirname(d) === d) break;
  }
  missing.reverse();
  for (const d of missing) {
    try {
      await mkdir(d);
    } catch (e) {
      if (e.code !== 'EEXIST') throw e;
    }
    await syncDir(dirname(d));
  }
  return missing;
}

/** A directory of changelog files. */
export class LocalStore {
  /** @param {string} dir absolute and canonical; use {@link LocalStore.open} */
  constructor(dir) {
    this.dir = dir;
  }

  /**
   * A store writing into `dir`, created if missing, made absolute and canonical so
   * handles name files independently of the working directory.
   * @param {string} dir
   * @returns {Promise<LocalStore>}
   */
  static async open(dir) {
    await createDirsDurably(dir);
    return new LocalStore(await realpath(dir));
  }

  /** True if `path` names a file directly inside this store's directory. */
  contains(path) {
    const name = basename(path);
    return dirname(path) === this.dir && name !== '' && name !== '.' && name !== '..';
  }

  /**
   * Creates `name` from `parts` written one after the other, atomically and durably;
   * fails if it exists. Returns its path.
   * @param {string} name
   * @param {Uint8Array[]} parts
   * @returns {Promise<string>}
   */
  async createParts(name, parts) {
    const target = join(this.dir, name);
    // A staging name of this call alone: two creates of one name must not share it.
    const staging = join(this.dir, `.${name}.${process.pid}.${staged++}.tmp`);
    let linked = false;
    try {
      await writeSynced(staging, 'wx', (handle) => writeAll(handle, parts));
      // A hard link creates the name only if it is free, so a file is never
      // overwritten, and it appears with all its bytes at once.
      await link(staging, target);
      linked = true;
      await syncDir(this.dir);
    } catch (e) {
      if (linked) await rm(target, { force: true });
      throw e;
    } finally {
      await rm(staging, { force: true });
    }
    return target;
  }

  /**
   * Deletes a file of this store; a missing file counts as deleted. Refuses any path
   * outside the directory.
   * @param {string} path
   */
  async delete(path) {
    if (!this.contains(path)) {
      const error = new Error(`${path} is not a file of the store ${this.dir}`);
      error.code = 'EINVAL';
      throw error;
    }
    try {
      await unlink(path);
    } catch (e) {
      if (e.code !== 'ENOENT') throw e;
    }
  }

  /** Reads a whole file. */
  read(path) {
    return readFile(path);
  }

  /**
   * The files of the directory, sorted by path; with `staging`, also the hidden staging
   * files of interrupted writes.
   * @returns {Promise<{path: string, size: number, modifiedMs: number}[]>}
   */
  async list(staging = false) {
    const files = [];
    for (const entry of await readdir(this.dir, { withFileTypes: true })) {
      if (!staging && entry.name.startsWith('.')) continue;
      if (!entry.isFile()) continue;
      const path = join(this.dir, entry.name);
      const info = await stat(path);
      files.push({ path, size: info.size, modifiedMs: info.mtimeMs });
    }
    return files.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  }

  /** @returns {string} where the files go, for messages */
  describe() {
    return this.dir;
  }
}
