// Configuration: the same keys, defaults and value syntax as the Rust host
// (`host/src/config.rs`): Flink's `state.changelog.dstl.dfs.*` keys, also accepted
// without the `state.changelog.` prefix, plus dstl's own `dstl.*` keys. The S3 keys are
// rejected: the Node host writes to local directories only.

import { randomBytes } from 'node:crypto';
import { join, resolve } from 'node:path';

import { ConfigError } from './errors.mjs';

const MEMORY_FORM = 'a size such as `5mb`, `10 mb`, `512kb` or `1024` (bytes)';
const DURATION_FORM = 'a duration such as `10 ms`, `1 s`, `2min` (no unit means ms)';

function splitNumber(value) {
  const match = /^([0-9]+)(.*)$/.exec(value);
  if (!match) return null;
  return [BigInt(match[1]), match[2].trim().toLowerCase()];
}

/**
 * Parses Flink's `MemorySize` syntax (units are powers of 1024).
 * @param {string} value
 * @returns {number|null} bytes, or null if it does not parse or exceeds 2^53
 */
export function parseMemory(value) {
  const split = splitNumber(value.trim());
  if (!split) return null;
  const [n, unit] = split;
  const shifts = { '': 0n, b: 0n, bytes: 0n, k: 10n, kb: 10n, kib: 10n, kibibytes: 10n, m: 20n, mb: 20n, mib: 20n, mebibytes: 20n, g: 30n, gb: 30n, gib: 30n, gibibytes: 30n, t: 40n, tb: 40n, tib: 40n, tebibytes: 40n };
  if (!(unit in shifts)) return null;
  const bytes = n << shifts[unit];
  return bytes <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(bytes) : null;
}

/**
 * Parses Flink's duration syntax; a bare number is milliseconds.
 * @param {string} value
 * @returns {number|null} milliseconds (fractional for ns/µs), or null
 */
export function parseDuration(value) {
  const split = splitNumber(value.trim());
  if (!split) return null;
  const [n, unit] = split;
  const units = [
    [['', 'ms', 'milli', 'millis', 'millisecond', 'milliseconds'], 1],
    [['ns', 'nano', 'nanos', 'nanosecond', 'nanoseconds'], 1e-6],
    [['us', 'µs', 'micro', 'micros', 'microsecond', 'microseconds'], 1e-3],
    [['s', 'sec', 'secs', 'second', 'seconds'], 1e3],
    [['m', 'min', 'mins', 'minute', 'minutes'], 60e3],
    [['h', 'hour', 'hours'], 3600e3],
    [['d', 'day', 'days'], 86400e3],
  ];
  for (const [names, factor] of units) {
    if (names.includes(unit)) {
      const ms = Number(n) * factor;
      return Number.isFinite(ms) ? ms : null;
    }
  }
  return null;
}

/** Every key the Node host accepts. */
export const KEYS = Object.freeze([
  'dstl.dfs.base-path',
  'dstl.dfs.compression.enabled',
  'dstl.dfs.preemptive-persist-threshold',
  'dstl.dfs.batch.persist-delay',
  'dstl.dfs.batch.persist-size-threshold',
  'dstl.dfs.upload.buffer-size',
  'dstl.dfs.upload.num-threads',
  'dstl.dfs.discard.num-threads',
  'dstl.dfs.upload.max-in-flight',
  'dstl.dfs.upload.retry-policy',
  'dstl.dfs.upload.timeout',
  'dstl.dfs.upload.max-attempts',
  'dstl.dfs.upload.next-attempt-delay',
  'dstl.dfs.download.local-cache.idle-timeout-ms',
  'dstl.job-id',
  'dstl.local-recovery.enabled',
  'dstl.local-recovery.dir',
  'dstl.writer.memory-limit',
  'dstl.writer.max-writers',
  'dstl.writer.call-timeout',
]);

/**
 * The effective configuration of a {@link ChangelogStorage}. Sizes are bytes (numbers),
 * durations milliseconds.
 */
export class Config {
  constructor() {
    this.basePath = 'dstl-data';
    this.compression = false;
    this.preemptivePersistThreshold = 5 * 2 ** 20;
    this.persistDelayMs = 10;
    this.persistSizeThreshold = 10 * 2 ** 20;
    this.uploadBufferSize = 2 ** 20;
    this.uploadThreads = 5;
    this.discardThreads = 1;
    this.maxInFlight = 100 * 2 ** 20;
    this.retryPolicy = 'fixed';
    this.uploadTimeoutMs = 1000;
    this.maxAttempts = 3;
    this.nextAttemptDelayMs = 500;
    this.cacheIdleTimeoutMs = 600_000;
    this.jobId = randomBytes(16).toString('hex');
    this.localRecovery = false;
    /** @type {string|null} */
    this.localDir = null;
    this.writerMemoryLimit = 256 * 2 ** 20;
    this.maxWriters = 1024;
    this.writerCallTimeoutMs = 10_000;
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
    const short = key.startsWith('state.changelog.') ? key.slice('state.changelog.'.length) : key;
    value = value.trim();
    const invalid = (expected) => new ConfigError(`invalid value \`${value}\` for \`${key}\`: expected ${expected}`);
    const memory = () => {
      const v = parseMemory(value);
      if (v === null) throw invalid(MEMORY_FORM);
      return v;
    };
    const duration = () => {
      const v = parseDuration(value);
      if (v === null) throw invalid(DURATION_FORM);
      return v;
    };
    const boolean = () => {
      const v = value.toLowerCase();
      if (v === 'true') return true;
      if (v === 'false') return false;
      throw invalid('`true` or `false`');
    };
    const positive = () => {
      if (!/^[0-9]+$/.test(value) || Number(value) < 1 || Number(value) > 4294967295) {
        throw invalid('a whole number of at least 1');
      }
      return Number(value);
    };
    switch (short) {
      case 'dstl.dfs.base-path':
        if (value === '') throw invalid('a directory path');
        if (value.includes('\0')) throw new ConfigError(`invalid value for \`${key}\`: base path ${JSON.stringify(value)} contains a NUL character`);
        if (value.includes('://')) {
          throw new ConfigError(`invalid value for \`${key}\`: the Node host writes to local directories only, not ${value}`);
        }
        this.basePath = value;
        break;
      case 'dstl.dfs.compression.enabled':
        this.compression = boolean();
        break;
      case 'dstl.dfs.preemptive-persist-threshold':
        this.preemptivePersistThreshold = memory();
        break;
      case 'dstl.dfs.batch.persist-delay':
        this.persistDelayMs = duration();
        break;
      case 'dstl.dfs.batch.persist-size-threshold':
        this.persistSizeThreshold = memory();
        break;
      case 'dstl.dfs.upload.buffer-size':
        this.uploadBufferSize = memory();
        if (this.uploadBufferSize === 0 || this.uploadBufferSize > 2147483647) {
          throw invalid('a size from 1 byte to 2147483647 bytes');
        }
        break;
      case 'dstl.dfs.upload.num-threads':
        this.uploadThreads = positive();
        break;
      case 'dstl.dfs.discard.num-threads':
        this.discardThreads = positive();
        break;
      case 'dstl.dfs.upload.max-in-flight':
        this.maxInFlight = memory();
        break;
      case 'dstl.dfs.upload.retry-policy':
        if (value !== 'fixed' && value !== 'none') throw invalid('`fixed` or `none`');
        this.retryPolicy = value;
        break;
      case 'dstl.dfs.upload.timeout':
        this.uploadTimeoutMs = duration();
        break;
      case 'dstl.dfs.upload.max-attempts':
        this.maxAttempts = positive();
        break;
      case 'dstl.dfs.upload.next-attempt-delay':
        this.nextAttemptDelayMs = duration();
        break;
      case 'dstl.dfs.download.local-cache.idle-timeout-ms':
        this.cacheIdleTimeoutMs = duration();
        break;
      case 'dstl.job-id':
        if (!/^[0-9a-f]{32}$/.test(value)) throw invalid('32 lowercase hexadecimal characters');
        this.jobId = value;
        break;
      case 'dstl.local-recovery.enabled':
        this.localRecovery = boolean();
        break;
      case 'dstl.local-recovery.dir':
        if (value === '') throw invalid('a non-empty directory path');
        this.localDir = value;
        break;
      case 'dstl.writer.memory-limit':
        this.writerMemoryLimit = memory();
        if (this.writerMemoryLimit < 2 * 2 ** 20 || this.writerMemoryLimit > 4 * 2 ** 30) {
          throw invalid('a size from 2mb to 4gb');
        }
        break;
      case 'dstl.writer.max-writers':
        this.maxWriters = positive();
        break;
      case 'dstl.writer.call-timeout':
        this.writerCallTimeoutMs = duration();
        if (this.writerCallTimeoutMs < 1) throw invalid('a duration of at least 1 ms');
        break;
      default:
        if (short.startsWith('dstl.s3.')) {
          throw new ConfigError(`configuration key \`${key}\` is not supported by the Node host (it writes to local directories only)`);
        }
        throw new ConfigError(`unknown configuration key \`${key}\` (known: ${KEYS.join(', ')})`);
    }
  }

  /** Checks relations between keys (Flink's scheduler constructor check). */
  validate() {
    if (this.persistSizeThreshold > this.maxInFlight) {
      throw new ConfigError(
        `invalid value \`${this.persistSizeThreshold}\` for \`dstl.dfs.batch.persist-size-threshold\`: expected a size not above dstl.dfs.upload.max-in-flight`,
      );
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
