#!/usr/bin/env node
// Generates `component/` and `component-rules/`: the writer and rules components
// transpiled by jco and patched (`lib/transpile.mjs`), which the package ships so that an
// installed package runs them without jco and without writing anything. Run by npm's `prepare` (on `npm ci` / `npm
// install` in js/, and before `npm pack` / `npm publish`), or by hand:
//
//   node scripts/build-component.mjs [--wasm PATH] [--force]
//
// The sources are the components committed at `host/component/dstl_guest.wasm` (unless
// `--wasm` names another writer component) and `rules/component/dstl_rules.wasm`. An
// up-to-date directory (same component bytes, jco version and patches) is left as it is,
// so packing while tests use it changes nothing.

import { basename, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { DstlError } from '../lib/errors.mjs';
import { PACKAGED_COMPONENT_DIR, PACKAGED_RULES_DIR } from '../lib/component.mjs';
import { loadJco, NAME, PATCH_VERSION, readComponent, readTranspiled, RULES_NAME, sha256, transpileInto } from '../lib/transpile.mjs';
import { COMMITTED_COMPONENT, COMMITTED_RULES } from '../support/repo.mjs';

async function main() {
  const { values } = parseArgs({
    options: { wasm: { type: 'string' }, force: { type: 'boolean', default: false } },
    strict: true,
  });
  const writer = values.wasm ? resolve(values.wasm) : COMMITTED_COMPONENT;
  await build(writer, PACKAGED_COMPONENT_DIR, NAME, values.force);
  await build(COMMITTED_RULES, PACKAGED_RULES_DIR, RULES_NAME, values.force);
}

/** Transpiles the component file `source` into `out` as module `name`, unless up to date. */
async function build(source, out, name, force) {
  const bytes = readComponent(source, 'component');
  const jco = await loadJco(source);
  const current = readTranspiled(out, name);
  const fresh = current && current.sha256 === sha256(bytes) && current.jco === jco.version && current.patch === PATCH_VERSION;
  if (fresh && !force) {
    process.stderr.write(`${out} is up to date with ${source}\n`);
    return;
  }
  const meta = await transpileInto(jco, bytes, out, { replace: true, name });
  process.stderr.write(
    `transpiled ${source} (sha256 ${meta.sha256.slice(0, 16)}…) with jco ${meta.jco} into ${out}: ` +
      `${meta.files.map((f) => join(basename(out), f)).join(', ')}\n`,
  );
}

main().catch((e) => {
  process.stderr.write(`build-component: ${e instanceof DstlError ? e.message : e?.stack ?? e}\n`);
  process.exitCode = 1;
});
