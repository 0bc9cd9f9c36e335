// One operator's writer: its own instance of the writer component plus its mailbox, as
// the Rust host's writer.rs.
//
// - Mailbox: upload outcomes are delivered serially with the writer's own calls, after a
//   call returns and never from inside an import (JS is single-threaded: an outcome
//   arriving while a call runs waits in the mailbox and is delivered when it returns).
// - Appends are buffered on the host side as packed columns and handed to the guest as
//   one `append-batch` call before any other call of this writer, and when the
//   component's `hand-off` rule says (WIT `policy`; 256 KiB or 4096 changes gathered, or
//   the open bytes at the pre-emptive threshold): after each hand-off it answers a budget,
//   which appends count down.
// - A trap (a guest panic, memory growth past the cap, a call past its deadline, a guest
//   fault found by an import) poisons this writer only: its pending persists reject with
//   a `TrappedError` naming it, the uploaded files it held that no snapshot returned to
//   the caller references are released, and every later call fails with the same error.

import { META_KEY_GROUP } from './reader.mjs';
import { failedTask, InvalidArgumentError, isWriterErrorValue, TrappedError, WriterError } from './errors.mjs';
import { bytes, describe, I32_MAX, i32, s64, u64 } from './args.mjs';
import { IMPORT_KEYS } from './component.mjs';
import { Capture, wasiImports } from './wasi.mjs';

const LEVELS = ['trace', 'debug', 'info', 'warn', 'error'];
const noop = () => {};
/** Hand-off inputs held back (see `Writer#held`): a new sequence number, a persist answered without an error. */
const ROLLED_OVER = Symbol('rolled over');
const PERSISTED = Symbol('persisted');

/** A `hand-off` budget with numbers for counting down. */
function budget(b) {
  return { bytes: Number(b.bytes), changes: b.changes, aloneAt: b.aloneAt };
}

/** The WIT `writer-error` of a writer the host dropped (before a call, or before a persist completed). */
const DROPPED = Object.freeze({ tag: 'closed', val: Object.freeze({ tag: 'dropped' }) });
/**
 * Failed upload tasks whose words a writer keeps for the errors naming them (as the Rust
 * host's `UploadFailures`): failures are rare, and an error naming an older one still
 * names its task.
 */
const UPLOAD_FAILURES_KEPT = 64;

/** An empty batch of packed columns: nothing buffered. */
const NO_CHANGES = Object.freeze({ keyGroups: new Int32Array(0), lengths: new Uint32Array(0), data: new Uint8Array(0) });

/** Packed columns of buffered appends, as many as a fresh `budget` allows. */
class Batch {
  constructor(budget) {
    this.capacity = budget;
    // Allocated on the first append, so idle writers stay small.
    this.keyGroups = null;
    this.lengths = null;
    this.data = null;
    this.count = 0;
    this.bytes = 0;
  }
  push(keyGroup, value) {
    if (this.keyGroups === null) {
      this.keyGroups = new Int32Array(this.capacity.changes);
      this.lengths = new Uint32Array(this.capacity.changes);
      this.data = new Uint8Array(this.capacity.aloneAt);
    }
    this.keyGroups[this.count] = keyGroup;
    this.lengths[this.count] = value.length;
    this.count++;
    const end = this.bytes + value.length;
    if (end > this.data.length) {
      const grown = new Uint8Array(Math.max(end, this.data.length * 2));
      grown.set(this.data.subarray(0, this.bytes));
      this.data = grown;
    }
    this.data.set(value, this.bytes);
    this.bytes = end;
  }
  /** Whether the append just buffered spent `budget`: the batch goes now. */
  spent(budget) {
    return this.bytes >= budget.bytes || this.count >= budget.changes;
  }
  clear() {
    this.count = 0;
    this.bytes = 0;
  }
}

/**
 * One operator's writer. Create it with {@link ChangelogStorage#createWriter}. Every
 * method is synchronous except that `persist` returns a Promise of the snapshot;
 * precondition violations throw a {@link WriterError} whose `kind` is the WIT error case
 * and `fields` its typed payload.
 * Sequence numbers and checkpoint ids are BigInts (numbers that are safe integers are
 * accepted as arguments).
 */
export class Writer {
  #storage;
  #config;
  #options;
  #live = null;
  #failure = null;
  #pending = new Map();
  #buffer;
  #closed = false;
  /** The component's `hand-off` rule for this writer, and its budget. */
  #handOff;
  /** Its budget, or null until asked for after the input held back below. */
  #budget;
  /**
   * The latest input for `#handOff` not yet given to it: an `append-batch` answer (open
   * bytes, a bigint), {@link ROLLED_OVER} or {@link PERSISTED} (a persist answered
   * without an error, which the rule counts as a rollover); null if none. Each of these
   * replaces everything earlier inputs said (WIT `hand-off`), so only the latest is
   * given, when a budget is next needed or before another input: `appendBatch`,
   * `nextSequenceNumber` and `persist` make no call for it.
   */
  #held = null;
  #mailbox = [];
  /** `[task, words]` of this writer's most recent failed upload tasks, oldest first. */
  #uploadFailures = [];
  #busy = false;
  #fault = null;
  /** What the guest holds (the `holdings` of the component's ownership rules). */
  #holdings;
  #capture = new Capture();

  /** @internal use {@link ChangelogStorage#createWriter} */
  constructor(storage, config, options) {
    this.#storage = storage;
    this.#config = config;
    this.#options = options;
    /** The operator name. */
    this.name = config.name;
    /** A number unique within the storage (the owner of its claims on local copies). */
    this.id = options.id;
    this.#holdings = storage.ownership.newHoldings();
    this.#handOff = new storage.ownership.policy.HandOff(BigInt(config.preemptivePersistThreshold));
    this.#budget = budget(this.#handOff.budget());
    this.#buffer = new Batch(this.#budget);
    try {
      const root = storage.component.instantiate(this.#imports(), options.memoryLimit);
      const resource = new root.writer.Writer(config);
      this.#live = { root, resource, memory: root.memory };
    } catch (e) {
      throw new TrappedError(config.name, `could not instantiate the writer component: ${e?.message ?? e}`);
    }
  }

  /** Why the sandbox failed, if it trapped; `null` otherwise. */
  get failure() {
    return this.#failure;
  }

  #imports() {
    const storage = this.#storage;
    const log = (level, message) => storage._log(level, this.name, message);
    const guard = (what, fn) => (...args) => {
      try {
        return fn(...args);
      } catch (e) {
        // An exception must never unwind through the guest: record it as a fault that
        // poisons this writer once its call returns. A string is a guest fault the
        // ownership rules found (the guest named a file it does not hold).
        this.#fault ??= typeof e === 'string' ? e : `the host's ${what} import failed: ${e?.message ?? e}`;
        return undefined;
      }
    };
    const ownership = storage.ownership;
    const holdings = this.#holdings;
    return {
      ...wasiImports(this.#capture),
      [IMPORT_KEYS.uploader]: {
        schedule: (task) => {
          let refusal;
          try {
            // A block comes in pieces (large values apart from their headers): the
            // uploader writes whole blocks.
            for (const changeSet of task.changeSets) {
              const { pieces } = changeSet;
              changeSet.block = pieces.length === 1 ? pieces[0] : Buffer.concat(pieces);
              changeSet.pieces = null;
            }
            // A pre-emptive task (the guest says so) may wait in its batch for company.
            refusal = storage.scheduler.submit(this, task);
          } catch (e) {
            // A defect of the host, not a refusal: as a panic in the Rust host's
            // scheduler, it fails this writer alone once the call returns (a
            // `TrappedError`); the guest is told nothing, its state dies with it.
            this.#fault ??= `the host's schedule import failed: ${e?.message ?? e}`;
            return false;
          }
          // false: the pieces were copied out (jco's lifting copies every list), so the
          // guest may let its blocks go at once.
          if (refusal === null) return false;
          // jco turns a thrown non-Error value into the `err` case of the result: the
          // WIT `refusal` enum, which the guest words (`upload-failed`, `refused`).
          throw refusal;
        },
      },
      [IMPORT_KEYS.registry]: {
        release: guard('release', (handle) => {
          ownership.release(this.id, handle.path, holdings.release(handle.path));
        }),
        stopTracking: guard('stop-tracking', (handle) => {
          ownership.stopTracking(this.id, handle.path, holdings.check(handle.path, 'stop-tracking'));
        }),
      },
      [IMPORT_KEYS.localRegistry]: {
        register: guard('register', (handle, checkpoint) => {
          if (!holdings.check(handle.path, 'local register')) {
            throw String(`guest fault: local register of ${handle.path}, a store file rather than a local copy`);
          }
          ownership.register(this.id, handle.path, checkpoint);
        }),
        discardUpTo: (checkpoint) => {
          try {
            const forgotten = ownership.discardUpTo(this.id, checkpoint);
            holdings.forget(forgotten);
            return forgotten;
          } catch (e) {
            this.#fault ??= `the host's discard-up-to import failed: ${e?.message ?? e}`;
            return [];
          }
        },
      },
      [IMPORT_KEYS.logging]: {
        log: guard('log', (level, message) => log(typeof level === 'string' ? level : LEVELS[level] ?? 'info', message)),
      },
    };
  }

  // ---- the API ----

  /**
   * Appends a data change for `keyGroup` (buffered: see the module comment). Bad
   * arguments and a closed or failed writer are reported at once.
   * @param {number} keyGroup within the writer's key-group range
   * @param {Uint8Array} value
   */
  append(keyGroup, value) {
    const kg = i32(keyGroup, 'key group');
    const v = bytes(value, 'value');
    const { start, end } = this.#config.keyGroupRange;
    this.#buffered(kg, v, kg >= 0 && kg >= start && kg <= end, (live) => live.resource.append(kg, v));
  }

  /**
   * Appends a metadata change (key group -1), buffered like {@link Writer#append}.
   * @param {Uint8Array} value
   */
  appendMeta(value) {
    const v = bytes(value, 'value');
    this.#buffered(META_KEY_GROUP, v, true, (live) => live.resource.appendMeta(v));
  }

  /**
   * Buffers an append whose key group is `valid` for this writer. One the writer refuses
   * (a key group it does not own, or any append after close) goes to the guest at once
   * through `direct`, after what is buffered: the guest's own checks decide and word
   * the refusal, so this host has no second copy of them.
   */
  #buffered(keyGroup, value, valid, direct) {
    this.#enter();
    if (!this.#live) throw this.#trappedError();
    // A value the format cannot hold never enters the sandbox, not even to be refused:
    // copying it there could exhaust the writer's memory and trap it.
    if (value.length > I32_MAX) {
      throw this.#writerError({ tag: 'invalid-argument', val: { tag: 'value-too-long', val: BigInt(value.length) } });
    }
    if (this.#closed || !valid) {
      this.#callWith(direct);
      return;
    }
    const budget = this.#currentBudget();
    if (value.length >= budget.aloneAt) {
      // Large values gain nothing from batching: hand them over directly.
      this.#callWith((live) => this.#appendBatchCall(live, Int32Array.of(keyGroup), Uint32Array.of(value.length), value));
      return;
    }
    this.#buffer.push(keyGroup, value);
    if (this.#buffer.spent(budget)) this.#callWith(null);
  }

  /**
   * Appends many changes as packed columns: `lengths[i]` bytes of `data` belong to
   * `keyGroups[i]` (-1 for metadata). A malformed batch appends nothing.
   * @param {Int32Array|number[]} keyGroups
   * @param {Uint32Array|number[]} lengths
   * @param {Uint8Array} data
   */
  appendBatch(keyGroups, lengths, data) {
    const kgs = keyGroups instanceof Int32Array ? keyGroups : Array.isArray(keyGroups) ? Int32Array.from(keyGroups, (v, i) => i32(v, `key group [${i}]`)) : null;
    if (!kgs) throw new InvalidArgumentError(`key groups must be an Int32Array or an array of numbers, got ${describe(keyGroups)}`);
    const lens = lengths instanceof Uint32Array ? lengths : Array.isArray(lengths) ? Uint32Array.from(lengths, (v, i) => {
      if (!Number.isInteger(v) || v < 0 || v > 4294967295) throw new InvalidArgumentError(`length [${i}] must be an unsigned 32-bit integer, got ${describe(v)}`);
      return v;
    }) : null;
    if (!lens) throw new InvalidArgumentError(`lengths must be a Uint32Array or an array of numbers, got ${describe(lengths)}`);
    const d = bytes(data, 'data');
    this.#callWith((live) => this.#appendBatchCall(live, kgs, lens, d));
  }

  /** An append-batch call; its answer goes to the hand-off rule. */
  #appendBatchCall(live, keyGroups, lengths, data) {
    try {
      this.#hold(live.resource.appendBatch(keyGroups, lengths, data));
    } catch (e) {
      throw this.#refused(e, (error) => this.#handOff.handedOver({ tag: 'err', val: error }));
    }
  }

  /**
   * Returns `e`, which a guest call threw, to be rethrown; a refusal (a WIT
   * `writer-error`) is first told to the hand-off rule through `tell`, after the input
   * held back, and the rule's answer is the new budget.
   */
  #refused(e, tell) {
    if (isWriterErrorValue(e)) {
      this.#give();
      this.#budget = budget(tell(e));
    }
    return e;
  }

  /** Holds `input` back for the hand-off rule (see `#held`). */
  #hold(input) {
    this.#held = input;
    this.#budget = null;
  }

  /** Gives the hand-off rule the input held back; returns its answer, or null if none. */
  #give() {
    const held = this.#held;
    if (held === null) return null;
    this.#held = null;
    if (held === ROLLED_OVER) return this.#handOff.rolledOver();
    if (held === PERSISTED) return this.#handOff.persisted(undefined);
    return this.#handOff.handedOver({ tag: 'ok', val: held });
  }

  /** The budget: one call, if any, whether an input was held back or not. */
  #currentBudget() {
    this.#budget ??= budget(this.#give() ?? this.#handOff.budget());
    return this.#budget;
  }

  /** @returns {bigint} always 0 */
  initialSequenceNumber() {
    return this.#callWith((live) => live.resource.initialSequenceNumber());
  }

  /**
   * Closes the open change set if it is non-empty and returns the next sequence number.
   * @returns {bigint}
   */
  nextSequenceNumber() {
    return this.#callWith((live) => {
      this.#hold(ROLLED_OVER);
      return live.resource.nextSequenceNumber();
    });
  }

  /**
   * Makes every change set from `from` on durable for `checkpoint` (its snapshot names
   * each of them, so keep the persists pending at once bounded: k pending from the same
   * `from` name O(k²) change sets, in the writer's capped memory). Throws at once for a
   * precondition violation; otherwise returns a Promise of the snapshot result, which
   * rejects with a {@link WriterError} (`upload-failed`, `closed`) or a
   * {@link TrappedError}. The Promise's `immediate` is true when nothing had to be
   * uploaded. An unobserved rejection never crashes the process.
   * @param {bigint|number} from
   * @param {bigint|number} checkpoint
   * @returns {Promise<object> & {immediate: boolean}}
   */
  persist(from, checkpoint) {
    const start = u64(from, 'from');
    const cp = s64(checkpoint, 'checkpoint');
    // The buffered appends go along with the persist, in one call.
    return this.#callWith((live, batch) => {
      let reply;
      try {
        reply = live.resource.persist(batch.keyGroups, batch.lengths, batch.data, start, cp);
        this.#hold(PERSISTED);
      } catch (e) {
        throw this.#refused(e, (error) => this.#handOff.persisted(error));
      }
      let promise;
      if (reply.tag === 'ready') {
        if (!this.#handOut(reply.val)) return undefined;
        promise = Promise.resolve(reply.val);
      } else {
        promise = new Promise((resolve, reject) => this.#pending.set(reply.val, { resolve, reject }));
        promise.catch(noop);
      }
      Object.defineProperty(promise, 'immediate', { value: reply.tag === 'ready' });
      return promise;
    }, true);
  }

  /**
   * Drops change sets below `to`.
   * @param {bigint|number} to
   */
  truncate(to) {
    const sqn = u64(to, 'to');
    this.#callWith((live) => live.resource.truncate(sqn));
  }

  /**
   * A checkpoint holding `[from, to)` was confirmed. After `close` it still discards
   * the local copies this writer registered below `checkpoint`, without error.
   * @param {bigint|number} from
   * @param {bigint|number} to
   * @param {bigint|number} checkpoint
   */
  confirm(from, to, checkpoint) {
    const args = [u64(from, 'from'), u64(to, 'to'), s64(checkpoint, 'checkpoint')];
    // Also after close: the guest checks the range as before and discards the local
    // copies this writer registered below the checkpoint.
    this.#callWith((live) => live.resource.confirm(...args));
  }

  /**
   * A checkpoint holding `[from, to)` was aborted.
   * @param {bigint|number} from
   * @param {bigint|number} to
   * @param {bigint|number} checkpoint
   */
  reset(from, to, checkpoint) {
    const args = [u64(from, 'from'), u64(to, 'to'), s64(checkpoint, 'checkpoint')];
    this.#callWith((live) => live.resource.reset(...args));
  }

  /**
   * Releases change sets from `from` on and closes; pending persists reject with `closed`.
   * @param {bigint|number} from
   */
  truncateAndClose(from) {
    const sqn = u64(from, 'from');
    this.#callWith((live) => this.#resolve(live.resource.truncateAndClose(sqn)));
    this.#closed = true;
    this.#storage.ownership.releaseUnreturned(this.id, this.#holdings);
  }

  /**
   * Closes the writer; pending persists reject with `closed`. Uploads still in flight are
   * released when they land.
   */
  close() {
    this.#callWith((live) => this.#resolve(live.resource.close()));
    this.#closed = true;
    // The guest will release nothing more: what no returned snapshot names goes now.
    this.#storage.ownership.releaseUnreturned(this.id, this.#holdings);
  }

  /**
   * Drops the sandbox now (as dropping a Rust `Writer`): later calls fail with `closed`,
   * pending persists reject, uploads still in flight release their files when they land.
   * Files of snapshots it returned stay tracked (a checkpoint may still need them); the
   * others it held are released.
   */
  dispose() {
    this.#storage.writers.delete(this);
    if (!this.#live) return;
    this.#dropInstance();
    this.#storage.ownership.releaseUnreturned(this.id, this.#holdings);
    this.#rejectAll(this.#writerError(DROPPED));
    this.#drain();
  }

  // ---- calls, mailbox, traps ----

  #enter() {
    if (this.#busy) {
      throw new InvalidArgumentError(`re-entrant call into writer ${this.name} from inside one of its own calls`);
    }
  }

  /**
   * Runs one guest call: delivers waiting upload outcomes and buffered appends first,
   * and outcomes that arrived meanwhile after. `fn` null: only the flush. With
   * `takesBuffer`, the buffered appends are not flushed but given to `fn` as packed
   * columns (`persist` takes them along).
   */
  #callWith(fn, takesBuffer = false) {
    this.#enter();
    this.#drain();
    try {
      if (takesBuffer) {
        const batch = this.#takeBuffer();
        return this.#invoke((live) => fn(live, batch));
      }
      this.#flush();
      return fn ? this.#invoke(fn) : undefined;
    } finally {
      this.#drain();
    }
  }

  /** The buffered appends as packed columns (views of the buffer, valid until the next append); the buffer is empty afterwards. */
  #takeBuffer() {
    const buffer = this.#buffer;
    if (buffer.count === 0) return NO_CHANGES;
    const n = buffer.count;
    const size = buffer.bytes;
    buffer.clear();
    return { keyGroups: buffer.keyGroups.subarray(0, n), lengths: buffer.lengths.subarray(0, n), data: buffer.data.subarray(0, size) };
  }

  #flush() {
    const batch = this.#takeBuffer();
    if (batch === NO_CHANGES) return;
    this.#invoke((live) => this.#appendBatchCall(live, batch.keyGroups, batch.lengths, batch.data));
  }

  /** One guest call; a trap, a fault or an overrun deadline poisons the writer. */
  #invoke(fn) {
    const live = this.#live;
    if (!live) throw this.#trappedError();
    this.#busy = true;
    const started = performance.now();
    let value;
    let thrown;
    let threw = false;
    try {
      value = fn(live);
    } catch (e) {
      threw = true;
      thrown = e;
    } finally {
      this.#busy = false;
    }
    const elapsed = performance.now() - started;
    let cause = null;
    if (this.#fault) {
      cause = this.#fault;
    } else if (threw && !isWriterErrorValue(thrown)) {
      cause = this.#describeTrap(thrown, live);
    } else if (elapsed > this.#options.callTimeoutMs) {
      cause =
        `the call ran for ${Math.round(elapsed)} ms, past its deadline of ${this.#options.callTimeoutMs} ms ` +
        '(dstl.writer.call-timeout); Node cannot interrupt a running call, so the writer was stopped when it returned';
    }
    if (cause !== null) {
      this.#poison(cause, live);
      throw this.#trappedError();
    }
    if (threw) throw this.#writerError(thrown);
    return value;
  }

  #describeTrap(error, live) {
    let cause = error instanceof Error ? `${error.name}: ${error.message}` : `${describe(error)} thrown`;
    const memory = live.memory?.buffer.byteLength ?? 0;
    if (error instanceof WebAssembly.RuntimeError && memory + 65536 * 16 > this.#options.memoryLimit) {
      cause += `; the sandbox's memory (${memory} bytes) is at its limit of ${this.#options.memoryLimit} bytes (dstl.writer.memory-limit)`;
    }
    return cause;
  }

  #poison(cause, live) {
    const printed = this.#capture.text();
    if (printed) cause += `; guest stderr: ${printed}`;
    this.#storage._log('error', this.name, `writer sandbox trapped: ${cause}`);
    this.#failure = cause;
    this.#fault = null;
    if (this.#live === live) this.#dropInstance();
    // The guest's references die with it. Files of snapshots already returned to the
    // caller stay tracked (a checkpoint may still be confirmed); the rest are released,
    // so files no one else needs are deleted.
    this.#storage.ownership.releaseUnreturned(this.id, this.#holdings);
    this.#buffer.clear();
    this.#rejectAll(this.#trappedError());
  }

  #dropInstance() {
    const live = this.#live;
    this.#live = null;
    try {
      // Unregisters jco's finalizer, so a dead instance's destructor never runs from GC.
      live.resource[Symbol.dispose]?.();
    } catch {
      // A trapped instance may fail its destructor: it is gone either way.
    }
  }

  #rejectAll(error) {
    const pending = this.#pending;
    this.#pending = new Map();
    for (const { reject } of pending.values()) reject(error);
  }

  #trappedError() {
    if (this.#failure !== null) return new TrappedError(this.name, this.#failure);
    return this.#writerError(DROPPED);
  }

  /**
   * A WIT `writer-error` value as this writer's {@link WriterError}, in the component's
   * words (`errors.describe`, asked of the storage's codec instance: never this writer's
   * own, which may be gone or trapped).
   */
  #writerError(error) {
    const task = failedTask(error);
    const upload = task === undefined ? undefined : this.#uploadFailures.find(([t]) => t === task)?.[1];
    return new WriterError(this.name, error, this.#storage.codec, upload);
  }

  /**
   * A snapshot goes to the caller only if it names what this writer holds; otherwise the
   * guest lied, and the call poisons the writer. Runs inside a guest call.
   * @returns {boolean} whether the snapshot may be handed out
   */
  #handOut(snapshot) {
    try {
      this.#holdings.handOut(snapshot);
      return true;
    } catch (e) {
      this.#fault ??= typeof e === 'string' ? e : `the host's hand-out failed: ${e?.message ?? e}`;
      return false;
    }
  }

  #resolve(completions) {
    for (const { ticket, outcome } of completions) {
      const waiter = this.#pending.get(ticket);
      if (!waiter) {
        this.#storage._log('warn', this.name, `completion for an unknown persist ${ticket}`);
        continue;
      }
      // A lying guest's snapshot is never handed out: the writer is poisoned, which
      // rejects the waiter still pending.
      if (outcome.tag === 'ok' && !this.#handOut(outcome.val)) continue;
      this.#pending.delete(ticket);
      if (outcome.tag === 'ok') {
        waiter.resolve(outcome.val);
      } else {
        waiter.reject(this.#writerError(outcome.val));
      }
    }
  }

  /** @internal the scheduler posts an upload outcome */
  _post(letter) {
    this.#mailbox.push(letter);
    if (!this.#busy) this.#drain();
  }

  #drain() {
    while (this.#mailbox.length > 0) {
      const letter = this.#mailbox.shift();
      if (!this.#live) {
        // The sandbox is gone: nobody will reference these files.
        if (letter.kind === 'succeeded') this.#storage.ownership.releaseResults(this.id, letter.results);
        continue;
      }
      try {
        this.#invoke((live) => {
          if (letter.kind === 'succeeded') {
            this.#holdings.add(letter.results);
            // No task to return: this host copies every block out (`schedule` says false).
            this.#resolve(live.resource.onUploadSucceeded(letter.task, letter.results, []));
          } else {
            // Why is the host's: kept for the errors that name the task.
            this.#uploadFailures.push([BigInt(letter.task), String(letter.cause)]);
            if (this.#uploadFailures.length > UPLOAD_FAILURES_KEPT) this.#uploadFailures.shift();
            this.#resolve(live.resource.onUploadFailed(letter.task, []));
          }
        });
      } catch {
        // A trap was handled by #invoke: the writer is poisoned, its persists rejected.
      }
    }
  }
}
