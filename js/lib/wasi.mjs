// The WASI imports one writer's sandbox gets: what wasmtime's default `WasiCtx` gives the
// Rust host's sandboxes. No environment, no arguments, no stdin; stdout and stderr go to
// a capture buffer of 64 KiB per writer (a guest panic's message reaches the trap's
// error, as in the Rust host); random seeds come from `@bytecodealliance/preview2-shim`.
//
// The streams are implemented here rather than taken from the shim: the shim's Node
// streams go through a worker thread and write to the process's own stderr, which can
// neither be captured per writer nor kept from interleaving with the CLI's output.

import { insecureSeed } from '@bytecodealliance/preview2-shim/random';

const CAPTURE_LIMIT = 64 * 1024;

/** Thrown by `wasi:cli/exit`: the guest asked to exit, which fails that writer only. */
export class GuestExit extends Error {
  constructor(status) {
    super(`the guest called exit (${status?.tag ?? 'unknown'})`);
    this.name = 'GuestExit';
  }
}

class IoError {
  constructor(message) {
    this.message = message;
  }
  toDebugString() {
    return this.message;
  }
}

class Pollable {
  ready() {
    return true;
  }
  block() {}
}

class InputStream {
  read() {
    throw { tag: 'closed' };
  }
  blockingRead() {
    throw { tag: 'closed' };
  }
  subscribe() {
    return new Pollable();
  }
}

class OutputStream {
  constructor(capture) {
    this.capture = capture;
  }
  checkWrite() {
    return 65536n;
  }
  write(buf) {
    this.capture.push(buf);
  }
  blockingWriteAndFlush(buf) {
    this.capture.push(buf);
  }
  flush() {}
  blockingFlush() {}
  subscribe() {
    return new Pollable();
  }
}

/** What a sandbox printed, up to 64 KiB (later bytes are dropped). */
export class Capture {
  chunks = [];
  length = 0;
  push(buf) {
    const room = CAPTURE_LIMIT - this.length;
    if (room <= 0) return;
    const bytes = Uint8Array.from(buf.subarray(0, room));
    this.chunks.push(bytes);
    this.length += bytes.length;
  }
  /** @returns {string} the captured text, trimmed */
  text() {
    return Buffer.concat(this.chunks).toString('utf8').trim();
  }
}

/**
 * The WASI part of a writer's import object.
 *
 * @param {Capture} capture where stdout and stderr go
 * @returns {object}
 */
export function wasiImports(capture) {
  const stdout = new OutputStream(capture);
  const stderr = new OutputStream(capture);
  const stdin = new InputStream();
  return {
    'wasi:cli/environment': {
      getEnvironment: () => [],
      getArguments: () => [],
      initialCwd: () => undefined,
    },
    'wasi:cli/exit': {
      exit(status) {
        throw new GuestExit(status);
      },
    },
    'wasi:cli/stderr': { getStderr: () => stderr },
    'wasi:cli/stdin': { getStdin: () => stdin },
    'wasi:cli/stdout': { getStdout: () => stdout },
    'wasi:cli/terminal-input': { TerminalInput: class TerminalInput {} },
    'wasi:cli/terminal-output': { TerminalOutput: class TerminalOutput {} },
    'wasi:cli/terminal-stderr': { getTerminalStderr: () => undefined },
    'wasi:cli/terminal-stdin': { getTerminalStdin: () => undefined },
    'wasi:cli/terminal-stdout': { getTerminalStdout: () => undefined },
    'wasi:io/error': { Error: IoError },
    'wasi:io/poll': { Pollable, poll: (list) => new Uint32Array(list.map((_, i) => i)) },
    'wasi:io/streams': { InputStream, OutputStream },
    'wasi:random/insecure-seed': insecureSeed,
  };
}
