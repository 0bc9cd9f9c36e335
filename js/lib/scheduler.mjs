// The upload machinery shared by all writers of a storage (the Rust host's upload/).
// Every decision is the component's (WIT interface `policy`, dstl-proto's `batch` and
// `retry`); this module keeps the timers, the attempt slots and the files:
//
// - Batching: tasks of every writer go to the `batcher`, which says when a batch (one
//   file) leaves: after the persist delay, at the size threshold, or at once for a task of
//   half of it.
// - Retries: a `retry` machine per batch says which attempt starts when (a speculative
//   one beside an attempt past its timeout, the next one after a failure's delay), which
//   result wins (the losers' files are deleted) and the failure's message. Attempts wait
//   for one of `num-threads` slots; one whose deadline passed meanwhile does not run.
// - In-flight limit: a task's bytes count from its acceptance until its outcome is
//   delivered. Node cannot block inside an import, so `schedule` always accepts; the
//   limit is an awaitable admission instead (`available()`), which operators await
//   before appending (and `dstl-run.mjs` does).
// - Outcomes go to each task's writer's mailbox, after its bytes were returned to the
//   throttle, never from inside the writer's own call.

import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';

import { CodecPool } from './codec-pool.mjs';
import { errorMessage } from './component.mjs';

/** The machines' time: whole milliseconds on the monotonic clock. */
const now = () => BigInt(Math.floor(performance.now()));

/**
 * Calls `onTimeout` when a machine's timer (milliseconds) comes; a timer that fires
 * early (milliseconds are whole) is armed again by the caller's next step.
 */
function arm(timer, at, onTimeout) {
  clearTimeout(timer);
  if (at === undefined) return null;
  return setTimeout(onTimeout, Math.max(0, Number(at) - performance.now()));
}

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
    for (const resolve of this.waiters.splice(0)) resolve();
  }
}

/** At most `n` attempts at once, first come first served. */
class Pool {
  constructor(n) {
    /** Slots in all. */
    this.threads = n;
    this.free = n;
    this.queue = [];
  }
  /** Runs `job(waited)` (async) once a slot is free; `waited`: whether it had to queue. */
  run(job) {
    return new Promise((resolve, reject) => {
      const go = (waited) => {
        this.free--;
        Promise.resolve(waited)
          .then(job)
          .then(resolve, reject)
          .finally(() => {
            this.free++;
            const next = this.queue.shift();
            if (next) next(true);
          });
      };
      if (this.free > 0) go(false);
      else this.queue.push(go);
    });
  }
}

/**
 * Runs `attempt(n)` as a `retry` machine of the component (`policy.Retry`) decides until
 * it decides, from its step `first` on. Each event is one call that returns the
 * machine's next step (attempts to start, the decision, the timer). Results that lose go
 * to `discard`, also after this settles; `onFinished` runs once no attempt runs any more
 * (the machine is no longer used: it may be restarted).
 * @returns {Promise<any>} the winning result; rejects with the failure's message (string)
 */
export function execute(retry, first, pool, attempt, discard, onFinished = () => {}) {
  return new Promise((resolve, reject) => {
    let settled = false;
    let finished = false;
    let running = 0;
    let timer = null;
    const finishIfIdle = () => {
      if (settled && running === 0 && !finished) {
        finished = true;
        onFinished();
      }
    };
    const apply = (step) => {
      for (const n of step.start) spawn(n);
      if (step.outcome && !settled) {
        settled = true;
        if (step.outcome.tag === 'failed') reject(step.outcome.val);
      }
      timer = settled ? arm(timer, undefined) : arm(timer, step.timeout, () => apply(retry.handleTimeout(now())));
      finishIfIdle();
    };
    const spawn = (n) => {
      running++;
      // An attempt that waited for a slot asks whether it may still run (its deadline or
      // the decision may have passed meanwhile); if not, the machine words the cause.
      // One that did not wait starts as named.
      pool
        .run((waited) => {
          if (waited) {
            try {
              retry.mayStart(n);
            } catch (cause) {
              return Promise.reject(fatal(errorMessage(cause)));
            }
          }
          return attempt(n);
        })
        .then(
          (result) => {
            running--;
            const step = retry.attemptFinished(n, 'succeeded', '', now());
            if (!settled && step.outcome?.tag === 'succeeded' && step.outcome.val === n) resolve(result);
            else {
              // Decided before: this one lost; its files go before the batch counts as finished.
              running++;
              Promise.resolve()
                .then(() => discard(result))
                .catch(() => {})
                .finally(() => {
                  running--;
                  finishIfIdle();
                });
            }
            apply(step);
          },
          (error) => {
            running--;
            apply(retry.attemptFinished(n, error?.fatal === true ? 'fatal' : 'retryable', String(error?.message ?? error), now()));
          },
        );
    };
    apply(first);
  });
}

/** An attempt's error that no retry helps. */
function fatal(message) {
  const error = new Error(message);
  error.fatal = true;
  return error;
}

/** Upload counters, after Flink's `ChangelogStorage.*` metrics (a subset). */
export class Metrics {
  upload_requests = 0;
  upload_failures = 0;
  uploaded_files = 0;
  written_bytes = 0;
  upload_batches = 0;
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
      throw fatal(`could not encode the changelog file: ${e?.message ?? e}`);
    }
    if (file.offsets.length !== blocks.length) {
      throw fatal(`the codec returned ${file.offsets.length} offsets for ${blocks.length} change sets`);
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
   * @param {object} policy the component's `policy` exports (`Retry`, `Batcher`)
   * @param {Uploader} uploader
   * @param {import('./ownership.mjs').Ownership} ownership
   * @param {import('./ownership.mjs').Outstanding} outstanding
   * @param {Metrics} metrics
   * @param {(level: string, message: string) => void} log
   */
  constructor(config, policy, uploader, ownership, outstanding, metrics, log) {
    this.policy = policy;
    // The machines count whole milliseconds: a fraction (`500us`) rounds up, so a
    // duration that is not zero stays so.
    const ms = (duration) => BigInt(Math.ceil(duration));
    // As the settings give it: the component makes `none` one attempt, no timeout.
    this.retryPolicy = {
      kind: config.retryPolicy,
      maxAttempts: config.maxAttempts,
      timeoutMs: ms(config.uploadTimeoutMs),
      delayMs: ms(config.nextAttemptDelayMs),
    };
    this.batcher = new policy.Batcher(ms(config.persistDelayMs), BigInt(config.persistSizeThreshold));
    this.pool = new Pool(config.uploadThreads);
    this.throttle = new Throttle(config.maxInFlight);
    this.uploader = uploader;
    this.ownership = ownership;
    this.outstanding = outstanding;
    this.metrics = metrics;
    this.log = log;
    /**
     * Retry machines no upload uses, restarted for the next (one call instead of making
     * and dropping one per upload); at most one per upload thread is kept.
     */
    this.retries = [];
    /** Tasks in the batcher, by the number it knows them by (a u64 there, a Number key here). */
    this.queued = new Map();
    this.nextNumber = 0;
    this.timer = null;
    this.closed = false;
  }

  /**
   * Accepts a task of `writer` (called from the writer's `schedule` import). Never
   * uploads or delivers on the caller's path. A pre-emptive task (`task.preemptive`: no
   * checkpoint waits for it) waits for company in its batch whatever its size.
   * @returns {'storage-closed'|null} why the task was refused (the WIT `refusal` the
   *   writer's `schedule` import answers), or null. Node never waits for in-flight
   *   capacity inside `schedule` (see `ChangelogStorage.available`), so the
   *   refusals of a wait, `writer-closed` and `interrupted`, never arise here.
   * @throws whatever else failed (a defect, not a refusal)
   */
  submit(writer, task) {
    let size = 0;
    for (const changeSet of task.changeSets) size += Number(changeSet.size);
    const number = this.nextNumber++;
    let step;
    try {
      const push = task.preemptive ? this.batcher.pushBackground : this.batcher.push;
      step = push.call(this.batcher, BigInt(number), BigInt(size), now());
    } catch (e) {
      // The batcher's `err` (jco throws it as its string) means one thing: it closed,
      // with the storage. Anything else (a trap of the rules instance) is no refusal.
      if (typeof e === 'string') return 'storage-closed';
      throw e;
    }
    this.throttle.add(size);
    this.queued.set(number, { writer, task, size, done: this.outstanding.start() });
    this.#apply(step, true);
    return null;
  }

  /**
   * Acts on a step of the batcher: starts the batch that leaves (after the caller's
   * call returns, if `deferred`) and arms the timer for its deadline.
   */
  #apply({ leaving, timeout }, deferred) {
    if (leaving) {
      const batch = this.#take(leaving);
      if (deferred) setImmediate(() => this.#start(batch));
      else this.#start(batch);
    }
    this.timer = arm(this.timer, timeout, () => this.#apply(this.batcher.handleTimeout(now()), false));
  }

  /** The queued tasks of a batch's numbers. */
  #take(numbers) {
    const batch = [];
    for (const number of numbers) {
      const key = Number(number);
      batch.push(this.queued.get(key));
      this.queued.delete(key);
    }
    return batch;
  }

  #start(batch) {
    if (batch.length === 0) return;
    this.metrics.upload_batches++;
    const tasks = batch.map((q) => q.task);
    const lateJobs = this.outstanding.start();
    // Encoded by the first attempt, once; retries and speculative attempts reuse it.
    let encoded = null;
    let retry = this.retries.pop();
    const first = retry ? retry.restart(now()) : (retry = new this.policy.Retry(this.retryPolicy, now())).poll();
    execute(
      retry,
      first,
      this.pool,
      () => this.uploader.upload(tasks, (encoded ??= this.uploader.encode(tasks))),
      (file) => this.uploader.discard(file),
      () => {
        if (!this.closed && this.retries.length < this.pool.threads) this.retries.push(retry);
        else retry[Symbol.dispose]?.();
        lateJobs();
      },
    ).then(
      (file) => {
        this.metrics.uploaded_files++;
        this.metrics.written_bytes += file.written;
        this.ownership.uploaded(file, batch.map((queued) => queued.writer.id));
        batch.forEach((queued, i) => this.#deliver(queued, { kind: 'succeeded', task: queued.task.id, results: file.perTask[i] }));
      },
      (cause) => {
        this.log('warn', `upload batch of ${tasks.length} tasks failed: ${cause}`);
        for (const queued of batch) this.#deliver(queued, { kind: 'failed', task: queued.task.id, cause });
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
    return this.queued.size;
  }

  /**
   * Fails queued tasks with a closed error and wakes those awaiting capacity. Batches
   * already running finish and deliver as usual.
   */
  close() {
    this.closed = true;
    this.timer = arm(this.timer, undefined);
    for (const retry of this.retries.splice(0)) retry[Symbol.dispose]?.();
    const { queued: numbers, cause } = this.batcher.close();
    const batch = this.#take(numbers);
    this.throttle.close();
    for (const queued of batch) this.#deliver(queued, { kind: 'failed', task: queued.task.id, cause });
  }
}
