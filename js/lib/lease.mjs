// An open storage's lease on its job, as the Rust host writes it
// (`host/src/store/lease.rs`): `<base>/<job>/leases/<uuid>.lease`, a JSON record
// `{opened_ms, expires_after_ms, pid}`, its modification time refreshed every 30 s and
// the file deleted at close. `dstl gc` keeps every file of a job with a fresh lease that
// was modified since the lease was opened: a writer may still hold change sets for a
// checkpoint that has not completed, and no manifest names them yet.

import { randomUUID } from 'node:crypto';
import { rm, rmdir, utimes } from 'node:fs/promises';
import { resolve } from 'node:path';

import { LocalStore } from './store.mjs';

/** How often the holder refreshes its lease. */
export const REFRESH_MS = 30_000;
/** How long a lease protects after its last refresh. */
export const EXPIRES_AFTER_MS = 600_000;

export class Lease {
  /** @internal use {@link Lease.take} */
  constructor(dir, path, timer) {
    this.dir = dir;
    this.path = path;
    this.timer = timer;
  }

  /**
   * Takes a lease on `job` under the local base `base` and starts refreshing it.
   * @param {string} base
   * @param {string} job
   * @param {(message: string) => void} [warn] told when a refresh fails
   * @returns {Promise<Lease>}
   */
  static async take(base, job, warn = () => {}) {
    const store = await LocalStore.open(resolve(base, job, 'leases'));
    const record = { opened_ms: Date.now(), expires_after_ms: EXPIRES_AFTER_MS, pid: process.pid };
    const path = await store.createParts(`${randomUUID()}.lease`, [Buffer.from(JSON.stringify(record))]);
    const timer = setInterval(() => {
      const now = new Date();
      utimes(path, now, now).catch((e) =>
        warn(`could not refresh the lease ${path}: ${e.message}; \`dstl gc\` may treat this job's files as unprotected once it expires`),
      );
    }, REFRESH_MS);
    // The lease never keeps a process alive.
    timer.unref?.();
    return new Lease(store.dir, path, timer);
  }

  /** Stops refreshing and deletes the lease (and its directory, if now empty). */
  async release() {
    clearInterval(this.timer);
    await rm(this.path, { force: true });
    // Another storage of the job may hold a lease in it: then the directory stays.
    await rmdir(this.dir).catch(() => {});
  }
}

