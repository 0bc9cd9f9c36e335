// File ownership (ARCHITECTURE.md, "File ownership"), as the Rust host's `registry/`,
// with ownership of local copies kept per writer: the task registry reference-counts uploaded files that no
// confirmed checkpoint owns yet; the local registry owns local copies per checkpoint and
// per writer.

/** Counts background jobs (uploads, deletions) so callers can await idleness. */
export class Outstanding {
  constructor() {
    this.count = 0;
    this.waiters = [];
  }
  /** @returns {() => void} call once when the job is done */
  start() {
    this.count++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      if (--this.count === 0) {
        const waiters = this.waiters;
        this.waiters = [];
        for (const resolve of waiters) resolve();
      }
    };
  }
  /** @returns {Promise<void>} resolved once no job is running */
  idle() {
    if (this.count === 0) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }
}

/** Deletes files off the caller's path, routed to the store that owns them. */
export class Discarder {
  /**
   * @param {{remote: import('./store.mjs').Store, local: import('./store.mjs').Store|null}} stores
   * @param {Outstanding} outstanding
   * @param {(level: string, message: string) => void} log
   */
  constructor(stores, outstanding, log) {
    this.stores = stores;
    this.outstanding = outstanding;
    this.log = log;
  }
  discard(path) {
    const done = this.outstanding.start();
    const store = this.stores.local?.contains(path) ? this.stores.local : this.stores.remote;
    setImmediate(() => {
      store
        .delete(path)
        .then(
          () => this.log('debug', `discarded changelog file ${path}`),
          (e) => this.log('warn', `could not discard changelog file ${path}: ${e.message}`),
        )
        .finally(done);
    });
  }
}

/** Reference counts per file (Flink's `TaskChangelogRegistry`). */
export class TaskRegistry {
  /** @param {Discarder} discarder */
  constructor(discarder) {
    this.discarder = discarder;
    /** @type {Map<string, number>} */
    this.counts = new Map();
  }
  /** Starts tracking a new file used by `count` change sets. */
  startTracking(path, count) {
    if (!(count > 0)) throw new RangeError(`initial reference count of ${path} must be above zero`);
    this.counts.set(path, count);
  }
  /** Ownership moved to a confirmed checkpoint: never delete the file here. */
  stopTracking(path) {
    this.counts.delete(path);
  }
  /** One change set no longer needs the file; at zero it is deleted. */
  release(path) {
    const count = this.counts.get(path);
    if (count === undefined) return;
    if (count <= 1) {
      this.counts.delete(path);
      this.discarder.discard(path);
    } else {
      this.counts.set(path, count - 1);
    }
  }
  /** @returns {number|undefined} the count of a tracked file */
  count(path) {
    return this.counts.get(path);
  }
  /** @returns {number} tracked files */
  tracked() {
    return this.counts.size;
  }
}

/**
 * Local copies and, per writer, the highest checkpoint that uses each (Flink's
 * `LocalChangelogRegistry`, owned per writer): a writer's `discard-up-to` discards only
 * its own entries and returns only their paths; a file is deleted only when no writer
 * still owns it and none holds it.
 */
export class LocalRegistry {
  /**
   * @param {Discarder} discarder
   * @param {(path: string, except: string) => boolean} held whether a live writer other
   *   than `except` holds `path`
   */
  constructor(discarder, held = () => false) {
    this.discarder = discarder;
    this.held = held;
    /** @type {Map<string, Map<string, bigint>>} path → owner → last checkpoint */
    this.entries = new Map();
  }
  /** Marks `path` as used by `checkpoint` of `owner`, keeping the highest id. */
  register(owner, path, checkpoint) {
    let owners = this.entries.get(path);
    if (!owners) {
      owners = new Map();
      this.entries.set(path, owners);
    }
    const last = owners.get(owner);
    owners.set(owner, last === undefined || checkpoint > last ? checkpoint : last);
  }
  /**
   * Drops `owner`'s entries last used by a checkpoint below `checkpoint`; deletes the
   * files no writer owns any more and no other writer holds (a batched file's local copy
   * also holds other writers' change sets).
   * @returns {string[]} the paths of the entries dropped
   */
  discardUpTo(owner, checkpoint) {
    const discarded = [];
    for (const [path, owners] of this.entries) {
      const last = owners.get(owner);
      if (last === undefined || last >= checkpoint) continue;
      owners.delete(owner);
      discarded.push(path);
      if (owners.size === 0) {
        this.entries.delete(path);
        if (!this.held(path, owner)) this.discarder.discard(path);
      }
    }
    return discarded;
  }
  /** @returns {bigint|undefined} the last checkpoint any owner uses `path` for */
  lastUsed(path) {
    let max;
    for (const cp of this.entries.get(path)?.values() ?? []) if (max === undefined || cp > max) max = cp;
    return max;
  }
}
