// Turning a component into JS with jco, patched for speed on Node 20: the writer
// component (`dstl_guest.wasm`) or the rules component (`dstl_rules.wasm`).
//
// Two callers: `scripts/build-component.mjs`, which does it once when the package is
// packed (or `npm ci` is run in js/) and ships the results in `component/` and
// `component-rules/`, so an installed package needs no jco; and `component.mjs`, when the
// host is pointed at
// another component build (`DSTL_GUEST_WASM` or the `wasm` option) at runtime: then jco
// must be installed, and the output goes to the user's cache directory (`cache-dir.mjs`),
// never into the package.
//
// A transpiled directory holds jco's files and `component.json`, written last (inside a
// staging directory renamed into place), which records what it was made from; a
// directory without it is incomplete and never used.

import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { cacheDir } from './cache-dir.mjs';
import { SetupError } from './errors.mjs';

/** Bumped whenever the patches applied to jco's output change. */
export const PATCH_VERSION = 1;
/** The metadata file of a transpiled directory. */
export const META_FILE = 'component.json';
/** The jco version the patches were checked against (the package's devDependency). */
export const JCO_VERSION = '1.35.0';
const JCO = '@bytecodealliance/jco';
const HERE = dirname(fileURLToPath(import.meta.url));
/** The writer component's generated module: `<NAME>.js` and `<NAME>.core*.wasm`. */
export const NAME = 'dstl_guest';
/** The rules component's generated module. */
export const RULES_NAME = 'dstl_rules';

/** What the component of generated module `name` is, for messages. */
export function componentKind(name) {
  return name === RULES_NAME ? 'rules component' : 'writer component';
}

/**
 * @typedef {object} TranspiledMeta
 * @property {string} sha256 hex digest of the component it was made from
 * @property {string} jco the jco version that made it
 * @property {number} patch the {@link PATCH_VERSION} of its patches
 * @property {string[]} files the generated files, relative to its directory
 */

/** @param {Uint8Array} bytes @returns {string} hex SHA-256 */
export function sha256(bytes) {
  return createHash('sha256').update(bytes).digest('hex');
}

/**
 * The bytes of the component file `path`.
 *
 * @param {string} path
 * @param {string} what what the component is, for the error message
 * @returns {Buffer}
 * @throws {SetupError} when the file cannot be read
 */
export function readComponent(path, what) {
  try {
    return readFileSync(path);
  } catch (e) {
    throw new SetupError(`cannot read the ${what} ${path}: ${e.message}`);
  }
}

/**
 * The metadata of the transpiled directory `dir`, or null if it has none, cannot be
 * parsed, or lacks one of the files it lists (an interrupted or foreign directory).
 *
 * @param {string} dir
 * @param {string} [name] the generated module's name ({@link NAME} or {@link RULES_NAME})
 * @returns {TranspiledMeta|null}
 */
export function readTranspiled(dir, name = NAME) {
  let meta;
  try {
    meta = JSON.parse(readFileSync(join(dir, META_FILE), 'utf8'));
  } catch {
    return null;
  }
  if (typeof meta?.sha256 !== 'string' || !Array.isArray(meta.files) || !meta.files.includes(`${name}.js`)) return null;
  if (!meta.files.every((file) => existsSync(join(dir, file)))) return null;
  return meta;
}

/**
 * jco, found by normal module resolution from this package (so a hoisted or
 * application-level install is found too), imported only when something must be
 * transpiled: an installed package does not depend on it.
 *
 * @param {string} what what is to be transpiled, for the error message
 * @returns {Promise<{transpile: Function, version: string}>}
 * @throws {SetupError} when jco is not installed or cannot be loaded
 */
export async function loadJco(what) {
  let entry;
  try {
    entry = createRequire(import.meta.url).resolve(JCO);
  } catch (e) {
    throw new SetupError(
      `transpiling ${what} needs ${JCO}, which is not installed (looked up from ${HERE}): ` +
        `install it beside dstl with \`npm install ${JCO}@${JCO_VERSION}\` (${e.code ?? e.message})`,
    );
  }
  try {
    const { transpile } = await import(pathToFileURL(entry).href);
    return { transpile, version: packageVersion(entry) };
  } catch (e) {
    throw new SetupError(`transpiling ${what} needs ${JCO}, which failed to load from ${entry}: ${e.message}`);
  }
}

/** The version in the package.json of the package that holds `file`. */
function packageVersion(file) {
  for (let dir = dirname(file); dir !== dirname(dir); dir = dirname(dir)) {
    const manifest = join(dir, 'package.json');
    if (!existsSync(manifest)) continue;
    const pkg = JSON.parse(readFileSync(manifest, 'utf8'));
    if (pkg.name === JCO) return pkg.version;
  }
  throw new SetupError(`cannot find the package.json of ${JCO} above ${file}`);
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
export function patchGenerated(code) {
  const debugProbe = 'if (!globalThis?.process?.env?.JCO_DEBUG) { return; }';
  const debugCount = code.split(debugProbe).length - 1;
  const promisingCount = code.split('WebAssembly.promising(').length - 1;
  if (debugCount !== 1 || promisingCount < 1) {
    throw new SetupError(
      `jco's output changed shape (JCO_DEBUG probes: ${debugCount}, WebAssembly.promising probes: ` +
        `${promisingCount}); update patchGenerated in js/lib/transpile.mjs (checked against jco ${JCO_VERSION})`,
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
 * Transpiles the component `bytes` (`--instantiation sync`: the host passes every import
 * and compiles the core modules itself) into the directory `out`, patched. The files are
 * written into `<out>.<pid>.tmp` and renamed into place, so `out` is complete or absent.
 * An existing `out` is replaced when `replace` is set; otherwise the caller lost a race
 * to another process making the same directory, whose result is kept.
 *
 * @param {{transpile: Function, version: string}} jco from {@link loadJco}
 * @param {Uint8Array} bytes the component
 * @param {string} out
 * @param {{replace?: boolean, name?: string}} [options] `name`: the generated module's
 *   ({@link NAME}, the default, or {@link RULES_NAME})
 * @returns {Promise<TranspiledMeta>}
 * @throws {SetupError} when jco rejects the component, its output changed shape, or `out`
 *   cannot be written
 */
export async function transpileInto(jco, bytes, out, { replace = false, name = NAME } = {}) {
  const what = componentKind(name);
  let files;
  try {
    ({ files } = await jco.transpile(bytes, {
      name,
      instantiation: 'sync',
      noTypescript: true,
      emitTypescriptDeclarations: false,
      noComponentErrorWrapping: true,
      base64Cutoff: 0,
    }));
  } catch (e) {
    throw new SetupError(`jco ${jco.version} cannot transpile the ${what}: ${e?.message ?? e}`);
  }
  /** @type {TranspiledMeta} */
  const meta = { sha256: sha256(bytes), jco: jco.version, patch: PATCH_VERSION, files: Object.keys(files).sort() };
  const staging = `${out}.${process.pid}.tmp`;
  try {
    rmSync(staging, { recursive: true, force: true });
    for (const [file, content] of Object.entries(files)) {
      const target = join(staging, file);
      mkdirSync(dirname(target), { recursive: true });
      writeFileSync(target, file === `${name}.js` ? patchGenerated(Buffer.from(content).toString('utf8')) : content);
    }
    writeFileSync(join(staging, META_FILE), `${JSON.stringify(meta, null, 2)}\n`);
    if (replace && existsSync(out)) {
      const old = `${out}.${process.pid}.old`;
      renameSync(out, old);
      renameSync(staging, out);
      rmSync(old, { recursive: true, force: true });
    } else {
      try {
        renameSync(staging, out);
      } catch (e) {
        // Another process finished the same transpile first: keep its complete result.
        if (!readTranspiled(out, name)) throw e;
        rmSync(staging, { recursive: true, force: true });
      }
    }
  } catch (e) {
    rmSync(staging, { recursive: true, force: true });
    if (e instanceof SetupError) throw e;
    throw new SetupError(`cannot write the transpiled ${what} to ${out}: ${e.message}`);
  }
  return meta;
}

/**
 * The transpiled directory of the component at `wasmPath` (whose contents are `bytes`) in
 * the user's cache directory, `<cache>/components/<key>/`, keyed by the component's bytes,
 * the jco version and the patches; transpiled on first use.
 *
 * @param {string} wasmPath for messages
 * @param {Uint8Array} bytes
 * @returns {Promise<string>} the directory
 * @throws {SetupError} when jco is missing or the cache cannot be written
 */
export async function transpileToCache(wasmPath, bytes) {
  const jco = await loadJco(`the writer component ${wasmPath} (not the packaged one)`);
  const key = sha256(Buffer.from(`${sha256(bytes)} jco ${jco.version} patch ${PATCH_VERSION}`)).slice(0, 16);
  const root = join(cacheDir(), 'components');
  const out = join(root, key);
  if (readTranspiled(out)) return out;
  try {
    mkdirSync(root, { recursive: true });
  } catch (e) {
    throw new SetupError(`cannot create the cache directory ${root} for the transpiled writer component: ${e.message}`);
  }
  await transpileInto(jco, bytes, out);
  return out;
}
