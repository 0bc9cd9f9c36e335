// The upload machinery shared by all writers of a storage, as the Rust host's
// scheduler.rs, retry.rs, throttle.rs and uploader.rs:
//
// - Batching: tasks of every writer queue together and leave as one batch, one file,
//   when the persist delay has passed since the batch's first task or the queued bytes
//   reach the size threshold (delay 0 or threshold 0: at once).
// - Retries: policy `fixed` gives every attempt a timeout; a timed-out attempt goes on
//   while the next starts at once, and the first to succeed wins (the losers' files are
//   deleted); an I/O failure is retried after `next-attempt-delay`; after `max-attempts`
//   every task of the batch fails naming the attempts and the last cause. `none`: one
//   attempt, no timeout. Attempts wait for one of `num-threads` slots.
// - In-flight limit: a task's bytes count from its acceptance until its outcome is
//   delivered. Node cannot block inside an import, so `schedule` always accepts; the
//   limit is an awaitable admission instead (`available()`), which operators await
//   before appending (and `dstl-run.mjs` does).
// - Outcomes go to each task's writer's mailbox, after its bytes were returned to the
//   throttle, never from inside the writer's own call.

import { randomUUID } from 'node:crypto';

import { CodecPool } from './codec-pool.mjs';

/**
 * Bytes in flight against a limit, with an awaitable availability signal: the Node
 * counterpart of the back-pressure the wasmtime host applies by blocking inside
 * `schedule` (README.md, "Running dstl in Node").
 */
export class Throttle {
  constructor(max) {
    this.max = max;
    this.inFlight = 0;
    this.closed = false;
    this.waiters = [];
  }
  /** Admits `size` bytes (even past the limit: `schedule` cannot wait). */
  add(size) {
    this.inFlight += size;
  }
  /** Returns `size` bytes; wakes waiters when capacity is back. */
  release(size) {
    this.inFlight = Math.max(0, this.inFlight - size);
    if (this.isAvailable()) this.#wake();
  }
  /** True while the bytes in flight are below the limit (or the throttle is closed). */
  isAvailable() {
    return this.inFlight < this.max || this.closed;
  }
  /** @returns {Promise<void>} resolved once bytes in flight are below the limit */
  available() {
    if (this.isAvailable()) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }
  close() {
    this.closed = true;
    this.#wake();
  }
  #wake() {
    const waiters = this.waiters;
    this.waiters = [];
    for (const resolve of waiters) resolve();
  }
}

/** At most `n` attempts at once, first come first served. */
class Pool {
  constructor(n) {
    this.free = n;
    this.queue = [];
  }
  /** Runs `job` (async) once a slot is free; `onStart` runs when it gets the slot. */
  run(job) {
    return new Promise((resolve, reject) => {
      const go = () => {
        this.free--;
        Promise.resolve()
          .then(job)
          .then(resolve, reject)
          .finally(() => {
            this.free++;
            const next = this.queue.shift();
            if (next) next();
          });
      };
      if (this.free > 0) go();
      else this.queue.push(go);
    });
  }
}

/**
 * Runs `attempt(n)` under `policy` until one attempt succeeds or the policy gives up
 * (retry.rs). Results that lose go to `discard`, also after this settles.
 * @returns {Promise<{result: any, attempt: number, totalAttempts: number}>} rejects with the cause (string)
 */
export function execute(policy, pool, attempt, discard, onFinished = () => {}) {
  return new Promise((resolve, reject) => {
    let finished = false;
    let current = 1;
    let total = 1;
    let timer = null;
    let running = 0;
    const settle = () => {
      if (finished && running === 0) onFinished();
    };
    const spawn = (n) => {
      running++;
      pool
        .run(() => {
          if (!finished && current === n && policy.timeoutMs > 0) {
            timer = setTimeout(() => timedOut(n), policy.timeoutMs);
          }
          return attempt(n);
        })
        .then(
          (result) => done(n, null, result),
          (error) => done(n, error ?? new Error('attempt failed'), undefined),
        );
    };
    const done = (n, error, result) => {
      running--;
      if (finished) {
        if (!error) {
          // The loser's files are deleted before the batch counts as finished.
          running++;
          Promise.resolve()
            .then(() => discard(result))
            .catch(() => {})
            .finally(() => {
              running--;
              settle();
            });
        }
      } else if (!error) {
        finished = true;
        clearTimeout(timer);
        resolve({ result, attempt: n, totalAttempts: total });
      } else if (current === n) {
        current = null;
        clearTimeout(timer);
        const fatal = error.fatal === true;
        if (fatal || n >= policy.maxAttempts) {
          finished = true;
          reject(`upload failed after ${total} attempts; last: attempt ${n}: ${error.message ?? error}`);
        } else {
          total++;
          const next = () => {
            if (finished) return;
            current = n + 1;
            spawn(n + 1);
          };
          if (policy.delayMs > 0) setTimeout(next, policy.delayMs);
          else next();
        }
      }
      settle();
    };
    const timedOut = (n) => {
      if (finished || current !== n) return;
      if (n >= policy.maxAttempts) {
        finished = true;
        current = null;
        reject(`upload failed after ${total} attempts; last: attempt ${n} timed out after ${policy.timeoutMs} ms`);
        settle();
        return;
      }
      total++;
      current = n + 1;
      spawn(n + 1);
    };
    spawn(1);
  });
}

/** Upload counters, after Flink's `ChangelogStorage.*` metrics (a subset). */
export class Metrics {
  constructor() {
    this.upload_requests = 0;
    this.upload_failures = 0;
    this.uploaded_files = 0;
    this.written_bytes = 0;
    this.upload_batches = 0;
  }
}

/**
 * One upload attempt (uploader.rs): writes the change sets of a batch of tasks into one
 * new file (and a local copy with local recovery on) and computes each change set's
 * result. The file's layout comes from the component (`codec.mjs`), once per batch, so
 * every attempt writes the same bytes: a plain file is the header of
 * `files.layout-plain-file` followed by the blocks as they are (nothing copied); a
 * compressed one is the bytes of `files.encode-file`, on worker threads for batches of
 * 256 KiB and more (`codec-pool.mjs`).
 */
export class Uploader {
  /**
   * @param {{remote: import('./store.mjs').Store, local: import('./store.mjs').Store|null}} stores
   * @param {boolean} compression
   * @param {Metrics} metrics
   * @param {(level: string, message: string) => void} log
   * @param {import('./codec.mjs').ComponentCodec} codec the main thread's codec
   * @param {number} [threads] at most this many encoding workers
   */
  constructor(stores, compression, metrics, log, codec, threads = 2) {
    this.stores = stores;
    this.compression = compression;
    this.metrics = metrics;
    this.log = log;
    this.pool = new CodecPool(codec, threads);
  }

  /** Stops the encoding workers. */
  close() {
    return this.pool.close();
  }

  /**
   * The file of a batch: a plain one keeps the tasks' blocks as its parts; a compressed
   * one takes them (they move to the encoding worker). A batch the codec cannot encode
   * fails without retries.
   * @returns {Promise<{parts: Uint8Array[], offsets: BigUint64Array, logicalSize: bigint}>} the
   *   file's parts to write in order, each block's logical offset, the logical length
   */
  async encode(tasks) {
    const blocks = [];
    for (const task of tasks) for (const changeSet of task.changeSets) blocks.push(changeSet.block);
    let file;
    try {
      if (this.compression) {
        const encoded = await this.pool.encode(blocks, true);
        // The file holds them now: the batch, held until its outcome is delivered, need not.
        for (const task of tasks) for (const changeSet of task.changeSets) changeSet.block = null;
        file = { parts: [encoded.bytes], offsets: encoded.offsets, logicalSize: encoded.logicalSize };
      } else {
        const layout = this.pool.codec.layoutPlainFile(blocks.map((b) => b.length));
        file = { parts: [layout.header, ...blocks], offsets: layout.offsets, logicalSize: layout.logicalSize };
      }
    } catch (e) {
      const error = new Error(`could not encode the changelog file: ${e?.message ?? e}`);
      error.fatal = true;
      throw error;
    }
    if (file.offsets.length !== blocks.length) {
      const error = new Error(`the codec returned ${file.offsets.length} offsets for ${blocks.length} change sets`);
      error.fatal = true;
      throw error;
    }
    return file;
  }

  /**
   * @param {object[]} tasks
   * @param {Promise<{parts: Uint8Array[], offsets: BigUint64Array, logicalSize: bigint}>} encoded the batch's file ({@link Uploader#encode})
   * @returns {Promise<{perTask: object[][], remote: string, local: string|null, changeSets: number, written: number}>}
   */
  async upload(tasks, encoded) {
    this.metrics.upload_requests++;
    try {
      return await this.#write(tasks, await encoded);
    } catch (e) {
      this.metrics.upload_failures++;
      throw e;
    }
  }

  async #write(tasks, file) {
    const { parts, offsets, logicalSize } = file;
    let written = 0;
    for (const part of parts) written += part.length;
    const name = randomUUID();
    let path;
    try {
      path = await this.stores.remote.createParts(name, parts);
    } catch (e) {
      throw new Error(`could not write changelog file ${name} to ${this.stores.remote.describe()}: ${e.message}`);
    }
    const remote = { path, fileSize: logicalSize };
    let local = null;
    if (this.stores.local) {
      // A local copy that cannot be written degrades to a remote-only result, with a
      // warning, as in the wasmtime host (ARCHITECTURE.md, "Where dstl differs from
      // Flink", F6): the remote file alone makes the checkpoint durable.
      try {
        local = { path: await this.stores.local.createParts(name, parts), fileSize: logicalSize };
      } catch (e) {
        this.log('warn', `could not write the local copy of ${name}; the result is remote only: ${e.message}`);
      }
    }
    let i = 0;
    const perTask = tasks.map((task) =>
      task.changeSets.map((changeSet) => {
        const offset = offsets[i++];
        return {
          sequenceNumber: changeSet.sequenceNumber,
          remote,
          offset,
          local: local ? { handle: local, offset } : undefined,
          size: changeSet.size,
        };
      }),
    );
    return { perTask, remote: path, local: local?.path ?? null, changeSets: offsets.length, written };
  }

  /**
   * Deletes the files of an attempt that lost, its local copy too (ARCHITECTURE.md,
   * "Where dstl differs from Flink", F7).
   */
  async discard(file) {
    for (const [store, path] of [[this.stores.remote, file.remote], [this.stores.local, file.local]]) {
      if (!store || !path) continue;
      try {
        await store.delete(path);
      } catch (e) {
        this.log('warn', `could not delete ${path} of a losing upload attempt: ${e.message}`);
      }
    }
  }
}

/**
 * Batches, throttles and runs uploads for every writer of one storage.
 */
export class Scheduler {
  /**
   * @param {import('./config.mjs').Config} config
   * @param {Uploader} uploader
   * @param {import('./ownership.mjs').Ownership} ownership
   * @param {import('./ownership.mjs').Outstanding} outstanding
   * @param {Metrics} metrics
   * @param {(level: string, message: string) => void} log
   */
  constructor(config, uploader, ownership, outstanding, metrics, log) {
    this.delayMs = config.persistDelayMs;
    this.sizeThreshold = config.persistSizeThreshold;
    this.policy =
      config.retryPolicy === 'none'
        ? { maxAttempts: 1, timeoutMs: 0, delayMs: 0 }
        : { maxAttempts: config.maxAttempts, timeoutMs: config.uploadTimeoutMs, delayMs: config.nextAttemptDelayMs };
    this.pool = new Pool(config.uploadThreads);
    this.throttle = new Throttle(config.maxInFlight);
    this.uploader = uploader;
    this.ownership = ownership;
    this.outstanding = outstanding;
    this.metrics = metrics;
    this.log = log;
    this.queue = [];
    this.queuedBytes = 0;
    this.generation = 0;
    this.drainPending = false;
    this.drainTimer = null;
    this.closed = false;
  }

  /**
   * Accepts a task of `writer` (called from the writer's `schedule` import). Never
   * uploads or delivers on the caller's path.
   * @returns {string|null} why the task was refused, or null
   */
  submit(writer, task) {
    if (this.closed) return 'the changelog storage is closed';
    let size = 0;
    for (const changeSet of task.changeSets) size += Number(changeSet.size);
    this.throttle.add(size);
    this.queue.push({ writer, task, size, done: this.outstanding.start() });
    this.queuedBytes += size;
    // As the Rust host's batcher: a task of half the size threshold or more is worth a
    // file of its own and leaves at once, with whatever waited.
    if (this.delayMs <= 0 || this.queuedBytes >= this.sizeThreshold || size * 2 >= this.sizeThreshold) {
      const batch = this.#take();
      setImmediate(() => this.#start(batch));
    } else if (!this.drainPending) {
      this.drainPending = true;
      const generation = this.generation;
      this.drainTimer = setTimeout(() => {
        this.drainTimer = null;
        if (this.generation !== generation || this.closed) return;
        this.#start(this.#take());
      }, this.delayMs);
    }
    return null;
  }

  #take() {
    clearTimeout(this.drainTimer);
    this.drainTimer = null;
    this.queuedBytes = 0;
    this.generation++;
    this.drainPending = false;
    const batch = this.queue;
    this.queue = [];
    return batch;
  }

  #start(batch) {
    if (batch.length === 0) return;
    this.metrics.upload_batches++;
    const tasks = batch.map((q) => q.task);
    const lateJobs = this.outstanding.start();
    // Encoded by the first attempt, once; retries and speculative attempts reuse it.
    let encoded = null;
    execute(
      this.policy,
      this.pool,
      () => this.uploader.upload(tasks, (encoded ??= this.uploader.encode(tasks))),
      (file) => this.uploader.discard(file),
      lateJobs,
    ).then(
      ({ result: file }) => {
        this.metrics.uploaded_files++;
        this.metrics.written_bytes += file.written;
        this.ownership.uploaded(file, batch.map((queued) => queued.writer.id));
        batch.forEach((queued, i) => this.#deliver(queued, { kind: 'succeeded', task: queued.task.id, results: file.perTask[i] }));
      },
      (cause) => {
        const message = typeof cause === 'string' ? cause : `upload failed: ${cause?.message ?? cause}`;
        this.log('warn', `upload batch of ${tasks.length} tasks failed: ${message}`);
        for (const queued of batch) this.#deliver(queued, { kind: 'failed', task: queued.task.id, cause: message });
      },
    ).catch((e) => this.log('error', `delivering upload outcomes failed: ${e?.stack ?? e}`));
  }

  #deliver(queued, letter) {
    this.throttle.release(queued.size);
    try {
      queued.writer._post(letter);
    } catch (e) {
      this.log('error', `delivering an upload outcome to writer ${queued.writer.name} failed: ${e?.stack ?? e}`);
    } finally {
      queued.done();
    }
  }

  /** Tasks waiting to be batched. */
  queueSize() {
    return this.queue.length;
  }

  /**
   * Fails queued tasks with a closed error and wakes those awaiting capacity. Batches
   * already running finish and deliver as usual.
   */
  close() {
    this.closed = true;
    const batch = this.#take();
    this.throttle.close();
    for (const queued of batch) {
      this.#deliver(queued, {
        kind: 'failed',
        task: queued.task.id,
        cause: 'the changelog storage was closed before the upload started',
      });
    }
  }
}
