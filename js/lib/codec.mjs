// The changelog file format, from the one place that defines it: the writer component's
// `files` and `reader` exports (the Rust codec compiled into the component; the format is
// described in ARCHITECTURE.md, "The file format"). The Node host knows no byte of the
// format itself: it asks a component instance of its own to lay change-set blocks into a
// file (`files.encode-file`: the flag byte, then the blocks, one Snappy framed stream when
// compressed) and to turn files back into changes (`reader.read-file`). Format errors
// are the component's messages. The words of writer errors come from the same instance
// (`errors.describe`), so the host writes none of its own.
//
// The instance is a codec only: it never creates a writer, so its imports are never
// called, and no writer instance's exports are ever called from inside one of its
// imports (which would re-enter that guest).

import { idleImports, loadComponent, once } from './component.mjs';
import { Capture } from './wasi.mjs';

/** The codec's memory is bounded only by wasm32: a file must never be too big to write. */
const MEMORY_LIMIT = 4 * 2 ** 30;
/**
 * Linear memory cannot shrink: an instance whose memory grew past this (a large file)
 * is dropped after the call and a fresh one made on the next, so its pages are returned.
 */
const KEEP_MEMORY_BELOW = 64 * 2 ** 20;

/** A changelog file or change set the component's codec rejected; `message` is the codec's. */
export class FormatError extends Error {
  name = 'FormatError';
}

/**
 * The codec's sandbox trapped (a guest panic, memory exhausted; the instance was dropped)
 * or answered something that does not add up.
 */
export class CodecTrap extends Error {
  name = 'CodecTrap';
}

/** Bytes as one view (jco lowers any TypedArray or ArrayBuffer view as it is). */
function view(bytes, what) {
  if (bytes instanceof Uint8Array) return bytes;
  if (ArrayBuffer.isView(bytes)) return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  throw new TypeError(`${what} must be a Uint8Array`);
}

/**
 * The component's codec in a sandbox of its own (`host/src/sandbox/codec.rs` is the Rust
 * host's counterpart). Every method is synchronous and runs on the calling thread.
 */
export class ComponentCodec {
  /** @param {import('./component.mjs').Component} component */
  constructor(component) {
    this.component = component;
    this.live = null;
  }

  /**
   * A codec over the packaged component, or over the build `wasmPath` (default
   * `$DSTL_GUEST_WASM`) names: see `loadComponent`.
   * @param {string} [wasmPath]
   * @returns {Promise<ComponentCodec>}
   */
  static async open(wasmPath) {
    return new ComponentCodec(await loadComponent(wasmPath));
  }

  #instance() {
    if (!this.live) {
      const capture = new Capture();
      const root = this.component.instantiate(idleImports(capture, 'codec'), MEMORY_LIMIT);
      this.live = { root, capture, memory: root.memory };
    }
    return this.live;
  }

  #call(what, fn) {
    const live = this.#instance();
    try {
      return fn(live.root);
    } catch (e) {
      // jco throws the `err` case of a result as its string: the codec's message.
      if (typeof e === 'string') throw new FormatError(e);
      // Anything else trapped the instance, which stays unusable: drop it.
      this.live = null;
      const printed = live.capture.text();
      throw new CodecTrap(`codec sandbox trapped in ${what}: ${e?.message ?? e}${printed ? `; the guest printed: ${printed}` : ''}`);
    } finally {
      if (this.live === live && live.memory && live.memory.buffer.byteLength > KEEP_MEMORY_BELOW) this.live = null;
    }
  }

  /**
   * A changelog file holding `blocks` in order.
   * @param {Uint8Array[]} blocks change-set blocks as the writer encoded them
   * @param {boolean} compression
   * @returns {{bytes: Uint8Array, offsets: BigUint64Array, logicalSize: bigint}} the file's
   *   bytes (a buffer of its own), each block's logical offset, and the logical length
   * @throws {FormatError|CodecTrap}
   */
  encodeFile(blocks, compression) {
    const views = blocks.map((b, i) => view(b, `block [${i}]`));
    return this.#call('encode-file', (root) => root.files.encodeFile(views, !!compression));
  }

  /**
   * The layout of an uncompressed file of blocks of these sizes, for writing the blocks
   * as they are: `header` first, then the blocks in order.
   * @param {number[]} sizes each block's length in bytes
   * @returns {{header: Uint8Array, offsets: BigUint64Array, logicalSize: bigint}}
   * @throws {CodecTrap}
   */
  layoutPlainFile(sizes) {
    const lengths = BigUint64Array.from(sizes, (n) => BigInt(n));
    return this.#call('layout-plain-file', (root) => root.files.layoutPlainFile(lengths));
  }

  /**
   * The words of a writer error (`errors.describe`: dstl-proto's `error` module, what
   * every host prints), without the writer's name.
   * @param {import('./errors.mjs').WriterErrorValue} error the WIT `writer-error` value
   * @param {string | undefined} upload the host's words for the failed upload task the
   *   error names ({@link import('./errors.mjs').failedTask}), if it knows them
   * @returns {string}
   * @throws {CodecTrap}
   */
  describeError(error, upload) {
    return this.#call('describe', (root) => root.errors.describe(error, upload));
  }

  /**
   * The changes of the change sets at `offsets` of the changelog file `path`, one list
   * per offset in the order given (`reader.read-file`): `file` is the fetch, its bytes or
   * the I/O error's message; `logicalSize` the length the handle records. The error,
   * naming the file and the offset, is the reader's (dstl-proto's `read`). Values are
   * views into one buffer per call.
   * @param {string} path
   * @param {{tag: 'ok', val: Uint8Array}|{tag: 'err', val: string}} file
   * @param {bigint} logicalSize
   * @param {bigint[]} offsets
   * @returns {{keyGroup: number, value: Uint8Array}[][]}
   * @throws {FormatError|CodecTrap}
   */
  readFile(path, file, logicalSize, offsets) {
    const fetched = file.tag === 'ok' ? { tag: 'ok', val: view(file.val, 'file') } : file;
    const packed = this.#call('read-file', (root) => root.reader.readFile(path, fetched, logicalSize, BigUint64Array.from(offsets)));
    // Columns, copied out once (WIT `packed-changes`): each change a view into `data`.
    const { counts, keyGroups, lengths, data } = packed;
    const sum = (column) => column.reduce((a, b) => a + b, 0);
    if (sum(counts) !== keyGroups.length || lengths.length !== keyGroups.length || sum(lengths) !== data.length) {
      throw new CodecTrap(`the codec's read-file returned change columns that do not add up (${path})`);
    }
    let change = 0;
    let at = 0;
    return Array.from(counts, (count) => {
      const set = new Array(count);
      for (let k = 0; k < count; k++, change++) {
        set[k] = { keyGroup: keyGroups[change], value: data.subarray(at, (at += lengths[change])) };
      }
      return set;
    });
  }
}

/**
 * A codec shared by readers that were given none, over the packaged component (or the
 * build `$DSTL_GUEST_WASM` names).
 * @returns {Promise<ComponentCodec>}
 */
export function sharedCodec() {
  return once('shared codec', () => ComponentCodec.open());
}
