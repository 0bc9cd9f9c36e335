// Configuration: the keys, defaults, value syntax, checks and error messages are
// dstl-proto's `settings`, through the rules component (WIT interface `settings`), as the
// Rust host links them: Flink's `state.changelog.dstl.dfs.*` keys, also accepted without
// the `state.changelog.` prefix, plus dstl's own `dstl.*` keys. This module keeps what is
// the Node host's own: which keys it implements (it writes to local directories only, so
// no S3 keys or URLs) and the effective values as fields.
//
// The rules component is loaded when this module is (`Config.set` is synchronous).

import { randomBytes } from 'node:crypto';
import { join, resolve } from 'node:path';

import { errorMessage, sharedRules } from './component.mjs';
import { ConfigError } from './errors.mjs';

const { settings: shared } = await sharedRules();

/** The field of {@link Config} each key the Node host implements sets. */
const FIELDS = Object.freeze({
  'dstl.dfs.base-path': 'basePath',
  'dstl.dfs.compression.enabled': 'compression',
  'dstl.dfs.preemptive-persist-threshold': 'preemptivePersistThreshold',
  'dstl.dfs.batch.persist-delay': 'persistDelayMs',
  'dstl.dfs.batch.persist-size-threshold': 'persistSizeThreshold',
  'dstl.dfs.upload.buffer-size': 'uploadBufferSize',
  'dstl.dfs.upload.num-threads': 'uploadThreads',
  'dstl.dfs.discard.num-threads': 'discardThreads',
  'dstl.dfs.upload.max-in-flight': 'maxInFlight',
  'dstl.dfs.upload.retry-policy': 'retryPolicy',
  'dstl.dfs.upload.timeout': 'uploadTimeoutMs',
  'dstl.dfs.upload.max-attempts': 'maxAttempts',
  'dstl.dfs.upload.next-attempt-delay': 'nextAttemptDelayMs',
  'dstl.dfs.download.local-cache.idle-timeout-ms': 'cacheIdleTimeoutMs',
  'dstl.job-id': 'jobId',
  'dstl.local-recovery.enabled': 'localRecovery',
  'dstl.local-recovery.dir': 'localDir',
  'dstl.writer.memory-limit': 'writerMemoryLimit',
  'dstl.writer.max-writers': 'maxWriters',
  'dstl.writer.call-timeout': 'writerCallTimeoutMs',
});

/** Every key the Node host accepts. */
export const KEYS = Object.freeze(Object.keys(FIELDS));

/** Milliseconds (fractional below one) of a duration in nanoseconds. */
const millis = (nanos) => Number(nanos) / 1e6;

/**
 * A size as a number of bytes, or null above 2^53 (where a number loses bytes).
 * @param {bigint} bytes
 */
const safeBytes = (bytes) => (bytes <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(bytes) : null);

/**
 * Parses Flink's `MemorySize` syntax (units are powers of 1024).
 * @param {string} value
 * @returns {number|null} bytes, or null if it does not parse or exceeds 2^53
 */
export function parseMemory(value) {
  const bytes = shared.parseMemory(String(value));
  return bytes === undefined ? null : safeBytes(bytes);
}

/**
 * Parses Flink's duration syntax; a bare number is milliseconds.
 * @param {string} value
 * @returns {number|null} milliseconds (fractional for ns/µs), or null
 */
export function parseDuration(value) {
  const nanos = shared.parseDuration(String(value));
  return nanos === undefined ? null : millis(nanos);
}

/**
 * The effective configuration of a {@link ChangelogStorage}. Sizes are bytes (numbers),
 * durations milliseconds.
 */
export class Config {
  constructor() {
    /** @type {string|null} */
    this.localDir = null;
    for (const setting of shared.defaults()) {
      if (setting.key in FIELDS) this.#apply(setting.key, setting);
    }
    this.jobId = randomBytes(16).toString('hex');
  }

  /**
   * A configuration from defaults and `{key: value}` settings applied in order.
   * @param {Record<string, string|number|boolean>} [settings]
   * @returns {Config}
   */
  static from(settings = {}) {
    const config = new Config();
    for (const [key, value] of Object.entries(settings)) config.set(key, String(value));
    return config;
  }

  /**
   * Applies one setting.
   * @param {string} key a key of {@link KEYS}, optionally prefixed `state.changelog.`
   * @param {string} value
   * @throws {ConfigError} naming the key and the accepted form
   */
  set(key, value) {
    if (typeof key !== 'string' || typeof value !== 'string') {
      throw new ConfigError(`configuration key and value must be strings (got ${typeof key} ${String(key)} = ${typeof value})`);
    }
    let setting;
    try {
      setting = shared.parse(key, value);
    } catch (e) {
      throw new ConfigError(typeof e === 'string' ? e : `cannot parse \`${key}\`: ${errorMessage(e)}`);
    }
    if (!(setting.key in FIELDS)) {
      throw new ConfigError(`configuration key \`${key}\` is not supported by the Node host (its keys: ${KEYS.join(', ')})`);
    }
    this.#apply(key, setting);
  }

  /** Stores a parsed setting in its field; `key` as given, for messages. */
  #apply(key, { key: name, value }) {
    const invalid = (reason) => new ConfigError(`invalid value for \`${key}\`: ${reason}`);
    const v = value.tag === 'bytes' ? safeBytes(value.val) : value.tag === 'nanos' ? millis(value.val) : value.val;
    if (value.tag === 'bytes' && v === null) throw invalid(`${value.val} bytes exceed what the Node host counts exactly (2^53)`);
    if (name === 'dstl.dfs.base-path') {
      if (v.includes('\0')) throw invalid(`base path ${JSON.stringify(v)} contains a NUL character`);
      if (v.includes('://')) throw invalid(`the Node host writes to local directories only, not ${v}`);
    }
    this[FIELDS[name]] = v;
  }

  /** Checks relations between keys (Flink's scheduler constructor check). */
  validate() {
    try {
      shared.checkBatchSize(BigInt(this.persistSizeThreshold), BigInt(this.maxInFlight));
    } catch (e) {
      throw new ConfigError(errorMessage(e));
    }
  }

  /** @returns {string} `<base>/<job-id>/dstl`, absolute */
  jobDir() {
    return resolve(this.basePath, this.jobId, 'dstl');
  }

  /** @returns {string} `<local-dir or base/local>/jid_<job-id>/taskowned`, absolute */
  localCopiesDir() {
    return resolve(this.localDir ?? join(this.basePath, 'local'), `jid_${this.jobId}`, 'taskowned');
  }
}
