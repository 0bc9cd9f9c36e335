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
 * The writer rejected a call or a persist failed: `kind` is the WIT variant case
 * (`closed`, `truncated`, `not-yet-appended`, `already-failed`, `invalid-range`,
 * `invalid-argument`, `upload-failed`), `detail` the writer's message. The message is
 * the Rust host's display (`Error::Writer`, `Error::Upload`): `writer NAME: DETAIL`, with
 * `closed: ` before the detail of `closed`, and `upload failed: ` before that of
 * `upload-failed` unless the detail says so itself.
 */
export class WriterError extends DstlError {
  constructor(writer, kind, detail) {
    const uploadFailed = detail.startsWith('upload failed') ? detail : `upload failed: ${detail}`;
    const display = kind === 'closed' ? `closed: ${detail}` : kind === 'upload-failed' ? uploadFailed : detail;
    super(kind, `writer ${writer}: ${display}`);
    this.name = 'WriterError';
    /** @type {string} */
    this.writer = writer;
    /** @type {string} */
    this.detail = detail;
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

/** A bad argument given to the host API itself (`kind` = `host-invalid-argument`). */
export class InvalidArgumentError extends DstlError {
  constructor(message) {
    super('host-invalid-argument', message);
    this.name = 'InvalidArgumentError';
  }
}

/** A configuration key or value that cannot be used (`kind` = `config`). */
export class ConfigError extends DstlError {
  constructor(message) {
    super('config', message);
    this.name = 'ConfigError';
  }
}

/** The storage or the component could not be set up (`kind` = `setup`). */
export class SetupError extends DstlError {
  constructor(message) {
    super('setup', message);
    this.name = 'SetupError';
  }
}

/** A handle could not be read back (`kind` = `read`). */
export class ReadError extends DstlError {
  constructor(message) {
    super('read', message);
    this.name = 'ReadError';
  }
}
