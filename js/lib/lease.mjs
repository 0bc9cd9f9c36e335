// An open storage's lease on its job: the record, where it goes and how often it is
// refreshed are dstl-proto's `lease` (through the rules component, WIT interface
// `records`), as the Rust host writes them (`<base>/<job>/leases/<uuid>.lease`); this
// module writes the file, refreshes its modification time and deletes it at close.
// `dstl gc` keeps every file of a job with a fresh lease that was modified since the
// lease was opened: a writer may still hold change sets for a checkpoint that has not
// completed, and no manifest names them yet.

import { randomUUID } from 'node:crypto';
import { rm, rmdir, utimes } from 'node:fs/promises';
import { resolve } from 'node:path';

import { sharedRules } from './component.mjs';
import { LocalStore } from './store.mjs';

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
    const { records } = await sharedRules();
    const lease = records.newLease(BigInt(Date.now()), process.pid);
    const store = await LocalStore.open(resolve(base, job, lease.dir));
    const name = `${randomUUID()}${lease.suffix}`;
    const path = await store.createParts(name, [Buffer.from(lease.json)]);
    const refresh = async () => {
      const now = new Date();
      try {
        await utimes(path, now, now);
      } catch (e) {
        if (e.code !== 'ENOENT') throw e;
        // Collected by gc after it expired (the process was stopped for longer): without
        // it the job's files would stay unprotected, so it is written again.
        warn(`the lease ${path} was gone (collected after it expired); writing it again`);
        await LocalStore.open(store.dir).then((again) => again.createParts(name, [Buffer.from(lease.json)]));
      }
    };
    const timer = setInterval(() => {
      refresh().catch((e) =>
        warn(`could not refresh the lease ${path}: ${e.message}; \`dstl gc\` may treat this job's files as unprotected once it expires`),
      );
    }, Number(lease.refreshMs));
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
