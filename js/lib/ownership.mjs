// File ownership (ARCHITECTURE.md, "File ownership"): the rules are dstl-proto's
// `ownership`, exported by the rules component (WIT world `rules`, interface
// `ownership`); this module keeps them in one instance of that component per storage and
// deletes the files they hand back. The same instance serves the upload policy (WIT
// `policy`) to the scheduler and writers. The Rust host links the same rules natively
// (`host/src/registry/`).
//
// A writer's imports call this instance while that writer's guest is running, which is no
// re-entry: it is an instance of another component.

import { instantiateRules } from './component.mjs';

/** Counts background jobs (uploads, deletions) so callers can await idleness. */
export class Outstanding {
  count = 0;
  waiters = [];
  /** @returns {() => void} call once when the job is done */
  start() {
    this.count++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      if (--this.count === 0) for (const resolve of this.waiters.splice(0)) resolve();
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

/**
 * Who owns which file in one storage: reference counts of store files no checkpoint owns
 * yet (`task-refs`), claims of writers on local copies (`local-claims`), and per writer
 * what its guest holds (`holdings`). A writer is identified by its `id`.
 */
export class Ownership {
  /**
   * @param {import('./component.mjs').Component} rules the rules component (`loadRules`)
   * @param {Discarder} discarder
   * @param {(level: string, message: string) => void} log
   */
  constructor(rules, discarder, log) {
    this.root = instantiateRules(rules);
    /** The upload policy (WIT `policy`), whose machines live in the same instance. */
    this.policy = this.root.policy;
    this.refs = new this.root.ownership.TaskRefs();
    this.claims = new this.root.ownership.LocalClaims();
    this.discarder = discarder;
    this.log = log;
  }

  /** @returns {object} a new writer's `holdings` (jco throws a guest fault as its message) */
  newHoldings() {
    return new this.root.ownership.Holdings();
  }

  /** A file was uploaded: the store file holds `changeSets` change sets; a local copy is claimed by each writer with results in it. */
  uploaded(file, recipients) {
    const tracking = this.refs.startTracking(file.remote, BigInt(file.changeSets));
    if (tracking === 'empty') this.discarder.discard(file.remote);
    else if (tracking === 'replaced') this.log('warn', `uploaded file ${file.remote} was tracked already`);
    if (!file.local) return;
    recipients.forEach((writerId, i) => this.claims.hold(BigInt(writerId), file.local, BigInt(file.perTask[i].length)));
  }

  /** Writer `writerId` no longer needs one change set in `path`. */
  release(writerId, path, local) {
    const released = local ? this.claims.release(BigInt(writerId), path) : this.refs.release(path);
    if (released === 'delete') this.discarder.discard(path);
  }

  /** A confirmed checkpoint of `writerId` holds `path`. */
  stopTracking(writerId, path, local) {
    if (!local) return this.refs.stopTracking(path);
    if (this.claims.stopTracking(BigInt(writerId), path) === 'delete') this.discarder.discard(path);
  }

  /** `path` is used by `checkpoint` of `writerId`. */
  register(writerId, path, checkpoint) {
    this.claims.register(BigInt(writerId), path, checkpoint);
  }

  /**
   * Ends `writerId`'s claims last registered below `checkpoint`, deleting the files nobody
   * claims any more.
   * @returns {string[]} the files whose claim ended (the writer forgets them)
   */
  discardUpTo(writerId, checkpoint) {
    const { forgotten, delete: unclaimed } = this.claims.discardUpTo(BigInt(writerId), checkpoint);
    for (const path of unclaimed) this.discarder.discard(path);
    return forgotten;
  }

  /** Releases every file reference of upload results `writerId` cannot take. */
  releaseResults(writerId, results) {
    for (const result of results) {
      this.release(writerId, result.remote.path, false);
      if (result.local) this.release(writerId, result.local.handle.path, true);
    }
  }

  /** Releases what `holdings` holds that no returned snapshot names (the guest is gone). */
  releaseUnreturned(writerId, holdings) {
    for (const { path, refs, local } of holdings.takeUnreturned()) {
      for (let i = 0n; i < refs; i++) this.release(writerId, path, local);
    }
  }

  /** @returns {number} store files tracked */
  tracked() {
    return Number(this.refs.tracked());
  }

  /** @returns {bigint|undefined} the reference count of a tracked store file */
  count(path) {
    return this.refs.count(path);
  }
}
