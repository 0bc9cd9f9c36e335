// `ChangelogStorage`: one per process or job. It owns the compiled component, the upload
// machinery and the file ownership all its writers share (the Rust host's storage.rs).

import { isI32 } from './args.mjs';
import { ComponentCodec } from './codec.mjs';
import { Config } from './config.mjs';
import { errorMessage, loadComponent, loadRules } from './component.mjs';
import { ConfigError, InvalidArgumentError, SetupError, StorageClosedError } from './errors.mjs';
import { readHandle } from './reader.mjs';
import { Discarder, Outstanding, Ownership } from './ownership.mjs';
import { Metrics, Scheduler, Uploader } from './scheduler.mjs';
import { Lease } from './lease.mjs';
import { LocalStore } from './store.mjs';
import { Writer } from './writer.mjs';

const LEVELS = { trace: 0, debug: 1, info: 2, warn: 3, error: 4 };

/**
 * Logs to stderr at `warn` and above, or at the level `DSTL_LOG` names.
 * @param {string} level
 * @param {string|null} writer
 * @param {string} message
 */
export function defaultLogger(level, writer, message) {
  const threshold = LEVELS[process.env.DSTL_LOG ?? 'warn'] ?? LEVELS.warn;
  if ((LEVELS[level] ?? 2) < threshold) return;
  process.stderr.write(`${level.toUpperCase()} ${writer ? `writer=${writer} ` : ''}${message}\n`);
}

/**
 * The changelog storage of one job: creates writers and reads snapshots back.
 * Open it with {@link ChangelogStorage.open}.
 */
export class ChangelogStorage {
  /** @internal */
  constructor(config, component, rules, stores, logger) {
    /** The effective configuration. @type {Config} */
    this.config = config;
    /** The compiled writer component. */
    this.component = component;
    this.stores = stores;
    this.logger = logger;
    this.outstanding = new Outstanding();
    this.metricsCounters = new Metrics();
    const log = (level, message) => this._log(level, null, message);
    const discarder = new Discarder(stores, this.outstanding, log);
    /** Who owns which file: the rules component's instance. */
    this.ownership = new Ownership(rules, discarder, log);
    /** That instance's exports: also the writer checks (`settings.checkWriter`). */
    this.rules = this.ownership.root;
    /** @type {Set<Writer>} */
    this.writers = new Set();
    /**
     * The component's file format in an instance of its own (never a writer's): files
     * are encoded and read back through it.
     */
    this.codec = new ComponentCodec(component);
    this.uploader = new Uploader(stores, config.compression, this.metricsCounters, log, this.codec, config.uploadThreads);
    this.scheduler = new Scheduler(config, this.ownership.policy, this.uploader, this.ownership, this.outstanding, this.metricsCounters, log);
    this.closed = false;
    this.nextWriterId = 0;
  }

  /**
   * Opens a storage: creates `<base>/<job-id>/dstl/` (and the local-copy directory with
   * local recovery on), and loads the writer and rules components.
   * @param {Config|Record<string, string|number|boolean>} [config] a Config or `{key: value}` settings
   * @param {object} [options]
   * @param {import('./store.mjs').Store} [options.store] where uploads go instead of the job directory
   * @param {string} [options.wasm] a `dstl_guest.wasm` to run instead of the packaged component
   *   (default `$DSTL_GUEST_WASM`); unless its bytes are the packaged component's, it is
   *   transpiled on first use, which needs `@bytecodealliance/jco` installed, into the
   *   user's cache directory
   * @param {(level: string, writer: string|null, message: string) => void} [options.logger]
   * @returns {Promise<ChangelogStorage>}
   */
  static async open(config = {}, options = {}) {
    if (!(config instanceof Config)) config = Config.from(config);
    config.validate();
    const openDir = (what, dir) =>
      LocalStore.open(dir).catch((e) => {
        throw new SetupError(`cannot create the ${what} ${dir}: ${e.message}`);
      });
    const remote = options.store || (await openDir('changelog directory', config.jobDir()));
    const local = config.localRecovery ? await openDir('local-copy directory', config.localCopiesDir()) : null;
    let component;
    let rules;
    try {
      [component, rules] = await Promise.all([loadComponent(options.wasm), loadRules()]);
    } catch (e) {
      if (e instanceof SetupError) throw e;
      throw new SetupError(`cannot load the components: ${e.message}`);
    }
    const logger = options.logger ?? defaultLogger;
    let lease;
    try {
      lease = await Lease.take(config.basePath, config.jobId, (message) => logger('warn', null, message));
    } catch (e) {
      throw new SetupError(`cannot take the job's lease under ${config.basePath}: ${e.message}`);
    }
    const storage = new ChangelogStorage(config, component, rules, { remote, local }, logger);
    // Tells `dstl gc` the job is live (see lease.mjs); released at close.
    storage.lease = lease;
    return storage;
  }

  /** @internal */
  _log(level, writer, message) {
    try {
      this.logger(level, writer, message);
    } catch {
      // A failing logger must not break a writer.
    }
  }

  /**
   * Creates a writer: one instance of the component, its memory capped at
   * `options.memoryLimit` (default `dstl.writer.memory-limit`), each call held to
   * `options.callTimeoutMs` (default `dstl.writer.call-timeout`; see the README on what
   * Node can enforce).
   * @param {string} name operator name, 1 to 256 characters, no control characters
   * @param {{start: number, end: number}} keyGroupRange inclusive
   * @param {{memoryLimit?: number, callTimeoutMs?: number}} [options]
   * @returns {Writer}
   * @throws {InvalidArgumentError|StorageClosedError|TrappedError}
   */
  createWriter(name, keyGroupRange, options = {}) {
    if (typeof name !== 'string') throw new InvalidArgumentError(`a writer's name must be a string, got ${typeof name}`);
    const { start, end } = keyGroupRange ?? {};
    if (!isI32(start) || !isI32(end)) {
      throw new InvalidArgumentError(`invalid key-group range [${start}, ${end}] for writer ${name}: need two 32-bit integers`);
    }
    const memoryLimit = options.memoryLimit ?? this.config.writerMemoryLimit;
    if (!Number.isSafeInteger(memoryLimit) || memoryLimit < 0) {
      throw new InvalidArgumentError(`memory limit ${memoryLimit} of writer ${name} must be a whole number of bytes`);
    }
    const callTimeoutMs = options.callTimeoutMs ?? this.config.writerCallTimeoutMs;
    if (!Number.isFinite(callTimeoutMs) || callTimeoutMs < 0) {
      throw new InvalidArgumentError(`call timeout ${callTimeoutMs} of writer ${name} must be a number of milliseconds`);
    }
    // The rules every host applies (dstl-proto's `writer_request`), in its words.
    try {
      this.rules.settings.checkWriter(
        { name, keyGroupRange: { start, end }, memoryLimit: BigInt(memoryLimit), callTimeoutNanos: BigInt(Math.round(callTimeoutMs * 1e6)) },
        BigInt(this.config.writerMemoryLimit),
      );
    } catch (e) {
      throw new InvalidArgumentError(errorMessage(e));
    }
    if (this.closed) throw new StorageClosedError(name);
    const config = {
      name,
      keyGroupRange: { start, end },
      preemptivePersistThreshold: BigInt(this.config.preemptivePersistThreshold),
      localRecovery: this.config.localRecovery,
      // jco copies every piece out of the guest on its own: one piece per block.
      valuePieces: false,
    };
    const writer = new Writer(this, config, { memoryLimit, callTimeoutMs, id: this.nextWriterId++ });
    this.writers.add(writer);
    return writer;
  }

  /**
   * Reads a snapshot's handle back (recovery).
   * @param {object} handle a `remote` or `local` handle of a snapshot result or manifest
   * @returns {Promise<{keyGroup: number, value: Uint8Array}[]>}
   */
  read(handle) {
    return readHandle(handle, (path) => this.stores.remote.read(path), this.codec);
  }

  /** True while uploads are accepted without exceeding `dstl.dfs.upload.max-in-flight`. */
  isAvailable() {
    return this.scheduler.throttle.isAvailable();
  }

  /**
   * Resolves once the bytes in flight are below `dstl.dfs.upload.max-in-flight`: await
   * it before appending (Node cannot block inside the writer's `schedule` import).
   * @returns {Promise<void>}
   */
  available() {
    return this.scheduler.throttle.available();
  }

  /** Upload counters and gauges. */
  metrics() {
    return {
      ...this.metricsCounters,
      upload_queue_size: this.scheduler.queueSize(),
      bytes_in_flight: this.scheduler.throttle.inFlight,
    };
  }

  /**
   * Resolves once every upload and deletion started so far has finished and its outcome
   * was handed to its writer.
   * @returns {Promise<void>}
   */
  idle() {
    return this.outstanding.idle();
  }

  /**
   * Stops accepting uploads: queued tasks fail with a closed error, those awaiting
   * capacity are woken, and running batches get up to `max-attempts × timeout` (at least
   * 5 s) to finish and deliver.
   * @returns {Promise<void>}
   */
  async close() {
    if (this.closed) return;
    this.closed = true;
    this.scheduler.close();
    const grace = Math.max(this.config.uploadTimeoutMs * this.config.maxAttempts, 5000);
    let timer;
    const timedOut = new Promise((resolve) => {
      timer = setTimeout(() => resolve(true), grace);
      timer.unref?.();
    });
    const late = await Promise.race([this.idle().then(() => false), timedOut]);
    clearTimeout(timer);
    if (late) this._log('warn', null, `uploads still running at close after ${grace} ms; abandoning them`);
    await this.uploader.close();
    await this.lease?.release();
  }
}

export { Config, ConfigError };
