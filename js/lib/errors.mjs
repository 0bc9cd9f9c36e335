// The error types of the Node host. Every failure the API reports is one of these, with a
// message naming the values; `kind` tells them apart without parsing messages.

/** Base class: `kind` is a stable name of the failure. */
export class DstlError extends Error {
  /**
   * @param {string} kind
   * @param {string} message
   */
  constructor(kind, message) {
    super(message);
    this.name = 'DstlError';
    /** @type {string} */
    this.kind = kind;
  }
}

/** The writer kinds of the WIT `writer-error` variant. */
export const WRITER_ERROR_KINDS = Object.freeze([
  'closed',
  'truncated',
  'not-yet-appended',
  'already-failed',
  'invalid-range',
  'invalid-argument',
  'upload-failed',
]);

/**
 * A WIT `writer-error` value as jco gives it: `{tag, val}`, `tag` one of
 * {@link WRITER_ERROR_KINDS}, `val` the case's typed payload (records as objects with
 * camelCase fields, variants as `{tag, val}`, enums as strings, `u64`/`s64` as BigInts,
 * `list<u64>` as a `BigUint64Array` or an array of BigInts).
 * @typedef {{tag: string, val: any}} WriterErrorValue
 */

/** Whether `value` is a {@link WriterErrorValue} (what jco throws for a writer's `err`). */
export function isWriterErrorValue(value) {
  return (
    value !== null &&
    typeof value === 'object' &&
    !(value instanceof Error) &&
    WRITER_ERROR_KINDS.includes(value.tag) &&
    value.val !== null &&
    typeof value.val === 'object'
  );
}

/**
 * The upload task whose failure a {@link WriterErrorValue} reports (`upload-failed`) or
 * cites as its cause (`already-failed`), as a BigInt; undefined for any other error. Why
 * it failed is the host's to say (the guest names the task only).
 */
export function failedTask(error) {
  const failure = error.tag === 'upload-failed' ? error.val : error.tag === 'already-failed' ? error.val.cause : undefined;
  return failure?.tag === 'failed' ? BigInt(failure.val.task) : undefined;
}

/** A typed value as text for a message, BigInts and typed arrays included. */
function valueText(value) {
  return JSON.stringify(value, (_, v) => (typeof v === 'bigint' ? v.toString() : ArrayBuffer.isView(v) ? Array.from(v, String) : v));
}

/**
 * The writer rejected a call or a persist failed.
 *
 * - `kind`: the WIT `writer-error` case (`closed`, `truncated`, `not-yet-appended`,
 *   `already-failed`, `invalid-range`, `invalid-argument`, `upload-failed`).
 * - `fields`: that case's typed payload, as jco gives it, to read values from instead of
 *   parsing the message. E.g. `truncated` → `{requested: 0n, truncated: 1n}`; `closed` →
 *   `{tag: 'after-close', val: 'append'}`, `{tag: 'while-persisting', val: {start, end,
 *   checkpoint}}` or `{tag: 'dropped'}`; `invalid-argument` → `{tag: 'outside-range',
 *   val: {keyGroup, range: {start, end}}}`, `{tag: 'value-too-long', val: 5n}`, ...;
 *   `upload-failed` (and `already-failed`'s `cause`) → `{tag: 'refused', val:
 *   {changeSets, refusal}}`, `{tag: 'no-result', val: {task, changeSets}}` or `{tag:
 *   'failed', val: {task}}` (the task that failed; why is the host's, in `detail`).
 *   `error.value` is the whole WIT value, `{tag: kind, val: fields}`.
 * - `detail`: the error's words, from the component's `errors.describe` (dstl-proto's
 *   `error` module, the words every host prints), without the writer's name; the
 *   uploader's words stand in it for a failed task.
 * - `message`: `writer NAME: DETAIL`, as the Rust host's display.
 */
export class WriterError extends DstlError {
  /**
   * @param {string} writer the writer's name
   * @param {WriterErrorValue} error the typed WIT value
   * @param {{describeError(error: WriterErrorValue, upload?: string): string}} describer
   *   the component's `errors.describe` (a {@link import('./codec.mjs').ComponentCodec})
   * @param {string} [upload] the host's words for the failed upload task the error names
   *   ({@link failedTask}), where it knows them
   */
  constructor(writer, error, describer, upload) {
    let detail;
    try {
      detail = describer.describeError(error, upload);
    } catch (e) {
      // Only a broken component gets here: keep the typed value, say describe failed.
      detail = `${error.tag} ${valueText(error.val)} (the component could not describe it: ${e?.message ?? e})`;
    }
    super(error.tag, `writer ${writer}: ${detail}`);
    this.name = 'WriterError';
    /** @type {string} */
    this.writer = writer;
    /** The case's typed payload (see the class comment). */
    this.fields = error.val;
    /** @type {string} the component's description, without the writer's name */
    this.detail = detail;
  }

  /** @returns {WriterErrorValue} the whole WIT value, `{tag: kind, val: fields}` */
  get value() {
    return { tag: this.kind, val: this.fields };
  }
}

/**
 * The writer's sandbox trapped (now or earlier): the writer is unusable, the others carry
 * on. `kind` is `trapped`; `detail` holds the trap and whatever the guest printed.
 */
export class TrappedError extends DstlError {
  constructor(writer, detail) {
    super('trapped', `writer ${writer} failed: its sandbox trapped: ${detail}`);
    this.name = 'TrappedError';
    this.writer = writer;
    this.detail = detail;
  }
}

/**
 * A {@link DstlError} class whose only argument is the message, with its own fixed `name`
 * and `kind`: one definition for the errors that differ in nothing else. The class extends
 * DstlError directly, as a `class` declaration would, and is given `name` too, so that
 * `instanceof`, `e.constructor.name`, stack traces and messages read as before.
 * @param {string} name the class's name and its errors' `name`
 * @param {string} kind its errors' `kind`
 */
function messageErrorClass(name, kind) {
  const MessageError = class extends DstlError {
    /** @param {string} message */
    constructor(message) {
      super(kind, message);
      this.name = name;
    }
  };
  Object.defineProperty(MessageError, 'name', { value: name });
  return MessageError;
}

/** A bad argument given to the host API itself (`kind` = `host-invalid-argument`). */
export const InvalidArgumentError = messageErrorClass('InvalidArgumentError', 'host-invalid-argument');

/** A writer created on a closed storage (`kind` = `storage-closed`); `writer` names it. */
export class StorageClosedError extends DstlError {
  constructor(writer) {
    super('storage-closed', `cannot create writer ${writer}: the storage is closed`);
    this.name = 'StorageClosedError';
    /** @type {string} */
    this.writer = writer;
  }
}

/** A configuration key or value that cannot be used (`kind` = `config`). */
export const ConfigError = messageErrorClass('ConfigError', 'config');

/** The storage or the component could not be set up (`kind` = `setup`). */
export const SetupError = messageErrorClass('SetupError', 'setup');

/** A handle could not be read back (`kind` = `read`). */
export const ReadError = messageErrorClass('ReadError', 'read');
