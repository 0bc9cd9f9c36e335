// Where the repository's shared files are, for the in-repo developer flow only (the test
// suite and the build script that generates `component/`): nothing under `lib/` or the
// CLI uses this, because an installed package has no repository around it.

import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** `js/` (this file is `js/support/repo.mjs`). */
export const JS_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..');
/** The repository root. */
export const REPO_ROOT = resolve(JS_DIR, '..');
/** The canonical writer component, committed in the repository. */
export const COMMITTED_COMPONENT = join(REPO_ROOT, 'host', 'component', 'dstl_guest.wasm');
/** The canonical rules component, committed in the repository. */
export const COMMITTED_RULES = join(REPO_ROOT, 'rules', 'component', 'dstl_rules.wasm');
