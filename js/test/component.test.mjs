// Which component the host runs, and where it writes: the packaged `component/` (made by
// `npm run build:component` from the committed host/component/dstl_guest.wasm) with no
// jco and no writes; another build transpiled once into the user's cache directory, never
// into the package; clear errors for missing files.

import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, beforeEach, test } from 'node:test';

import { ChangelogStorage, SetupError, cacheDir } from '../lib/index.mjs';
import { loadComponent, loadRules, loadTranspiled, PACKAGED_COMPONENT_DIR, PACKAGED_RULES_DIR } from '../lib/component.mjs';
import { loadJco, PATCH_VERSION, readTranspiled, RULES_NAME, sha256, transpileToCache } from '../lib/transpile.mjs';
import { componentVariant } from '../support/component-variant.mjs';
import { COMMITTED_COMPONENT, COMMITTED_RULES, JS_DIR } from '../support/repo.mjs';
import { treeSnapshot } from '../support/tree.mjs';
import { Capture, wasiImports } from '../lib/wasi.mjs';

const base = mkdtempSync(join(tmpdir(), 'dstl-component-'));
const cache = join(base, 'cache');
after(() => rmSync(base, { recursive: true, force: true }));
beforeEach(() => {
  // This file decides the component itself (CI may set DSTL_GUEST_WASM for the others),
  // and keeps the cache in a directory of its own.
  delete process.env.DSTL_GUEST_WASM;
  process.env.XDG_CACHE_HOME = cache;
});

/** js/ as the tests see it, without node_modules: what a run must leave unchanged. */
const jsTree = () => treeSnapshot(JS_DIR, { skip: (rel) => rel === 'node_modules' || rel === '.git' });

async function roundTrip(wasm) {
  const storage = await ChangelogStorage.open(
    { 'dstl.dfs.base-path': mkdtempSync(join(base, 'data-')), 'dstl.dfs.compression.enabled': 'true' },
    { wasm, logger: () => {} },
  );
  const w = storage.createWriter('op', { start: 0, end: 7 });
  // 300 KiB compressed: encoded on a codec worker, which loads the same directory.
  const big = Buffer.alloc(300 * 1024, 'x');
  w.append(3, big);
  w.append(1, Buffer.from('small'));
  const snapshot = await w.persist(0, 1);
  const changes = await storage.read(snapshot.remote);
  w.close();
  await storage.close();
  assert.deepEqual(
    changes.map((c) => [c.keyGroup, c.value.length]),
    [
      [1, 5],
      [3, big.length],
    ],
  );
  return storage.component;
}

test('the packaged component is the committed host/component/dstl_guest.wasm, transpiled with the installed jco and current patches', async () => {
  const meta = readTranspiled(PACKAGED_COMPONENT_DIR);
  const hint = 'run `npm run build:component` (or `npm ci`) in js/';
  assert.ok(meta, `no generated component in ${PACKAGED_COMPONENT_DIR}: ${hint}`);
  assert.equal(meta.sha256, sha256(readFileSync(COMMITTED_COMPONENT)), `${PACKAGED_COMPONENT_DIR} was made from another component than ${COMMITTED_COMPONENT}: ${hint}`);
  assert.equal(meta.jco, (await loadJco('the check')).version, hint);
  assert.equal(meta.patch, PATCH_VERSION, hint);
});

test('the packaged rules component is the committed rules/component/dstl_rules.wasm, transpiled with the installed jco and current patches', async () => {
  const meta = readTranspiled(PACKAGED_RULES_DIR, RULES_NAME);
  const hint = 'run `npm run build:component` (or `npm ci`) in js/';
  assert.ok(meta, `no generated rules component in ${PACKAGED_RULES_DIR}: ${hint}`);
  assert.equal(meta.sha256, sha256(readFileSync(COMMITTED_RULES)), `${PACKAGED_RULES_DIR} was made from another component than ${COMMITTED_RULES}: ${hint}`);
  assert.equal(meta.jco, (await loadJco('the check')).version, hint);
  assert.equal(meta.patch, PATCH_VERSION, hint);
  // The rules component exports the rules and the policy; the writer component none of them.
  const rules = (await loadRules()).instantiate(wasiImports(new Capture()), 1 << 24);
  assert.equal(typeof rules.ownership?.TaskRefs, 'function');
  assert.equal(typeof rules.policy?.Retry, 'function');
  assert.equal(readFileSync(join(PACKAGED_COMPONENT_DIR, 'dstl_guest.js'), 'utf8').includes('TaskRefs'), false, 'the writer component exports no ownership rules');
});

test('by default the packaged component runs, with nothing transpiled or cached', async () => {
  const before = jsTree();
  const component = await roundTrip(undefined);
  assert.equal(component.dir, PACKAGED_COMPONENT_DIR);
  assert.equal(component.wasmPath, null);
  assert.ok(!existsSync(cache), `${cache} was created`);
  assert.deepEqual(jsTree(), before);
});

test('a component file with the packaged bytes (DSTL_GUEST_WASM) runs the packaged output', async () => {
  process.env.DSTL_GUEST_WASM = COMMITTED_COMPONENT;
  const component = await loadComponent();
  assert.equal(component.dir, PACKAGED_COMPONENT_DIR);
  assert.equal(component.wasmPath, COMMITTED_COMPONENT);
  assert.ok(!existsSync(cache), `${cache} was created`);
});

test('another component build is transpiled once into the user cache directory, never into the package', async () => {
  const variant = join(base, 'variant.wasm');
  const bytes = componentVariant();
  writeFileSync(variant, bytes);
  const before = jsTree();
  const component = await roundTrip(variant);
  assert.equal(component.wasmPath, variant);
  assert.ok(readdirSync(join(cache, 'dstl', 'components')).some((key) => join(cache, 'dstl', 'components', key) === component.dir), component.dir);
  const meta = readTranspiled(component.dir);
  assert.equal(meta.sha256, sha256(bytes));
  assert.equal(meta.patch, PATCH_VERSION);
  assert.ok(readFileSync(join(component.dir, 'dstl_guest.js'), 'utf8').includes('_dstlPromising('), 'the cached output is patched');
  assert.deepEqual(jsTree(), before, 'nothing under js/ changed');
  // Cached: a second transpile of the same bytes reuses the directory as it is.
  const written = statSync(join(component.dir, 'component.json')).mtimeMs;
  assert.equal(await transpileToCache(variant, bytes), component.dir);
  assert.equal(statSync(join(component.dir, 'component.json')).mtimeMs, written);
});

test('a missing component file is a SetupError naming it', async () => {
  const missing = join(base, 'nowhere', 'dstl_guest.wasm');
  await assert.rejects(loadComponent(missing), (e) => e instanceof SetupError && e.message === `writer component ${missing}: no such file`);
  process.env.DSTL_GUEST_WASM = missing;
  await assert.rejects(loadComponent(), (e) => e instanceof SetupError && e.message === `DSTL_GUEST_WASM=${missing}: no such file`);
  await assert.rejects(
    ChangelogStorage.open({ 'dstl.dfs.base-path': join(base, 'data-missing') }),
    (e) => e instanceof SetupError && e.message.includes(missing),
  );
});

test('a directory without a complete transpiled component is a SetupError naming it', async () => {
  const empty = mkdtempSync(join(base, 'empty-'));
  await assert.rejects(loadTranspiled(empty), (e) => e instanceof SetupError && e.message === `no complete transpiled writer component in ${empty}`);
  writeFileSync(join(empty, 'component.json'), JSON.stringify({ sha256: 'x', files: ['dstl_guest.js'] }));
  await assert.rejects(loadTranspiled(empty), (e) => e instanceof SetupError && e.message.includes(empty));
  // The writer component's output is not the rules component's.
  await assert.rejects(loadTranspiled(empty, null, RULES_NAME), (e) => e instanceof SetupError && e.message === `no complete transpiled rules component in ${empty}`);
});

test('the cache directory is $XDG_CACHE_HOME/dstl, else the per-user cache under the home directory', () => {
  assert.equal(cacheDir({ XDG_CACHE_HOME: '/x/cache' }), join('/x/cache', 'dstl'));
  const fallback = cacheDir({});
  if (process.platform === 'linux') assert.equal(fallback, join(homedir(), '.cache', 'dstl'));
  assert.ok(!fallback.startsWith(JS_DIR), `${fallback} is inside the package`);
});
