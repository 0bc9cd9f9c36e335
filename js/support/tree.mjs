// A directory's files with their sizes and modification times, to show that running
// something wrote nothing inside it.

import { lstatSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';

/**
 * Every entry under `root` (not following links), as `path size mtime` lines, sorted.
 * @param {string} root
 * @param {{skip?: (relativePath: string) => boolean}} [options] entries to leave out
 * @returns {string[]}
 */
export function treeSnapshot(root, { skip = () => false } = {}) {
  const lines = [];
  const walk = (dir) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      const rel = relative(root, path);
      if (skip(rel)) continue;
      const stat = lstatSync(path);
      lines.push(`${rel} ${entry.isDirectory() ? 'dir' : stat.size} ${stat.mtimeMs}`);
      if (entry.isDirectory()) walk(path);
    }
  };
  walk(root);
  return lines.sort();
}
