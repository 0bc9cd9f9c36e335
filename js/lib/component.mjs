// The components in Node: which transpiled writer component to run, compiling its core
// modules once, and instantiating it once per writer (and once per codec: see
// `codec.mjs`); and the rules component (ownership rules and upload policy), instantiated
// once per storage (`ownership.mjs`) and once per process for the configuration keys and
// the JSON records (`sharedRules`).
//
// The package ships the component already transpiled by jco and patched (`component/`,
// made by `scripts/build-component.mjs` when the package is packed or `npm ci` is run in
// js/), so running it needs no jco and writes nothing. Only a different component build,
// named by `DSTL_GUEST_WASM` or the `wasm` option, is transpiled at runtime
// (`transpile.mjs`, into the user's cache directory). The rules component is always the
// packaged one (`component-rules/`): it has no imports of dstl, and nothing a writer
// does depends on its build.
//
// Everything that knows jco's output shape (import keys, export names, the patches in
// `transpile.mjs`) lives in this module and `transpile.mjs`, so a change of the WIT or of
// jco is adapted there.

import { existsSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { SetupError } from './errors.mjs';
import { Capture, wasiImports } from './wasi.mjs';
import { componentKind, NAME, PATCH_VERSION, readComponent, readTranspiled, RULES_NAME, sha256, transpileToCache } from './transpile.mjs';

/** The transpiled component the package ships (`<package>/component/`). */
export const PACKAGED_COMPONENT_DIR = fileURLToPath(new URL('../component', import.meta.url));
/** The transpiled rules component the package ships (`<package>/component-rules/`). */
export const PACKAGED_RULES_DIR = fileURLToPath(new URL('../component-rules', import.meta.url));
const WASM_PAGE = 65536;

/**
 * The component build to run instead of the packaged one: `wasm` if given, else
 * `$DSTL_GUEST_WASM`, else none.
 *
 * @param {string} [wasm]
 * @returns {string|null} an absolute path to a `dstl_guest.wasm`, or null for the packaged
 *   component
 * @throws {SetupError} when the named file does not exist
 */
export function locateGuestWasm(wasm) {
  if (wasm) return existingFile(resolve(wasm), `writer component ${resolve(wasm)}`);
  const fromEnv = process.env.DSTL_GUEST_WASM;
  if (fromEnv) return existingFile(resolve(fromEnv), `DSTL_GUEST_WASM=${fromEnv}`);
  return null;
}

/** `path` if it is a file; otherwise a SetupError naming it as `what`. */
function existingFile(path, what) {
  if (!existsSync(path) || !statSync(path).isFile()) throw new SetupError(`${what}: no such file`);
  return path;
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

/** `value` as an unsigned LEB128. */
export function writeLeb(value) {
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
 * A transpiled component, compiled once: the writer component is instantiated once per
 * writer, the rules component once per storage.
 */
export class Component {
  /**
   * @param {string} dir the transpiled output
   * @param {Function} instantiate jco's `instantiate`
   * @param {Map<string, Uint8Array>} coreModules the core modules' bytes by file name
   * @param {string|null} wasmPath the component file it was made from; null for a
   *   packaged component
   */
  constructor(dir, instantiate, coreModules, wasmPath) {
    this.dir = dir;
    this.wasmPath = wasmPath;
    this._instantiate = instantiate;
    /** @type {Map<string, Uint8Array>} */
    this._bytes = coreModules;
    /** @type {Map<string, WebAssembly.Module>} compiled modules per `name@pages` */
    this._modules = new Map();
  }

  _module(name, maxPages) {
    const key = `${name}@${maxPages}`;
    let module = this._modules.get(key);
    if (!module) {
      const bytes = this._bytes.get(name);
      if (!bytes) throw new SetupError(`the transpiled component in ${this.dir} has no core module ${name}`);
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
   * @returns {{memory: WebAssembly.Memory|null}} and the exports by interface: the writer
   *   component's `writer` ({Writer}), `reader` ({readFile, ...}) and
   *   `files` ({encodeFile, layoutPlainFile}); the rules component's `ownership`
   *   ({TaskRefs, LocalClaims, Holdings}) and `policy` ({Retry, Batcher, HandOff})
   */
  instantiate(imports, memoryLimit) {
    const pages = Math.max(1, Math.floor(memoryLimit / WASM_PAGE));
    let memory = null;
    const root = this._instantiate((name) => this._module(name, pages), imports, (module, importObject) => {
      const instance = new WebAssembly.Instance(module, importObject);
      if (instance.exports.memory instanceof WebAssembly.Memory) memory ??= instance.exports.memory;
      return instance;
    });
    return { ...root, memory };
  }
}

/**
 * Loads a transpiled directory: its generated module and its core modules (all read now,
 * so a directory replaced later cannot mix two builds).
 *
 * @param {string} dir a directory {@link readTranspiled} accepts
 * @param {string|null} [wasmPath] the component file it was made from, null if packaged
 * @param {string} [name] the generated module's name (the rules component's is
 *   `RULES_NAME`)
 * @returns {Promise<Component>}
 * @throws {SetupError} when `dir` is missing, incomplete, or made by other patches
 */
export async function loadTranspiled(dir, wasmPath = null, name = NAME) {
  const what = componentKind(name);
  const meta = readTranspiled(dir, name);
  if (!meta) {
    const packaged = dir === PACKAGED_COMPONENT_DIR || dir === PACKAGED_RULES_DIR;
    throw new SetupError(
      packaged
        ? `the packaged ${what} is missing or incomplete in ${dir}: it is generated when the ` +
            'package is packed, or by `npm ci` (or `npm run build:component`) in a checkout of js/' +
            (name === NAME ? '; or point DSTL_GUEST_WASM or the wasm option at a dstl_guest.wasm' : '')
        : `no complete transpiled ${what} in ${dir}`,
    );
  }
  if (meta.patch !== PATCH_VERSION) {
    throw new SetupError(
      `the transpiled ${what} in ${dir} carries patch version ${meta.patch}, this host needs ` +
        `${PATCH_VERSION}: regenerate it (\`npm run build:component\` in js/)`,
    );
  }
  const coreModules = new Map();
  for (const file of meta.files) {
    if (file.endsWith('.wasm')) coreModules.set(file, readFileSync(join(dir, file)));
  }
  const { instantiate } = await import(pathToFileURL(join(dir, `${name}.js`)).href);
  return new Component(dir, instantiate, coreModules, wasmPath);
}

/**
 * The transpiled directory for the component file at `path`: the packaged one when the
 * bytes are the packaged component's (no jco needed), else one in the user's cache
 * (transpiled with jco on first use).
 */
async function transpiledDirFor(path) {
  const bytes = readComponent(path, 'writer component');
  const packaged = readTranspiled(PACKAGED_COMPONENT_DIR);
  if (packaged?.sha256 === sha256(bytes) && packaged.patch === PATCH_VERSION) return PACKAGED_COMPONENT_DIR;
  return transpileToCache(path, bytes);
}

const promises = new Map();

/**
 * The promise `make()` returns, made once per process for `key`: a promise that
 * rejects is forgotten, so the next call for `key` tries again.
 *
 * @param {string} key
 * @param {() => Promise<T>} make
 * @returns {Promise<T>}
 * @template T
 */
export function once(key, make) {
  let promise = promises.get(key);
  if (!promise) {
    promise = make();
    promise.catch(() => promises.delete(key));
    promises.set(key, promise);
  }
  return promise;
}

/**
 * Loads and compiles the writer component, once per process and source: the packaged
 * one, or the build `wasm` (default `$DSTL_GUEST_WASM`) names (see
 * {@link locateGuestWasm}).
 *
 * @param {string} [wasm] a `dstl_guest.wasm` to run instead of the packaged component
 * @returns {Promise<Component>}
 */
export function loadComponent(wasm) {
  let path;
  try {
    path = locateGuestWasm(wasm);
  } catch (e) {
    return Promise.reject(e);
  }
  return once(`component ${path ?? ''}`, async () =>
    loadTranspiled(path === null ? PACKAGED_COMPONENT_DIR : await transpiledDirFor(path), path),
  );
}

/**
 * Loads and compiles the packaged rules component, once per process.
 *
 * @returns {Promise<Component>}
 */
export function loadRules() {
  return once('rules', () => loadTranspiled(PACKAGED_RULES_DIR, null, RULES_NAME));
}

/**
 * The message of an error a component's export threw: jco throws a `result`'s error
 * string as it is; anything else (a trap, a binding's type check) is an Error.
 *
 * @param {unknown} error
 * @returns {string}
 */
export function errorMessage(error) {
  return typeof error === 'string' ? error : String(error?.message ?? error);
}

/**
 * The memory cap of a rules instance: what it holds grows with its input (files tracked,
 * a manifest's entries), so it is bounded only by wasm32; a cap is not a reservation.
 */
const RULES_MEMORY_LIMIT = 4 * 2 ** 30;

/**
 * A new instance of the rules component (see {@link loadRules}).
 *
 * @param {Component} rules
 * @returns {object} its exports (`ownership`, `policy`, `settings`, `records`)
 */
export function instantiateRules(rules) {
  return rules.instantiate(wasiImports(new Capture()), RULES_MEMORY_LIMIT);
}

/**
 * One instance of the rules component for the process's calls that keep no state (the
 * configuration keys, the JSON records); a storage's ownership rules and upload policy
 * run in an instance of its own.
 *
 * @returns {Promise<object>} the instance's exports (`settings`, `records`, ...)
 */
export function sharedRules() {
  return once('shared rules', () => loadRules().then(instantiateRules));
}

/** The unversioned import keys of the `changelog` world, as jco looks them up. */
export const IMPORT_KEYS = Object.freeze({
  uploader: 'dstl:changelog/uploader',
  registry: 'dstl:changelog/registry',
  localRegistry: 'dstl:changelog/local-registry',
  logging: 'dstl:changelog/logging',
});

/**
 * Imports of a writer-component instance that runs no writer (the codec's): nothing of
 * them is ever called; `schedule` refuses, naming the instance.
 *
 * @param {import('./wasi.mjs').Capture} capture
 * @param {string} role what the instance is for, for the refusal
 */
export function idleImports(capture, role) {
  return {
    ...wasiImports(capture),
    [IMPORT_KEYS.uploader]: {
      schedule: () => {
        throw String(`the ${role} instance runs no writer (schedule called)`);
      },
    },
    [IMPORT_KEYS.registry]: { release: () => {}, stopTracking: () => {} },
    [IMPORT_KEYS.localRegistry]: { register: () => {}, discardUpTo: () => [] },
    [IMPORT_KEYS.logging]: { log: () => {} },
  };
}
