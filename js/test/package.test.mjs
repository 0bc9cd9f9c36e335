// The user's flow, end to end: `npm pack` the package, `npm install` the tarball into a
// fresh project outside the repository, and run the README's Node example and the CLI
// there with no Rust toolchain on PATH and no DSTL_GUEST_WASM; then another component
// build, which needs jco: a SetupError without it, the user's cache directory with it.
// Nothing may be written inside the installed package.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { after, test } from 'node:test';
import { promisify } from 'node:util';

import { PACKAGED_COMPONENT_DIR, PACKAGED_RULES_DIR } from '../lib/component.mjs';
import { readTranspiled, RULES_NAME, sha256 } from '../lib/transpile.mjs';
import { componentVariant } from '../support/component-variant.mjs';
import { COMMITTED_COMPONENT, COMMITTED_RULES, JS_DIR, REPO_ROOT } from '../support/repo.mjs';
import { treeSnapshot } from '../support/tree.mjs';

const run = promisify(execFile);
const base = mkdtempSync(join(tmpdir(), 'dstl-package-'));
after(() => rmSync(base, { recursive: true, force: true }));

/** Runs `file args` in `cwd`; resolves to the exit code and output, whatever the code. */
async function exec(file, args, options) {
  try {
    const { stdout, stderr } = await run(file, args, { maxBuffer: 64 << 20, ...options });
    return { code: 0, stdout, stderr };
  } catch (e) {
    if (typeof e.code !== 'number') throw e;
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** The README's Node example: the `js` block of its "Running dstl in Node" section. */
function readmeExample() {
  const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
  const start = readme.indexOf('\n## Running dstl in Node\n');
  assert.ok(start >= 0, 'README.md has a "Running dstl in Node" section');
  const end = readme.indexOf('\n## ', start + 1);
  const block = readme.slice(start, end).match(/\n```js\n([\s\S]*?)\n```\n/);
  assert.ok(block, 'that section has a js example');
  return `${block[1]}\n`;
}

/** A directory holding only a `node` link: a PATH without cargo, rustc or anything else. */
function nodeOnlyPath() {
  const bin = join(base, 'bin');
  mkdirSync(bin);
  symlinkSync(process.execPath, join(bin, 'node'));
  return bin;
}

test('npm pack, npm install into a fresh project, and the README example runs there without Rust or DSTL_GUEST_WASM', { timeout: 300_000 }, async () => {
  // `npm pack` runs `prepare`, which must find js/component/ up to date: rewriting it
  // would pull it from under the other test files running now.
  const packaged = readTranspiled(PACKAGED_COMPONENT_DIR);
  assert.ok(
    packaged && packaged.sha256 === sha256(readFileSync(COMMITTED_COMPONENT)),
    `${PACKAGED_COMPONENT_DIR} is missing or stale: run \`npm run build:component\` in js/ first`,
  );
  const packagedRules = readTranspiled(PACKAGED_RULES_DIR, RULES_NAME);
  assert.ok(
    packagedRules && packagedRules.sha256 === sha256(readFileSync(COMMITTED_RULES)),
    `${PACKAGED_RULES_DIR} is missing or stale: run \`npm run build:component\` in js/ first`,
  );

  // Pack.
  const packDir = join(base, 'pack');
  mkdirSync(packDir);
  const pack = await exec('npm', ['pack', '--json', '--pack-destination', packDir], { cwd: JS_DIR });
  assert.equal(pack.code, 0, pack.stderr);
  const [{ filename, files, size }] = JSON.parse(pack.stdout);
  assert.equal(filename, 'dstl-0.1.0.tgz');
  const paths = files.map((f) => f.path);
  for (const required of ['package.json', 'README.md', 'dstl-run.mjs', 'lib/index.mjs', 'lib/component.mjs', 'component/component.json', 'component/dstl_guest.js']) {
    assert.ok(paths.includes(required), `the tarball has ${required}`);
  }
  for (const file of packaged.files) assert.ok(paths.includes(`component/${file}`), `the tarball has component/${file}`);
  for (const file of packagedRules.files) assert.ok(paths.includes(`component-rules/${file}`), `the tarball has component-rules/${file}`);
  const unwanted = paths.filter((p) => /^(test|support|scripts|node_modules)\/|fixtures|\.test\.mjs$|^bench\.mjs$|\.tgz$/.test(p));
  assert.deepEqual(unwanted, [], 'no tests, fixtures, bench or build scripts in the tarball');
  assert.ok(size < 1 << 20, `the tarball is ${size} bytes`);

  // Install into a fresh project outside the repository.
  const app = mkdtempSync(join(tmpdir(), 'dstl-app-'));
  after(() => rmSync(app, { recursive: true, force: true }));
  assert.ok(relative(REPO_ROOT, app).startsWith('..'), `${app} is outside the repository`);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'fresh-app', version: '1.0.0', private: true, type: 'module' }, null, 2));
  const install = await exec('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', join(packDir, filename)], { cwd: app });
  assert.equal(install.code, 0, install.stderr);
  const installed = join(app, 'node_modules', 'dstl');
  assert.ok(lstatSync(installed).isDirectory(), `${installed} is a copy, not a link`);
  assert.ok(existsSync(join(app, 'node_modules', '@bytecodealliance', 'preview2-shim')), 'preview2-shim is installed');
  assert.ok(!existsSync(join(app, 'node_modules', '@bytecodealliance', 'jco')), 'jco (a devDependency) is not installed');
  assert.equal(readTranspiled(join(installed, 'component')).sha256, packaged.sha256, 'the installed component is the packaged one');
  assert.equal(readTranspiled(join(installed, 'component-rules'), RULES_NAME).sha256, packagedRules.sha256, 'the installed rules component is the packaged one');
  const before = treeSnapshot(installed);

  // Run the README's example and the CLI with node alone on PATH.
  const example = readmeExample();
  assert.match(example, /from 'dstl';/);
  writeFileSync(join(app, 'example.mjs'), example);
  const cache = join(app, 'user-cache');
  const env = { PATH: nodeOnlyPath(), HOME: app, XDG_CACHE_HOME: cache };
  const ran = await exec(process.execPath, ['example.mjs'], { cwd: app, env });
  assert.equal(ran.code, 0, ran.stderr);
  assert.equal(ran.stdout, '1 abc\n2 defg\n5 bytes\n', 'the example reads back what it appended');

  const cli = await exec(join(app, 'node_modules', '.bin', 'dstl-run'), ['--dir', 'cli-data', '--writers', '2', '--changes', '4000', '--checkpoint-every', '1000', '--compression', '--json'], { cwd: app, env });
  assert.equal(cli.code, 0, cli.stderr);
  const summary = JSON.parse(cli.stdout);
  assert.equal(summary.verified, true);
  assert.equal(summary.changes, 4000);

  // A component file with the packaged bytes needs no jco; any other build does, and
  // without jco installed that is a SetupError saying how to install it.
  const same = join(app, 'same.wasm');
  writeFileSync(same, readFileSync(COMMITTED_COMPONENT));
  const sameRun = await exec(process.execPath, ['example.mjs'], { cwd: app, env: { ...env, DSTL_GUEST_WASM: same } });
  assert.equal(sameRun.code, 0, sameRun.stderr);
  assert.equal(sameRun.stdout, '1 abc\n2 defg\n5 bytes\n');
  const other = join(app, 'other.wasm');
  writeFileSync(other, componentVariant());
  const otherRun = await exec(process.execPath, ['example.mjs'], { cwd: app, env: { ...env, DSTL_GUEST_WASM: other } });
  assert.notEqual(otherRun.code, 0);
  assert.match(otherRun.stderr, /SetupError: transpiling the writer component .*other\.wasm \(not the packaged one\) needs @bytecodealliance\/jco, which is not installed/);
  assert.match(otherRun.stderr, /npm install @bytecodealliance\/jco@1\.35\.0/);

  assert.deepEqual(treeSnapshot(installed), before, `nothing was written inside ${installed}`);
  assert.ok(!existsSync(cache), `nothing was cached (${cache})`);

  // With jco installed in the project (beside dstl, not under it: found by module
  // resolution), the other build is transpiled once into the user's cache directory.
  const addJco = await exec('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', '@bytecodealliance/jco@1.35.0'], { cwd: app });
  assert.equal(addJco.code, 0, addJco.stderr);
  assert.ok(existsSync(join(app, 'node_modules', '@bytecodealliance', 'jco')), 'jco is installed in the project');
  assert.ok(!existsSync(join(installed, 'node_modules', '@bytecodealliance', 'jco')), 'jco is not under the dstl package');
  const withJco = treeSnapshot(installed);
  for (let i = 0; i < 2; i++) {
    const transpiled = await exec(process.execPath, ['example.mjs'], { cwd: app, env: { ...env, DSTL_GUEST_WASM: other } });
    assert.equal(transpiled.code, 0, transpiled.stderr);
    assert.equal(transpiled.stdout, '1 abc\n2 defg\n5 bytes\n');
  }
  const keys = readdirSync(join(cache, 'dstl', 'components'));
  assert.equal(keys.length, 1, `one transpiled component in ${cache}: ${keys}`);
  assert.equal(readTranspiled(join(cache, 'dstl', 'components', keys[0])).sha256, sha256(readFileSync(other)));
  assert.deepEqual(treeSnapshot(installed), withJco, `nothing was written inside ${installed}`);
});
