// The Node host's own parts, against the real component: the file format through the
// component's own codec (a dedicated instance, inline and on worker threads), the store's
// file writing, configuration, argument validation, the mailbox, the in-flight limit,
// trap isolation details, and the jco patches.

import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
  ChangelogStorage,
  ComponentCodec,
  Config,
  ConfigError,
  FormatError,
  InvalidArgumentError,
  KEYS,
  LocalStore,
  TrappedError,
  WriterError,
  capMemory,
  loadComponent,
  parseDuration,
  parseMemory,
  readHandle,
} from '../lib/index.mjs';
import { CodecPool } from '../lib/codec-pool.mjs';
import { createDirsDurably } from '../lib/store.mjs';

const RANGE = { start: 0, end: 127 };
const dirs = [];
function tempDir() {
  const dir = mkdtempSync(join(tmpdir(), 'dstl-node-'));
  dirs.push(dir);
  return dir;
}
after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

async function open(settings = {}, options = {}) {
  return ChangelogStorage.open({ 'dstl.dfs.base-path': tempDir(), ...settings }, { logger: () => {}, ...options });
}

/** The component's codec in an instance of its own. */
let codec;
before(async () => {
  codec = await ComponentCodec.open();
});

describe('codec', () => {
  test('files encoded by the component read back through it, plain and Snappy-framed', () => {
    const text = Buffer.from('the quick brown fox jumps over the lazy dog; '.repeat(5000));
    // A change set of one change (an empty value list: a change set of no groups).
    const changeSet = (keyGroup, value) => {
      if (!value) return Buffer.alloc(4);
      const head = Buffer.alloc(16);
      head.writeInt32BE(1, 0);
      head.writeInt32BE(1, 4);
      head.writeInt32BE(keyGroup, 8);
      head.writeInt32BE(value.length, 12);
      return Buffer.concat([head, value]);
    };
    for (const compression of [false, true]) {
      for (const values of [[], [null], [randomBytes(100)], [text], [randomBytes(200_000), text], [text, randomBytes(70_000), text]]) {
        const blocks = values.map((value, i) => changeSet(i, value));
        const file = codec.encodeFile(blocks, compression);
        const logical = Buffer.concat(blocks);
        assert.equal(file.bytes[0], compression ? 1 : 0, 'the flag byte');
        assert.equal(file.logicalSize, BigInt(logical.length));
        let offset = 0n;
        assert.deepEqual([...file.offsets], blocks.map((b) => ((offset += BigInt(b.length)), offset - BigInt(b.length))));
        if (!compression) assert.deepEqual(Buffer.from(file.bytes), Buffer.concat([Buffer.from([0]), logical]));
        const sets = codec.readFile('f', { tag: 'ok', val: file.bytes }, file.logicalSize, [...file.offsets]);
        assert.deepEqual(
          sets.map((set) => set.map((c) => [c.keyGroup, Buffer.from(c.value)])),
          values.map((value, i) => (value ? [[i, value]] : [])),
        );
        if (compression && values.length === 1 && values[0] === text) {
          assert.ok(file.bytes.length < logical.length / 4, `compressible data shrinks (${file.bytes.length} of ${logical.length})`);
        }
      }
    }
  });

  test('the plain layout: its header and the blocks as they are make the file encode-file makes', () => {
    for (const blocks of [[], [Buffer.alloc(0)], [randomBytes(100)], [randomBytes(200_000), randomBytes(3), randomBytes(70_000)]]) {
      const layout = codec.layoutPlainFile(blocks.map((b) => b.length));
      const file = codec.encodeFile(blocks, false);
      assert.deepEqual(Buffer.concat([layout.header, ...blocks]), Buffer.from(file.bytes));
      assert.deepEqual([...layout.offsets], [...file.offsets]);
      assert.equal(layout.logicalSize, file.logicalSize);
    }
  });

  test('an empty compressed file is the flag byte and the stream identifier, as Flink writes it', () => {
    assert.deepEqual([...codec.encodeFile([], true).bytes], [1, 0xff, 6, 0, 0, 0x73, 0x4e, 0x61, 0x50, 0x70, 0x59]);
    assert.deepEqual([...codec.encodeFile([], false).bytes], [0]);
  });

  test('a hand-assembled file of two change sets decodes key group by key group, metadata first', () => {
    const plain = Buffer.from([
      0x00, 0, 0, 0, 3, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0x4d, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0xaa,
      0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 2, 1, 2, 0, 0, 0, 1, 3, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 2, 0xbb, 0xcc,
    ]);
    const sets = codec.readFile('hand', { tag: 'ok', val: plain }, BigInt(plain.length - 1), [49n, 0n]);
    const decoded = sets.map((set) => set.map((c) => [c.keyGroup, [...c.value]]));
    assert.deepEqual(decoded, [[[7, [0xbb, 0xcc]]], [[-1, [0x4d]], [2, [0xaa]], [5, [1, 2]], [5, [3]]]]);
  });

  test("damaged, short and unreadable files fail with the reader's messages, naming the file and offset", () => {
    const block = Buffer.from([0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 4, 1, 2, 3, 4]);
    const plain = (logical) => ({ tag: 'ok', val: Buffer.concat([Buffer.from([0]), logical]) });
    const corrupt = 'corrupt changelog file f at logical offset';
    const cases = [
      [plain(block.subarray(0, 18)), 18n, 0n, `${corrupt} 0: truncated change set at logical position 16: need 4 more bytes, 2 left`],
      [plain(block.subarray(0, 3)), 3n, 0n, `${corrupt} 0: truncated change set at logical position 0: need 4 more bytes, 3 left`],
      [plain(Buffer.from([0x7f, 0, 0, 0])), 4n, 0n, `${corrupt} 0: invalid group count 2130706432 at logical position 0`],
      [plain(Buffer.concat([block.subarray(0, 12), Buffer.from([0xff, 0xff, 0xff, 0xfe])])), 16n, 0n, `${corrupt} 0: invalid value length -2 at logical position 12`],
      [plain(block), 20n, 21n, `${corrupt} 21: offset 21 is beyond the logical length 20`],
      [plain(block), 21n, 0n, 'changelog file f has 20 logical bytes but the handle records 21: the file was truncated or replaced'],
      [{ tag: 'ok', val: Buffer.from([7]) }, 0n, 0n, `${corrupt} 0: unknown compression flag 0x07 (expected 0x00 or 0x01)`],
      [{ tag: 'ok', val: Buffer.alloc(0) }, 0n, 0n, `${corrupt} 0: empty file: no compression flag byte`],
      [{ tag: 'err', val: 'ENOENT: gone' }, 0n, 0n, 'cannot read changelog file f: ENOENT: gone'],
    ];
    for (const [file, size, offset, message] of cases) {
      assert.throws(() => codec.readFile('f', file, size, [offset]), (e) => e instanceof FormatError && e.message === message, message);
    }
    const snappy = { tag: 'ok', val: Buffer.from([1, 0xff, 6, 0, 0, 1, 2, 3, 4, 5, 6]) };
    assert.throws(() => codec.readFile('f', snappy, 0n, []), (e) => e instanceof FormatError && e.message.startsWith(`${corrupt} 0: corrupt snappy framed stream: `));
    // The instance is still usable after errors.
    assert.deepEqual(codec.readFile('f', plain(block), 20n, [0n]).map((set) => set.map((c) => [c.keyGroup, [...c.value]])), [[[3, [1, 2, 3, 4]]]]);
  });

  test('large batches are encoded on worker threads into the same bytes; an instance whose memory grew is replaced', async () => {
    const pool = new CodecPool(codec, 2);
    try {
      const text = Buffer.from('0123456789abcdef'.repeat(64));
      const blocks = Array.from({ length: 12 }, (_, i) => Buffer.concat([randomBytes(30_000), text, Buffer.alloc(i * 1000, i)]));
      for (const compression of [false, true]) {
        const inline = codec.encodeFile(blocks, compression);
        // Owned copies (moved to a worker) and views into one shared buffer (copied).
        const owned = blocks.map((b) => Uint8Array.from(b));
        const shared = Buffer.concat(blocks);
        let at = 0;
        const views = blocks.map((b) => shared.subarray(at, (at += b.length)));
        const [a, b] = await Promise.all([pool.encode(owned, compression), pool.encode(views, compression)]);
        for (const file of [a, b]) {
          assert.deepEqual(Buffer.from(file.bytes), Buffer.from(inline.bytes));
          assert.deepEqual([...file.offsets], [...inline.offsets]);
          assert.equal(file.logicalSize, inline.logicalSize);
        }
        assert.deepEqual(Buffer.from(views[3]), blocks[3], 'views into a shared buffer are left alone');
      }
      assert.ok(pool.all.length >= 1 && pool.all.length <= 2);
      // 80 MiB of blocks grow the codec's memory past what it keeps: the next call gets a
      // fresh instance, which works as well.
      const huge = codec.encodeFile([Buffer.alloc(80 << 20, 1)], false);
      assert.equal(huge.bytes.length, (80 << 20) + 1);
      assert.equal(codec.live, null);
      assert.deepEqual([...codec.encodeFile([Buffer.from([1, 2])], false).bytes], [0, 1, 2]);
    } finally {
      await pool.close();
    }
  });
});

describe('store', () => {
  test('a file appears whole under its name, never overwrites, and leaves no staging file', async () => {
    const store = await LocalStore.open(join(tempDir(), 'a', 'b'));
    const path = await store.createParts('f', [Buffer.from('hel'), Buffer.from('lo')]);
    assert.equal(readFileSync(path, 'utf8'), 'hello');
    await assert.rejects(store.createParts('f', [Buffer.from('other')]), { code: 'EEXIST' });
    assert.equal(readFileSync(path, 'utf8'), 'hello');
    assert.deepEqual(readdirSync(store.dir), ['f']);
    await store.delete(path);
    await store.delete(path);
    const outside = join(store.dir, '..', 'escape');
    writeFileSync(outside, 'x');
    for (const bad of [outside, '/etc/passwd', `${store.dir}/../escape`]) {
      await assert.rejects(store.delete(bad), /is not a file of the store/);
    }
    assert.ok(existsSync(outside));
  });

  test('concurrent creates of one name do not share a staging file: exactly one wins, whole', async () => {
    const store = await LocalStore.open(tempDir());
    const contents = Array.from({ length: 8 }, (_, i) => Buffer.alloc(1 << 20, i));
    const results = await Promise.allSettled(contents.map((c) => store.createParts('same', [c])));
    const won = results.filter((r) => r.status === 'fulfilled');
    assert.equal(won.length, 1, JSON.stringify(results.map((r) => r.reason?.code ?? 'ok')));
    for (const r of results.filter((r) => r.status === 'rejected')) {
      assert.equal(r.reason.code, 'EEXIST');
    }
    const bytes = readFileSync(won[0].value);
    assert.ok(contents.some((c) => c.equals(bytes)), 'the winner is one whole content');
    assert.deepEqual(readdirSync(store.dir), ['same']);
  });

  test('open creates the missing directories and makes each durable in its parent', async () => {
    const base = tempDir();
    const dir = join(base, 'x', 'y', 'z');
    assert.deepEqual(await createDirsDurably(dir), [join(base, 'x'), join(base, 'x', 'y'), dir]);
    assert.deepEqual(await createDirsDurably(dir), []);
    const store = await LocalStore.open(join(dir, 'w'));
    assert.ok(existsSync(store.dir));
  });
});

describe('lease', () => {
  test('an open storage holds a lease on its job that `dstl gc` honours; close removes it', async () => {
    const base = tempDir();
    const storage = await ChangelogStorage.open({ 'dstl.dfs.base-path': base });
    const dir = join(base, storage.config.jobId, 'leases');
    const names = readdirSync(dir);
    assert.equal(names.length, 1);
    assert.match(names[0], /^[0-9a-f-]{36}\.lease$/);
    const record = JSON.parse(readFileSync(join(dir, names[0]), 'utf8'));
    assert.equal(record.pid, process.pid);
    assert.equal(record.expires_after_ms, 600000);
    assert.ok(Math.abs(record.opened_ms - Date.now()) < 60000);
    await storage.close();
    assert.ok(!existsSync(dir));
  });
});

describe('configuration', () => {
  test('keys, prefixes and Flink value syntax as the Rust host', () => {
    const config = Config.from({
      'state.changelog.dstl.dfs.preemptive-persist-threshold': '10 mb',
      'dstl.dfs.batch.persist-delay': '2min',
      'dstl.dfs.upload.timeout': '250',
      'dstl.dfs.compression.enabled': 'TRUE',
    });
    assert.equal(config.preemptivePersistThreshold, 10 * 2 ** 20);
    assert.equal(config.persistDelayMs, 120_000);
    assert.equal(config.uploadTimeoutMs, 250);
    assert.equal(config.compression, true);
  });

  test('bad keys and values are rejected naming the key and the accepted form', () => {
    assert.throws(() => Config.from({ 'dstl.dfs.nope': '1' }), (e) => e instanceof ConfigError && e.message.includes('unknown configuration key `dstl.dfs.nope`'));
    assert.throws(() => Config.from({ 'dstl.dfs.upload.timeout': 'soon' }), { message: 'invalid value `soon` for `dstl.dfs.upload.timeout`: expected a duration of at most 1 d, such as `10 ms`, `1 s`, `2min` (no unit means ms)' });
    assert.throws(() => Config.from({ 'dstl.job-id': 'XYZ' }), /32 lowercase hexadecimal characters/);
    assert.throws(() => Config.from({ 'dstl.s3.endpoint': 'http://x' }), /not supported by the Node host/);
    assert.throws(() => Config.from({ 'dstl.writer.memory-limit': '1mb' }), /from 2mb to 4gb/);
    const config = Config.from({ 'dstl.dfs.batch.persist-size-threshold': '200mb' });
    assert.throws(() => config.validate(), /not above dstl.dfs.upload.max-in-flight/);
    // Keys of the wasmtime host the Node host does not implement, and sizes a number cannot count.
    assert.throws(() => Config.from({ 'dstl.dfs.local.fsync': 'false' }), /`dstl.dfs.local.fsync` is not supported by the Node host/);
    assert.throws(() => Config.from({ 'dstl.dfs.base-path': 's3://bucket/x' }), /local directories only/);
    assert.throws(() => Config.from({ 'dstl.dfs.upload.max-in-flight': '16384tb' }), /exceed what the Node host counts exactly/);
  });

  test('the keys, defaults and messages are the Rust host\'s (dstl-proto\'s settings, through the rules component)', () => {
    const source = readFileSync(new URL('../../proto/src/settings.rs', import.meta.url), 'utf8');
    // Every key the Node host implements is one of the shared keys.
    for (const key of KEYS) assert.ok(source.includes(`"${key}"`), `${key} is a key of proto/src/settings.rs`);
    // The defaults come from there: Flink's where Flink has the key.
    const config = new Config();
    assert.deepEqual(
      [config.preemptivePersistThreshold, config.persistDelayMs, config.persistSizeThreshold, config.maxInFlight, config.uploadTimeoutMs, config.maxAttempts, config.retryPolicy],
      [5 * 2 ** 20, 10, 10 * 2 ** 20, 100 * 2 ** 20, 1000, 3, 'fixed'],
    );
    assert.match(config.jobId, /^[0-9a-f]{32}$/);
    assert.equal(config.localDir, null);
    assert.equal(parseMemory('16 kib'), 16384);
    assert.equal(parseDuration('500us'), 0.5, 'fractions of a millisecond stay');
    assert.equal(parseDuration('2 min'), 120_000);
    assert.equal(parseMemory('many'), null);
  });
});

describe('the JS API', () => {
  test('bad arguments are typed errors naming the value, never a silent empty value', async () => {
    const storage = await open();
    const w = storage.createWriter('op', RANGE);
    assert.throws(() => w.append(1, 'a string'), (e) => e instanceof InvalidArgumentError && e.message === 'value must be a Uint8Array (or Buffer), got the string "a string"');
    assert.throws(() => w.append('1', Buffer.from('x')), /key group must be a 32-bit integer, got the string "1"/);
    assert.throws(() => w.append(1.5, Buffer.from('x')), /key group must be a 32-bit integer, got number 1.5/);
    assert.throws(() => w.appendMeta([1, 2]), /value must be a Uint8Array/);
    assert.throws(() => w.persist(-1, 1), /from must be an unsigned 64-bit integer/);
    assert.throws(() => w.persist(2 ** 60, 1), /from must be an unsigned 64-bit integer/);
    assert.throws(() => w.truncate(1n << 64n), /to must be an unsigned 64-bit integer/);
    assert.throws(() => w.confirm(0n, 0n, 1n << 63n), /checkpoint must be a signed 64-bit integer/);
    assert.throws(() => w.appendBatch([1], [1.5], Buffer.from('x')), /length \[0\] must be an unsigned 32-bit integer/);
    assert.throws(() => storage.createWriter('op', { start: '0', end: 5 }), /invalid key-group range/);
    assert.throws(() => storage.createWriter('op', RANGE, { memoryLimit: 2 ** 40 }), /exceeds the storage's dstl.writer.memory-limit/);
    // The writer rules are dstl-proto's, as the Rust host applies them (in its words).
    assert.throws(
      () => storage.createWriter('op', RANGE, { memoryLimit: 2 ** 20 }),
      (e) => e.kind === 'host-invalid-argument' && e.message === 'memory limit 1048576 of writer op is below 2 MiB (2097152 bytes), the least a writer starts with',
    );
    assert.throws(
      () => storage.createWriter('op', RANGE, { callTimeoutMs: 0.5 }),
      (e) => e.kind === 'host-invalid-argument' && e.message === 'call timeout 500µs of writer op is below 1 ms',
    );
    assert.throws(() => storage.createWriter(7, RANGE), (e) => e.kind === 'host-invalid-argument' && /must be a string, got number/.test(e.message));
    assert.throws(() => storage.createWriter('x'.repeat(257), RANGE), /invalid writer name/);
    // Numbers and BigInts both work; sequence numbers come back as BigInts.
    w.append(1, Buffer.from('x'));
    assert.equal(w.nextSequenceNumber(), 1n);
    const snapshot = await w.persist(0, 1);
    assert.equal(snapshot.remote.stateSize, 1n);
    w.confirm(0, 1n, 1);
    w.close();
    await storage.close();
  });

  test('an unobserved persist that fails never crashes the process', async () => {
    const storage = await open({ 'dstl.dfs.batch.persist-delay': '1h' });
    const w = storage.createWriter('op', RANGE);
    w.append(1, Buffer.from('x'));
    w.persist(0, 1); // never awaited
    w.close(); // rejects it with `closed`
    await storage.close();
    await new Promise((r) => setTimeout(r, 20));
  });

  test('dispose drops the sandbox: pending persists reject, later calls fail with closed, late uploads are released', async () => {
    const storage = await open();
    const w = storage.createWriter('op', RANGE);
    w.append(1, Buffer.from('x'));
    const pending = w.persist(0, 1);
    w.dispose();
    // Typed: the WIT `closed(dropped)`, in the component's words (`errors.describe`).
    await assert.rejects(pending, (e) => {
      assert.ok(e instanceof WriterError);
      assert.equal(e.kind, 'closed');
      assert.deepEqual(e.fields, { tag: 'dropped' });
      assert.equal(e.detail, 'the writer was dropped');
      assert.equal(e.message, 'writer op: the writer was dropped');
      return true;
    });
    assert.throws(() => w.append(1, Buffer.from('y')), (e) => e.kind === 'closed' && e.fields.tag === 'dropped' && e.message === 'writer op: the writer was dropped');
    await storage.idle();
    assert.deepEqual(readdirSync(storage.config.jobDir()), []);
    assert.equal(storage.ownership.tracked(), 0);
    await storage.close();
  });

  test('writer errors carry the typed WIT payload; their words are the component\'s errors.describe', async () => {
    const storage = await open();
    const w = storage.createWriter('op', { start: 0, end: 7 });
    const typed = (kind, fields, detail) => (e) => {
      assert.ok(e instanceof WriterError, `${e?.stack ?? e}`);
      assert.equal(e.kind, kind);
      assert.deepEqual(e.fields, fields);
      assert.deepEqual(e.value, { tag: kind, val: fields });
      assert.equal(e.detail, detail);
      assert.equal(e.message, `writer op: ${detail}`);
      return true;
    };
    assert.throws(() => w.persist(5, 1), typed('not-yet-appended', { requested: 5n, appended: 0n }, 'Requested changes were not yet appended (requested: 5, appended: 0)'));
    assert.throws(
      () => w.append(8, Buffer.from('x')),
      typed('invalid-argument', { tag: 'outside-range', val: { keyGroup: 8, range: { start: 0, end: 7 } } }, "key group 8 is outside the writer's key-group range [0, 7]"),
    );
    assert.throws(() => w.truncate(3), typed('invalid-argument', { tag: 'truncate-beyond', val: { to: 3n, active: 0n } }, 'Cannot truncate to 3: it is beyond the active sequence number 0'));
    w.close();
    assert.throws(() => w.append(1, Buffer.from('x')), typed('closed', { tag: 'after-close', val: 'append' }, 'append after the writer was closed'));
    assert.throws(() => w.close(), typed('closed', { tag: 'after-close', val: 'close' }, 'close after the writer was closed'));
    // What the host words itself goes through the same export: a value longer than the
    // format holds (never copied into the sandbox) is `invalid-argument(value-too-long)`.
    const tooLong = { tag: 'invalid-argument', val: { tag: 'value-too-long', val: 2n ** 31n } };
    assert.equal(storage.codec.describeError(tooLong), "value of 2147483648 bytes exceeds the format's limit of 2147483647 bytes");
    await storage.close();
  });

  test('a task the closed storage refuses is the typed refusal storage-closed; a failing scheduler fails its writer alone', async () => {
    const storage = await open();
    const w = storage.createWriter('w', RANGE);
    w.append(0, Buffer.from('late'));
    const broken = storage.createWriter('broken', RANGE);
    broken.append(0, Buffer.from('x'));
    const submit = storage.scheduler.submit;
    storage.scheduler.submit = () => {
      throw new Error('injected scheduler defect');
    };
    // Not a refusal: the writer fails as a trapped one (the Rust host's panic), with the cause.
    assert.throws(() => broken.persist(0, 1), (e) => e instanceof TrappedError && e.detail.includes("the host's schedule import failed: injected scheduler defect"));
    assert.throws(() => broken.append(1, Buffer.from('y')), TrappedError);
    storage.scheduler.submit = submit;
    await storage.close();
    assert.throws(
      () => w.persist(0, 1),
      (e) =>
        e instanceof WriterError &&
        e.kind === 'upload-failed' &&
        e.fields.tag === 'refused' &&
        e.fields.val.refusal === 'storage-closed' &&
        Array.from(e.fields.val.changeSets).join() === '0' &&
        e.message === 'writer w: the uploader refused change sets [0]: the changelog storage is closed',
    );
  });

  test('upload outcomes are delivered after the call that scheduled them returns', async () => {
    const storage = await open({ 'dstl.dfs.batch.persist-delay': '0', 'dstl.dfs.preemptive-persist-threshold': '10b' });
    const w = storage.createWriter('op', RANGE);
    let settled = false;
    const p = w.persist(0, 1);
    p.then(() => (settled = true));
    w.append(1, Buffer.alloc(20)); // pre-emptive persist: schedules inside the guest call
    assert.equal(settled, false);
    w.append(1, Buffer.alloc(20));
    const snapshot = await w.persist(0, 2);
    assert.equal(snapshot.remote.entries.length, 2);
    w.close();
    await storage.close();
  });
});

describe('in-flight limit', () => {
  test('availability goes off while bytes in flight reach the limit, and back on when they land', async () => {
    let release;
    const gate = new Promise((r) => (release = r));
    const dir = tempDir();
    const config = Config.from({ 'dstl.dfs.base-path': dir, 'dstl.dfs.upload.max-in-flight': '1kb', 'dstl.dfs.batch.persist-size-threshold': '1kb', 'dstl.dfs.batch.persist-delay': '0', 'dstl.dfs.upload.timeout': '0' });
    const inner = await LocalStore.open(config.jobDir());
    const store = Object.assign(Object.create(inner), {
      createParts: async (name, parts) => {
        await gate;
        return inner.createParts(name, parts);
      },
    });
    const storage = await ChangelogStorage.open(config, { store, logger: () => {} });
    const w = storage.createWriter('op', RANGE);
    assert.equal(storage.isAvailable(), true);
    w.append(1, Buffer.alloc(2000));
    const p = w.persist(0, 1);
    assert.equal(storage.isAvailable(), false, 'an upload of 2000 bytes is in flight');
    let admitted = false;
    const admission = storage.available().then(() => (admitted = true));
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(admitted, false);
    release();
    await p;
    await admission;
    assert.equal(storage.isAvailable(), true);
    assert.equal(storage.metrics().bytes_in_flight, 0);
    w.close();
    await storage.close();
  });
});

describe('sandboxes', () => {
  test('the memory cap is part of the compiled module', () => {
    // (module (memory 1)) and (module (memory 1 100)), capped at 3 pages.
    const head = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
    const capped = capMemory(Uint8Array.from([...head, 5, 3, 1, 0x00, 1]), 3);
    assert.deepEqual([...capped.subarray(8)], [5, 4, 1, 0x01, 1, 3]);
    const lower = capMemory(Uint8Array.from([...head, 5, 4, 1, 0x01, 1, 2]), 3);
    assert.deepEqual([...lower.subarray(8)], [5, 4, 1, 0x01, 1, 2]);
    const memory = new WebAssembly.Instance(new WebAssembly.Module(Uint8Array.from([...head, 5, 3, 1, 0, 1, 7, 5, 1, 1, 0x6d, 2, 0]))).exports;
    assert.ok(memory);
    assert.throws(() => capMemory(Uint8Array.from([...head, 5, 3, 1, 0x00, 9]), 3), /above the memory limit/);
  });

  test('a trap names the writer, keeps its cause, and the next writers start in well under 15 ms each', async () => {
    const storage = await open();
    const doomed = storage.createWriter('doomed', RANGE, { memoryLimit: 2 << 20 });
    assert.throws(() => doomed.append(2, new Uint8Array(4 << 20)), (e) => e instanceof TrappedError && e.writer === 'doomed' && /memory/.test(e.detail));
    assert.match(doomed.failure, /memory/);
    const started = performance.now();
    const writers = [];
    for (let i = 0; i < 20; i++) writers.push(storage.createWriter(`op-${i}`, RANGE));
    const perWriter = (performance.now() - started) / 20;
    assert.ok(perWriter < 15, `a new writer took ${perWriter.toFixed(2)} ms (about 30 ms without the patch of jco's WebAssembly.promising probes)`);
    for (const w of writers) w.close();
    await storage.close();
  });

  test('jco output is patched: no env read per call, no WebAssembly.promising probe per instance', async () => {
    const component = await loadComponent();
    const code = readFileSync(join(component.dir, 'dstl_guest.js'), 'utf8');
    assert.ok(!code.includes('globalThis?.process?.env?.JCO_DEBUG) { return; }'));
    assert.ok(!code.includes('WebAssembly.promising(exports'));
    assert.ok(code.includes('_dstlPromising('));
  });
});

describe('recovery', () => {
  test('a read fetches at most four files at once, decodes in handle order, and the first damaged file in handle order names the error', async () => {
    // Ten one-change files, built by the component's codec.
    const block = (keyGroup) => Buffer.from([0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, keyGroup, 0, 0, 0, 1, keyGroup]);
    const files = new Map();
    for (let i = 0; i < 10; i++) files.set(`f${i}`, codec.encodeFile([block(i)], i % 2 === 1));
    const handle = { entries: [...files.keys()].reverse().map((path) => ({ handle: { path, fileSize: files.get(path).logicalSize }, offset: 0n })) };
    let inFlight = 0;
    let most = 0;
    const read = (broken) => async (path) => {
      inFlight++;
      most = Math.max(most, inFlight);
      await new Promise((resolve) => setTimeout(resolve, 2));
      inFlight--;
      if (broken.has(path)) throw new Error(`ENOENT: ${path}`);
      return files.get(path).bytes;
    };
    const changes = await readHandle(handle, read(new Set()), codec);
    assert.deepEqual(changes.map((c) => c.keyGroup), [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
    assert.equal(most, 4);
    await assert.rejects(readHandle(handle, read(new Set(['f2', 'f6'])), codec), { name: 'ReadError', message: 'cannot read changelog file f6: ENOENT: f6' });
  });

  test('unreadable, replaced and damaged files are read errors naming the file and offset', async () => {
    const storage = await open();
    const w = storage.createWriter('op', RANGE);
    w.append(3, Buffer.from('payload'));
    const snapshot = await w.persist(0, 1);
    const path = snapshot.remote.entries[0].handle.path;
    const good = readFileSync(path);
    assert.equal((await storage.read(snapshot.remote)).length, 1);
    const handle = (overrides) => ({ entries: [{ ...snapshot.remote.entries[0], ...overrides }] });
    await assert.rejects(storage.read(handle({ handle: { path: `${path}-missing`, fileSize: 19n } })), (e) => e.kind === 'read' && e.message.startsWith(`cannot read changelog file ${path}-missing`));
    await assert.rejects(storage.read(handle({ offset: 99n })), /changelog file .* has 23 logical bytes but the handle records|offset 99 is beyond/);
    writeFileSync(path, good.subarray(0, good.length - 2));
    await assert.rejects(storage.read(snapshot.remote), (e) => e.kind === 'read' && e.message.includes('the file was truncated or replaced'));
    writeFileSync(path, Buffer.concat([Buffer.from([9]), good.subarray(1)]));
    await assert.rejects(storage.read(snapshot.remote), /corrupt changelog file .* at logical offset 0: unknown compression flag 0x09/);
    w.close();
    await storage.close();
  });

  test('manifests round-trip into handles; a bad manifest is a read error', async () => {
    const { manifestJson, storeManifest, loadManifest } = await import('../lib/index.mjs');
    const storage = await open({ 'dstl.local-recovery.enabled': 'true' });
    const w = storage.createWriter('op', RANGE);
    w.append(3, Buffer.from('payload'));
    const snapshot = await w.persist(0, 1);
    const path = join(tempDir(), 'op.json');
    await storeManifest(path, snapshot, { writer: 'op', checkpointId: 1n, changes: [0, 1] });
    const text = readFileSync(path, 'utf8');
    assert.equal(text, manifestJson(snapshot, { writer: 'op', checkpointId: 1, changes: [0n, 1n] }));
    assert.deepEqual(Object.keys(JSON.parse(text)), [
      'storage_id',
      'key_group_range',
      'state_size',
      'incremental_size',
      'entries',
      'local',
      'writer',
      'checkpoint_id',
      'changes',
    ]);
    const { remote, local, extra } = await loadManifest(path);
    assert.deepEqual(extra, { writer: 'op', checkpointId: 1n, sequenceFrom: undefined, sequenceTo: undefined, changes: [0n, 1n] });
    assert.deepEqual((await storage.read(remote)).map((c) => Buffer.from(c.value).toString()), ['payload']);
    assert.deepEqual((await storage.read(local)).map((c) => Buffer.from(c.value).toString()), ['payload']);
    writeFileSync(path, '{"entries": 7');
    await assert.rejects(loadManifest(path), (e) => e.kind === 'read' && e.message.startsWith(`invalid manifest ${path}`));
    // A field of the wrong type is refused by name, as the Rust host refuses it.
    writeFileSync(path, text.replace(/"state_size": \d+/, '"state_size": "big"'));
    await assert.rejects(loadManifest(path), (e) => e.kind === 'read' && /invalid type: string "big"/.test(e.message));
    await assert.rejects(loadManifest(join(tempDir(), 'none.json')), (e) => e.kind === 'read' && e.message.startsWith('cannot read manifest'));
    assert.throws(() => manifestJson(snapshot, { sequenceFrom: -1 }), (e) => e.kind === 'host-invalid-argument' && /^sequence number must be an unsigned 64-bit integer .*, got number -1$/.test(e.message));
    assert.throws(() => manifestJson(snapshot, { changes: [1] }), (e) => e.kind === 'host-invalid-argument' && /a pair/.test(e.message));
    // A snapshot of many change sets: the JSON (about 10 MB) goes through the rules
    // component, whose memory grows with it.
    const entry = snapshot.remote.entries[0];
    const many = { ...snapshot.remote, entries: Array.from({ length: 100_000 }, (_, i) => ({ ...entry, offset: BigInt(i) })) };
    await storeManifest(path, { remote: many, local: undefined });
    const back = await loadManifest(path);
    assert.equal(back.remote.entries.length, 100_000);
    assert.equal(back.remote.entries[99_999].offset, 99_999n);
    w.close();
    await storage.close();
  });
});
