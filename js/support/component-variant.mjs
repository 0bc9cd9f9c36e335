// A different build of the writer component, for tests of the runtime transpile path: the
// committed component with a custom section appended. Custom sections carry no semantics,
// so it behaves exactly as the committed one, but its bytes (hence its cache key) differ
// from the packaged component's.

import { readFileSync } from 'node:fs';

import { writeLeb } from '../lib/component.mjs';
import { COMMITTED_COMPONENT } from './repo.mjs';

/**
 * The committed component's bytes with a custom section `name` holding `data` at the end.
 * @param {string} [name]
 * @param {string} [data]
 * @returns {Buffer}
 */
export function componentVariant(name = 'dstl-test-variant', data = 'not the packaged component') {
  const nameBytes = Buffer.from(name);
  const content = Buffer.concat([Buffer.from(writeLeb(nameBytes.length)), nameBytes, Buffer.from(data)]);
  return Buffer.concat([readFileSync(COMMITTED_COMPONENT), Buffer.from([0, ...writeLeb(content.length)]), content]);
}
