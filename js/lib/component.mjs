// The writer component in Node: locating the built `dstl_guest.wasm`, transpiling it with
// jco (once per component build, into the git-ignored `js/.generated/`), compiling its
// core modules once, and instantiating it once per writer (and once per codec: see
// `codec.mjs`).
//
// Everything that knows jco's output shape (import keys, export names, the two patches
// below) lives in this module, so a change of the WIT or of jco is adapted here.

import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { SetupError } from './errors.mjs';

const here = dirname(fileURLToPath(import.meta.url));
/** The repository root (this file is `js/lib/component.mjs`). */
export const REPO_ROOT = resolve(here, '..', '..');
const GENERATED = resolve(here, '..', '.generated');
const GUEST_RELATIVE = join('guest-wasm', 'wasm32-wasip2', 'guest', 'dstl_guest.wasm');
/** Bumped whenever the patches applied to jco's output change. */
const PATCH_VERSION = 1;
const WASM_PAGE = 65536;

/**
 * Where the built writer component is: `$DSTL_GUEST_WASM`, else the place `host/build.rs`
 * (or `cargo build -p dstl-guest --profile guest --target wasm32-wasip2 --target-dir
 * <target>/guest-wasm`) puts it under `$CARGO_TARGET_DIR` or the repository's `target/`.
 *
 * @returns {string} an absolute path to `dstl_guest.wasm`
 * @throws {SetupError} naming every place looked at when none holds it
 */
export function locateGuestWasm() {
  const explicit = process.env.DSTL_GUEST_WASM;
  if (explicit) {
    const path = resolve(explicit);
    if (!existsSync(path)) {
      throw new SetupError(`DSTL_GUEST_WASM=${explicit}: no such file`);
    }
    return path;
  }
  const candidates = [];
  if (process.env.CARGO_TARGET_DIR) {
    candidates.push(resolve(process.env.CARGO_TARGET_DIR, GUEST_RELATIVE));
  }
  candidates.push(resolve(REPO_ROOT, 'target', GUEST_RELATIVE));
  candidates.push(resolve(REPO_ROOT, 'target', 'release', GUEST_RELATIVE));
  for (const path of candidates) {
    if (existsSync(path)) return path;
  }
  throw new SetupError(
    `the writer component dstl_guest.wasm was not found (looked at ${candidates.join(', ')}); ` +
      'build it with `cargo build --release -p dstl-host` or `cargo build --locked -p dstl-guest ' +
      '--profile guest --target wasm32-wasip2 --target-dir target/guest-wasm`, or set DSTL_GUEST_WASM',
  );
}

/**
 * jco's output, patched for speed on Node 20 (both patches are checked: if jco's output
 * changes shape, transpiling fails loudly instead of silently running slow):
 *
 * - `_debugLog` reads `process.env.JCO_DEBUG` on every call (several times per guest
 *   call); it is read once at load instead.
 * - Every instantiation probes `WebAssembly.promising` eight times. Node 20 has no JSPI,
 *   so each probe throws a TypeError whose message V8 renders by re-parsing the 7000-line
 *   enclosing function: ~30 ms per writer. The probe is replaced by a function that
 *   falls back to the synchronous export without throwing (where JSPI exists, it is
 *   used as before).
 *
 * @param {string} code
 * @returns {string}
 */
function patchGenerated(code) {
  const debugProbe = 'if (!globalThis?.process?.env?.JCO_DEBUG) { return; }';
  const debugCount = code.split(debugProbe).length - 1;
  const promisingCount = code.split('WebAssembly.promising(').length - 1;
  if (debugCount !== 1 || promisingCount < 1) {
    throw new SetupError(
      `jco's output changed shape (JCO_DEBUG probes: ${debugCount}, WebAssembly.promising probes: ` +
        `${promisingCount}); update patchGenerated in js/lib/component.mjs`,
    );
  }
  const prelude =
    'const _dstlJcoDebug = !!globalThis?.process?.env?.JCO_DEBUG;\n' +
    "const _dstlPromising = typeof WebAssembly.promising === 'function' ? (f) => WebAssembly.promising(f) : (f) => f;\n";
  const body = code
    .replace(debugProbe, 'if (!_dstlJcoDebug) { return; }')
    .split('WebAssembly.promising(')
    .join('_dstlPromising(');
  // Keep the leading directive, if any, first.
  const directive = body.match(/^"use [a-z]+";\n/);
  return directive ? directive[0] + prelude + body.slice(directive[0].length) : prelude + body;
}

/**
 * Transpiles `wasmPath` with jco into `js/.generated/<hash>/` unless that was done
 * already for the same bytes, jco version and patches.
 *
 * @param {string} wasmPath
 * @returns {Promise<string>} the directory holding `dstl_guest.js` and its core modules
 */
export async function transpileGuest(wasmPath) {
  const bytes = readFileSync(wasmPath);
  const jcoPackage = JSON.parse(
    readFileSync(resolve(here, '..', 'node_modules', '@bytecodealliance', 'jco', 'package.json'), 'utf8'),
  );
  const key = createHash('sha256')
    .update(bytes)
    .update(`jco ${jcoPackage.version} patch ${PATCH_VERSION}`)
    .digest('hex')
    .slice(0, 16);
  const out = join(GENERATED, key);
  if (existsSync(join(out, 'dstl_guest.js'))) return out;
  const { transpile } = await import('@bytecodealliance/jco');
  const { files } = await transpile(bytes, {
    name: 'dstl_guest',
    instantiation: 'sync',
    noTypescript: true,
    emitTypescriptDeclarations: false,
    noComponentErrorWrapping: true,
    base64Cutoff: 0,
  });
  const staging = `${out}.${process.pid}.tmp`;
  rmSync(staging, { recursive: true, force: true });
  for (const [name, content] of Object.entries(files)) {
    const target = join(staging, name);
    mkdirSync(dirname(target), { recursive: true });
    if (name === 'dstl_guest.js') {
      writeFileSync(target, patchGenerated(Buffer.from(content).toString('utf8')));
    } else {
      writeFileSync(target, content);
    }
  }
  try {
    renameSync(staging, out);
  } catch (e) {
    // Another process finished the same transpile first.
    rmSync(staging, { recursive: true, force: true });
    if (!existsSync(join(out, 'dstl_guest.js'))) throw e;
  }
  return out;
}

/** Reads an unsigned LEB128 at `pos`; returns [value, next position]. */
function readLeb(bytes, pos) {
  let value = 0;
  let shift = 0;
  for (;;) {
    const byte = bytes[pos++];
    value += (byte & 0x7f) * 2 ** shift;
    if ((byte & 0x80) === 0) return [value, pos];
    shift += 7;
  }
}

function writeLeb(value) {
  const out = [];
  do {
    let byte = value % 128;
    value = Math.floor(value / 128);
    if (value > 0) byte |= 0x80;
    out.push(byte);
  } while (value > 0);
  return out;
}

/**
 * Gives the memory a core module defines a maximum of `maxPages` (keeping a lower one),
 * so `memory.grow` past the writer's memory limit fails inside the guest, as wasmtime's
 * store limiter makes it fail: the guest's allocator reports the failure and aborts,
 * which traps that writer only. Modules without a memory section are returned as they are.
 *
 * @param {Uint8Array} bytes a core module
 * @param {number} maxPages
 * @returns {Uint8Array}
 */
export function capMemory(bytes, maxPages) {
  let pos = 8;
  while (pos < bytes.length) {
    const id = bytes[pos];
    const [size, contentStart] = readLeb(bytes, pos + 1);
    const end = contentStart + size;
    if (id === 5) {
      let [count, p] = readLeb(bytes, contentStart);
      const section = [...writeLeb(count)];
      for (let i = 0; i < count; i++) {
        const flags = bytes[p++];
        if (flags & 0x04) throw new SetupError('64-bit memories are not supported');
        let min;
        let max;
        [min, p] = readLeb(bytes, p);
        if (flags & 0x01) [max, p] = readLeb(bytes, p);
        const capped = max === undefined ? maxPages : Math.min(max, maxPages);
        if (min > capped) {
          throw new SetupError(
            `the writer component needs ${min * WASM_PAGE} bytes of memory at start, above the memory limit of ${maxPages * WASM_PAGE} bytes`,
          );
        }
        section.push(flags | 0x01, ...writeLeb(min), ...writeLeb(capped));
      }
      const head = bytes.subarray(0, pos);
      const tail = bytes.subarray(end);
      const body = Uint8Array.from(section);
      return Buffer.concat([head, Uint8Array.of(5, ...writeLeb(body.length)), body, tail]);
    }
    pos = end;
  }
  return bytes;
}

/**
 * The transpiled component, compiled once: instantiate it once per writer.
 */
export class Component {
  /**
   * @param {string} dir the transpiled output
   * @param {Function} instantiate jco's `instantiate`
   * @param {string} wasmPath the component it came from
   */
  constructor(dir, instantiate, wasmPath) {
    this.dir = dir;
    this.wasmPath = wasmPath;
    this._instantiate = instantiate;
    /** @type {Map<string, Uint8Array>} */
    this._bytes = new Map();
    /** @type {Map<string, WebAssembly.Module>} compiled modules per `name@pages` */
    this._modules = new Map();
  }

  _module(name, maxPages) {
    const key = `${name}@${maxPages}`;
    let module = this._modules.get(key);
    if (!module) {
      let bytes = this._bytes.get(name);
      if (!bytes) {
        bytes = readFileSync(join(this.dir, name));
        this._bytes.set(name, bytes);
      }
      module = new WebAssembly.Module(capMemory(bytes, maxPages));
      this._modules.set(key, module);
    }
    return module;
  }

  /**
   * A new instance with its own memory (capped at `memoryLimit` bytes) and the given
   * imports, keyed by unversioned interface names as jco expects them.
   *
   * @param {object} imports
   * @param {number} memoryLimit bytes
   * @returns {{writer: {Writer: Function}, reader: {decodeChangeSet: Function, logicalBytes: Function}, files: {encodeFile: Function, layoutPlainFile: Function}, memory: WebAssembly.Memory|null}}
   */
  instantiate(imports, memoryLimit) {
    const pages = Math.max(1, Math.floor(memoryLimit / WASM_PAGE));
    const exports = { memory: null };
    const root = this._instantiate((name) => this._module(name, pages), imports, (module, importObject) => {
      const instance = new WebAssembly.Instance(module, importObject);
      if (instance.exports.memory instanceof WebAssembly.Memory && !exports.memory) {
        exports.memory = instance.exports.memory;
      }
      return instance;
    });
    return { writer: root.writer, reader: root.reader, files: root.files, memory: exports.memory };
  }
}

const loaded = new Map();

/**
 * Loads (transpiling if needed) and compiles the writer component, once per process and
 * path.
 *
 * @param {string} [wasmPath] defaults to {@link locateGuestWasm}
 * @returns {Promise<Component>}
 */
export function loadComponent(wasmPath = locateGuestWasm()) {
  const path = resolve(wasmPath);
  let promise = loaded.get(path);
  if (!promise) {
    promise = (async () => {
      if (!existsSync(path)) throw new SetupError(`writer component ${path}: no such file`);
      const dir = await transpileGuest(path);
      const { instantiate } = await import(pathToFileURL(join(dir, 'dstl_guest.js')).href);
      return new Component(dir, instantiate, path);
    })();
    promise.catch(() => loaded.delete(path));
    loaded.set(path, promise);
  }
  return promise;
}

/** The unversioned import keys of the `changelog` world, as jco looks them up. */
export const IMPORT_KEYS = Object.freeze({
  uploader: 'dstl:changelog/uploader',
  registry: 'dstl:changelog/registry',
  localRegistry: 'dstl:changelog/local-registry',
  logging: 'dstl:changelog/logging',
});
