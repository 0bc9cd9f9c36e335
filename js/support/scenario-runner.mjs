// Runs one shared scenario (`tests/scenarios/*.json`, format in its README.md) through
// the Node host. The Rust twin is `tests/tests/shared_scenarios.rs`.

import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

import { ChangelogStorage, Config, DstlError, LocalStore, parseDuration, parseMemory, WriterError } from '../lib/index.mjs';
import { REPO_ROOT } from './repo.mjs';

export const SCENARIO_DIR = resolve(REPO_ROOT, 'tests', 'scenarios');
const JOB_ID = '000000000000002a466c696e6b416e63';
const HOSTS = new Set(['rust', 'node']);
const ERROR_KINDS = new Set(['closed', 'truncated', 'not-yet-appended', 'already-failed', 'invalid-range', 'invalid-argument', 'upload-failed', 'trapped', 'host-invalid-argument', 'storage-closed', 'read']);
const TOP_FIELDS = new Set(['name', 'description', 'spec', 'hosts', 'only_because', 'config', 'steps']);

/** Fields each operation takes (besides `op` and `expect`). */
const OPS = {
  create: ['writer', 'name', 'key_groups', 'memory_limit', 'call_timeout'],
  append: ['writer', 'key_group', 'value'],
  append_meta: ['writer', 'value'],
  append_batch: ['writer', 'key_groups', 'lengths', 'data', 'repeat'],
  next_sequence_number: ['writer', 'save', 'value'],
  initial_sequence_number: ['writer', 'value'],
  persist: ['writer', 'from', 'checkpoint', 'as', 'immediate'],
  await: ['persist', 'snapshot'],
  truncate: ['writer', 'to'],
  confirm: ['writer', 'from', 'to', 'checkpoint'],
  reset: ['writer', 'from', 'to', 'checkpoint'],
  truncate_and_close: ['writer', 'from'],
  close: ['writer'],
  drop: ['writer'],
  failure: ['writer', 'contains'],
  fail_uploads: ['times'],
  hang_uploads: ['times'],
  release_uploads: [],
  break_store: [],
  repair_store: [],
  close_storage: [],
  idle: [],
  check: ['uploads', 'upload_failures', 'files', 'files_are', 'exist', 'gone', 'tracked', 'local_files'],
  flag_byte: ['persist', 'value'],
  damage_file: ['persist', 'truncate_to', 'overwrite', 'remove'],
  read: ['persist'],
};
const SNAPSHOT_FIELDS = new Set(['changes', 'local_changes', 'entries', 'local_entries', 'state_size', 'incremental_size', 'storage_id', 'key_group_range', 'same_entries_as', 'same_file', 'distinct_files']);
const ERROR_FIELDS = new Set(['error', 'message', 'contains', 'starts_with', 'display_starts_with']);

/**
 * Parses and checks a scenario file: unknown fields, operations or error kinds are
 * errors, so no file is silently skipped or half-run.
 * @returns {object}
 */
export function loadScenario(path) {
  let scenario;
  try {
    scenario = JSON.parse(readFileSync(path, 'utf8'));
  } catch (e) {
    throw new Error(`scenario ${path} does not parse: ${e.message}`);
  }
  const where = (i) => `scenario ${path}, step ${i}`;
  for (const key of Object.keys(scenario)) if (!TOP_FIELDS.has(key)) throw new Error(`scenario ${path}: unknown field ${key}`);
  const stem = path.split('/').pop().replace(/\.json$/, '');
  if (scenario.name !== stem) throw new Error(`scenario ${path}: name ${scenario.name} differs from the file name`);
  if (!Array.isArray(scenario.hosts) || scenario.hosts.length === 0 || !scenario.hosts.every((h) => HOSTS.has(h))) {
    throw new Error(`scenario ${path}: hosts must list rust and/or node`);
  }
  if (scenario.hosts.length < 2 && !scenario.only_because) throw new Error(`scenario ${path}: a scenario for one host must say why (only_because)`);
  if (!Array.isArray(scenario.steps) || scenario.steps.length === 0) throw new Error(`scenario ${path}: no steps`);
  scenario.steps.forEach((step, i) => {
    const fields = OPS[step.op];
    if (!fields) throw new Error(`${where(i)}: unknown operation ${JSON.stringify(step.op)}`);
    for (const key of Object.keys(step)) {
      if (key !== 'op' && key !== 'expect' && !fields.includes(key)) throw new Error(`${where(i)}: unknown field ${key} of ${step.op}`);
    }
    if (step.expect) {
      for (const key of Object.keys(step.expect)) if (!ERROR_FIELDS.has(key)) throw new Error(`${where(i)}: unknown expect field ${key}`);
      if (!ERROR_KINDS.has(step.expect.error)) throw new Error(`${where(i)}: unknown error kind ${step.expect.error}`);
    }
    for (const key of Object.keys(step.snapshot ?? {})) if (!SNAPSHOT_FIELDS.has(key)) throw new Error(`${where(i)}: unknown snapshot field ${key}`);
  });
  return scenario;
}

/** @returns {string[]} every scenario file, sorted */
export function scenarioFiles() {
  return readdirSync(SCENARIO_DIR)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => join(SCENARIO_DIR, f));
}

/** A value of the scenario format as bytes. */
export function bytes(spec) {
  if (typeof spec === 'string') return Buffer.from(spec, 'utf8');
  if (spec && typeof spec.hex === 'string') return Buffer.from(spec.hex, 'hex');
  if (spec && Number.isInteger(spec.byte) && Number.isInteger(spec.len)) return Buffer.alloc(spec.len, spec.byte);
  if (spec && Number.isInteger(spec.pattern) && Number.isInteger(spec.len)) {
    const out = Buffer.alloc(spec.len);
    for (let j = 0; j < spec.len; j++) out[j] = (spec.pattern * 31 + j * 7) & 255;
    return out;
  }
  throw new Error(`not a value: ${JSON.stringify(spec)}`);
}

/** A local directory whose file creations fail or hang as the scenario says. */
class ScriptedStore extends LocalStore {
  constructor(dir) {
    super(dir);
    this.plan = [];
    this.broken = false;
    this.gate = null;
    this.openGate();
  }
  openGate() {
    this.gateOpen = true;
    this.gate?.resolve();
    let resolveGate;
    const promise = new Promise((r) => (resolveGate = r));
    this.gate = { promise, resolve: resolveGate };
  }
  closeGate() {
    this.gateOpen = false;
  }
  async createParts(name, parts) {
    if (this.broken) throw new Error('injected: the store is down');
    const fault = this.plan.shift();
    if (fault === 'fail') throw new Error('injected: transient failure');
    if (fault === 'hang') {
      while (!this.gateOpen) await this.gate.promise;
    }
    return super.createParts(name, parts);
  }
}

function number(spec, saved) {
  if (spec === 'max_u64') return (1n << 64n) - 1n;
  if (spec === 'max_i64') return (1n << 63n) - 1n;
  if (typeof spec === 'string' && spec.startsWith('$')) {
    if (!saved.has(spec.slice(1))) throw new Error(`no saved value ${spec}`);
    return saved.get(spec.slice(1));
  }
  if (Number.isInteger(spec)) return BigInt(spec);
  throw new Error(`not a number: ${JSON.stringify(spec)}`);
}

function texts(value) {
  return value === undefined ? [] : Array.isArray(value) ? value : [value];
}

function checkError(error, expect, what) {
  if (!(error instanceof DstlError)) throw new Error(`${what}: expected a ${expect.error} error, got ${error?.stack ?? error}`);
  assert.equal(error.kind, expect.error, `${what}: error kind (${error.message})`);
  const detail = error.detail ?? error.message;
  if (error instanceof WriterError) {
    // The typed WIT payload behind it, and the display every host prints around its words.
    assert.ok(error.fields !== null && typeof error.fields === 'object', `${what}: typed fields ${error.fields}`);
    assert.equal(error.message, `writer ${error.writer}: ${detail}`, `${what}: display`);
  }
  if (expect.message !== undefined) assert.equal(detail, expect.message, `${what}: message`);
  for (const text of texts(expect.contains)) assert.ok(detail.includes(text), `${what}: ${JSON.stringify(detail)} does not contain ${JSON.stringify(text)}`);
  if (expect.starts_with !== undefined) assert.ok(detail.startsWith(expect.starts_with), `${what}: ${JSON.stringify(detail)} does not start with ${JSON.stringify(expect.starts_with)}`);
  if (expect.display_starts_with !== undefined) {
    assert.ok(error.message.startsWith(expect.display_starts_with), `${what}: ${JSON.stringify(error.message)} does not start with ${JSON.stringify(expect.display_starts_with)}`);
  }
}

function changeList(changes) {
  return changes.map((c) => [c.keyGroup, Buffer.from(c.value).toString('hex')]);
}

function expectedChanges(spec) {
  return spec.map(([keyGroup, value]) => [keyGroup, bytes(value).toString('hex')]);
}

function paths(snapshot) {
  const all = snapshot.remote.entries.map((e) => e.handle.path);
  for (const e of snapshot.local?.entries ?? []) all.push(e.handle.path);
  return all;
}

function listDir(dir) {
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((n) => !n.startsWith('.'))
    .map((n) => join(dir, n))
    .sort();
}

/**
 * Runs a loaded scenario through the Node host.
 * @param {object} scenario
 */
export async function runScenario(scenario) {
  const base = mkdtempSync(join(tmpdir(), 'dstl-scenario-'));
  const config = new Config();
  config.set('dstl.dfs.base-path', base);
  config.set('dstl.job-id', JOB_ID);
  for (const [key, value] of Object.entries(scenario.config ?? {})) config.set(key, String(value));
  const store = new ScriptedStore((await LocalStore.open(config.jobDir())).dir);
  const storage = await ChangelogStorage.open(config, { store, logger: () => {} });
  const writers = new Map();
  const persists = new Map();
  const snapshots = new Map();
  const saved = new Map();
  const writer = (name) => {
    const w = writers.get(name);
    if (!w) throw new Error(`unknown writer ${name}`);
    return w;
  };
  const snapshot = (name) => {
    const s = snapshots.get(name);
    if (!s) throw new Error(`persist ${name} has not completed successfully`);
    return s;
  };
  try {
    for (const [i, step] of scenario.steps.entries()) {
      const what = `${scenario.name} step ${i} (${step.op})`;
      const run = async () => {
        switch (step.op) {
          case 'create': {
            const options = {};
            if (step.memory_limit !== undefined) options.memoryLimit = parseMemory(step.memory_limit);
            if (step.call_timeout !== undefined) options.callTimeoutMs = parseDuration(step.call_timeout);
            const [start, end] = step.key_groups ?? [0, 127];
            writers.set(step.writer, storage.createWriter(step.name ?? step.writer, { start, end }, options));
            return undefined;
          }
          case 'append':
            return writer(step.writer).append(step.key_group, bytes(step.value));
          case 'append_meta':
            return writer(step.writer).appendMeta(bytes(step.value));
          case 'append_batch': {
            if (step.repeat) {
              const { count, key_group: keyGroup, length, byte } = step.repeat;
              return writer(step.writer).appendBatch(new Int32Array(count).fill(keyGroup), new Uint32Array(count).fill(length), Buffer.alloc(count * length, byte));
            }
            return writer(step.writer).appendBatch(Int32Array.from(step.key_groups), Uint32Array.from(step.lengths), bytes(step.data));
          }
          case 'next_sequence_number':
          case 'initial_sequence_number': {
            const w = writer(step.writer);
            const value = step.op === 'next_sequence_number' ? w.nextSequenceNumber() : w.initialSequenceNumber();
            if (step.value !== undefined) assert.equal(value, BigInt(step.value), `${what}: sequence number`);
            if (step.save) saved.set(step.save, value);
            return value;
          }
          case 'persist': {
            const promise = writer(step.writer).persist(number(step.from, saved), number(step.checkpoint, saved));
            if (step.immediate !== undefined) assert.equal(promise.immediate, step.immediate, `${what}: immediate`);
            persists.set(step.as, promise);
            return undefined;
          }
          case 'await': {
            const promise = persists.get(step.persist);
            if (!promise) throw new Error(`unknown persist ${step.persist}`);
            const result = await promise;
            snapshots.set(step.persist, result);
            await checkSnapshot(storage, result, step.snapshot ?? {}, snapshots, what);
            return undefined;
          }
          case 'truncate':
            return writer(step.writer).truncate(number(step.to, saved));
          case 'confirm':
            return writer(step.writer).confirm(number(step.from, saved), number(step.to, saved), number(step.checkpoint, saved));
          case 'reset':
            return writer(step.writer).reset(number(step.from, saved), number(step.to, saved), number(step.checkpoint, saved));
          case 'truncate_and_close':
            return writer(step.writer).truncateAndClose(number(step.from, saved));
          case 'close':
            return writer(step.writer).close();
          case 'drop':
            writer(step.writer).dispose();
            writers.delete(step.writer);
            return undefined;
          case 'failure': {
            const failure = writer(step.writer).failure;
            assert.ok(failure, `${what}: the writer has not failed`);
            for (const text of texts(step.contains)) assert.ok(failure.includes(text), `${what}: ${failure} does not contain ${text}`);
            return undefined;
          }
          case 'fail_uploads':
            for (let n = 0; n < step.times; n++) store.plan.push('fail');
            return undefined;
          case 'hang_uploads':
            store.closeGate();
            for (let n = 0; n < step.times; n++) store.plan.push('hang');
            return undefined;
          case 'release_uploads':
            store.openGate();
            return undefined;
          case 'break_store':
            store.broken = true;
            return undefined;
          case 'repair_store':
            store.broken = false;
            return undefined;
          case 'close_storage':
            return storage.close();
          case 'idle':
            return storage.idle();
          case 'check':
            return check(storage, step, snapshot, what);
          case 'flag_byte': {
            const file = readFileSync(snapshot(step.persist).remote.entries[0].handle.path);
            assert.equal(file[0], step.value, `${what}: flag byte`);
            return undefined;
          }
          case 'damage_file': {
            const path = snapshot(step.persist).remote.entries[0].handle.path;
            if (step.remove === true) rmSync(path);
            else if (step.truncate_to !== undefined) truncateSync(path, step.truncate_to);
            else if (step.overwrite !== undefined) {
              const file = readFileSync(path);
              const value = bytes(step.overwrite.value);
              if (step.overwrite.at + value.length > file.length) throw new Error(`${what}: overwrite at ${step.overwrite.at} runs past the file's end`);
              value.copy(file, step.overwrite.at);
              writeFileSync(path, file);
            } else throw new Error(`${what}: damage_file needs remove, truncate_to or overwrite`);
            return undefined;
          }
          case 'read':
            return storage.read(snapshot(step.persist).remote);
          default:
            throw new Error(`${what}: unknown operation`);
        }
      };
      let outcome;
      try {
        outcome = { value: await run() };
      } catch (error) {
        outcome = { error };
      }
      if (step.expect) {
        if (!('error' in outcome)) throw new Error(`${what}: expected a ${step.expect.error} error, but it succeeded`);
        // `{file}` in an expected text: the first file of the step's persist.
        const file = snapshots.get(step.persist)?.remote.entries[0]?.handle.path;
        const expect = JSON.parse(JSON.stringify(step.expect), (_, v) => (typeof v === 'string' && file ? v.replaceAll('{file}', file) : v));
        checkError(outcome.error, expect, what);
      } else if ('error' in outcome) {
        const e = outcome.error;
        if (e instanceof assert.AssertionError) throw e;
        throw new Error(`${what}: unexpected error: ${e?.stack ?? e}`);
      }
    }
  } finally {
    store.openGate();
    for (const w of writers.values()) w.dispose();
    await storage.close();
    rmSync(base, { recursive: true, force: true });
  }
}

async function checkSnapshot(storage, result, expect, snapshots, what) {
  const remote = result.remote;
  if (expect.entries !== undefined) assert.equal(remote.entries.length, expect.entries, `${what}: entries`);
  if (expect.state_size !== undefined) assert.equal(remote.stateSize, BigInt(expect.state_size), `${what}: state size`);
  if (expect.incremental_size !== undefined) assert.equal(remote.incrementalSize, BigInt(expect.incremental_size), `${what}: incremental size`);
  if (expect.storage_id !== undefined) assert.equal(remote.storageId, expect.storage_id, `${what}: storage id`);
  if (expect.key_group_range !== undefined) assert.deepEqual([remote.keyGroupRange.start, remote.keyGroupRange.end], expect.key_group_range, `${what}: key-group range`);
  if (expect.local_entries !== undefined) {
    assert.equal(result.local ? result.local.entries.length : null, expect.local_entries, `${what}: local entries`);
  }
  if (expect.changes !== undefined) assert.deepEqual(changeList(await storage.read(remote)), expectedChanges(expect.changes), `${what}: changes`);
  if (expect.local_changes !== undefined) {
    assert.ok(result.local, `${what}: no local handle`);
    assert.deepEqual(changeList(await storage.read(result.local)), expectedChanges(expect.local_changes), `${what}: local changes`);
  }
  const entryKey = (e) => `${e.handle.path}@${e.offset}+${e.size}/${e.handle.fileSize}`;
  if (expect.same_entries_as !== undefined) {
    const other = snapshots.get(expect.same_entries_as);
    assert.ok(other, `${what}: ${expect.same_entries_as} has no snapshot`);
    assert.deepEqual(remote.entries.map(entryKey), other.remote.entries.map(entryKey), `${what}: same entries`);
  }
  const files = new Set(remote.entries.map((e) => e.handle.path));
  if (expect.same_file !== undefined) {
    const other = snapshots.get(expect.same_file);
    assert.ok(other, `${what}: ${expect.same_file} has no snapshot`);
    for (const e of other.remote.entries) files.add(e.handle.path);
    assert.equal(files.size, 1, `${what}: one file for both snapshots`);
  }
  if (expect.distinct_files !== undefined) assert.equal(new Set(remote.entries.map((e) => e.handle.path)).size, expect.distinct_files, `${what}: distinct files`);
}

async function check(storage, step, snapshot, what) {
  await storage.idle();
  const metrics = storage.metrics();
  if (step.uploads !== undefined) assert.equal(metrics.upload_requests, step.uploads, `${what}: upload attempts`);
  if (step.upload_failures !== undefined) assert.equal(metrics.upload_failures, step.upload_failures, `${what}: failed attempts`);
  const files = listDir(storage.config.jobDir());
  if (step.files !== undefined) assert.equal(files.length, step.files, `${what}: files in the job directory: ${files.join(', ')}`);
  if (step.files_are !== undefined) {
    const expected = [...new Set(step.files_are.flatMap((name) => snapshot(name).remote.entries.map((e) => e.handle.path)))].sort();
    assert.deepEqual(files, expected, `${what}: files in the job directory`);
  }
  for (const name of step.exist ?? []) for (const path of paths(snapshot(name))) assert.ok(existsSync(path), `${what}: ${path} of ${name} was deleted`);
  for (const name of step.gone ?? []) for (const path of paths(snapshot(name))) assert.ok(!existsSync(path), `${what}: ${path} of ${name} is still there`);
  if (step.tracked !== undefined) assert.equal(storage.ownership.tracked(), step.tracked, `${what}: tracked files`);
  if (step.local_files !== undefined) {
    assert.equal(listDir(storage.config.localCopiesDir()).length, step.local_files, `${what}: local copies`);
  }
}
