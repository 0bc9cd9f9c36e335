#!/usr/bin/env node
// Generates `component/`: the writer component transpiled by jco and patched
// (`lib/transpile.mjs`), which the package ships so that an installed package runs it
// without jco and without writing anything. Run by npm's `prepare` (on `npm ci` / `npm
// install` in js/, and before `npm pack` / `npm publish`), or by hand:
//
//   node scripts/build-component.mjs [--wasm PATH] [--force]
//
// The source is the component committed at `host/component/dstl_guest.wasm` unless
// `--wasm` names another. An up-to-date `component/` (same component bytes, jco version
// and patches) is left as it is, so packing while tests use it changes nothing.

import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { DstlError, SetupError } from '../lib/errors.mjs';
import { PACKAGED_COMPONENT_DIR } from '../lib/component.mjs';
import { loadJco, PATCH_VERSION, readTranspiled, sha256, transpileInto } from '../lib/transpile.mjs';
import { COMMITTED_COMPONENT } from '../support/repo.mjs';

async function main() {
  const { values } = parseArgs({
    options: { wasm: { type: 'string' }, force: { type: 'boolean', default: false } },
    strict: true,
  });
  const source = values.wasm ? resolve(values.wasm) : COMMITTED_COMPONENT;
  let bytes;
  try {
    bytes = readFileSync(source);
  } catch (e) {
    throw new SetupError(`cannot read the writer component ${source}: ${e.message}`);
  }
  const jco = await loadJco(source);
  const current = readTranspiled(PACKAGED_COMPONENT_DIR);
  const fresh = current && current.sha256 === sha256(bytes) && current.jco === jco.version && current.patch === PATCH_VERSION;
  if (fresh && !values.force) {
    process.stderr.write(`${PACKAGED_COMPONENT_DIR} is up to date with ${source}\n`);
    return;
  }
  const meta = await transpileInto(jco, bytes, PACKAGED_COMPONENT_DIR, { replace: true });
  process.stderr.write(
    `transpiled ${source} (sha256 ${meta.sha256.slice(0, 16)}…) with jco ${meta.jco} into ${PACKAGED_COMPONENT_DIR}: ` +
      `${meta.files.map((f) => join('component', f)).join(', ')}\n`,
  );
}

main().catch((e) => {
  process.stderr.write(`build-component: ${e instanceof DstlError ? e.message : e?.stack ?? e}\n`);
  process.exitCode = 1;
});
