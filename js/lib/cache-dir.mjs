// Where the Node host may cache what it derives at runtime: the per-user cache directory
// of the operating system, never the package's own directory (an installed package can
// be read-only, shared between projects, or replaced by the next `npm install`).

import { homedir, tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';

/**
 * The dstl cache directory: `$XDG_CACHE_HOME/dstl` when XDG_CACHE_HOME is set; otherwise
 * the platform's per-user cache (`~/.cache/dstl` on Linux and other Unixes,
 * `~/Library/Caches/dstl` on macOS, `%LOCALAPPDATA%\dstl\Cache` on Windows); without a
 * home directory, a per-user directory under the OS temporary directory. Nothing is
 * created here: callers create what they write.
 *
 * @param {NodeJS.ProcessEnv} [env]
 * @returns {string} an absolute path
 */
export function cacheDir(env = process.env) {
  if (env.XDG_CACHE_HOME) return join(env.XDG_CACHE_HOME, 'dstl');
  if (process.platform === 'win32' && env.LOCALAPPDATA) return join(env.LOCALAPPDATA, 'dstl', 'Cache');
  let home = '';
  try {
    home = homedir();
  } catch {
    // No home directory (some service accounts): fall through to the temporary directory.
  }
  if (!home) return join(tmpdir(), `dstl-cache-${safeUserName()}`);
  if (process.platform === 'darwin') return join(home, 'Library', 'Caches', 'dstl');
  return join(home, '.cache', 'dstl');
}

/** A name for the current user that is safe in a path (the uid where there is one). */
function safeUserName() {
  try {
    const { uid, username } = userInfo();
    return uid >= 0 ? String(uid) : username.replace(/[^A-Za-z0-9_.-]/g, '_');
  } catch {
    return 'unknown';
  }
}
