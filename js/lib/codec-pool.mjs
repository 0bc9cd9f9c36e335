// Encoding changelog files off Node's main thread. Laying a batch into a file (copying its
// blocks into the codec's sandbox and the file out, and Snappy framing when compressed)
// costs about a nanosecond per byte, the one CPU-heavy step of an upload; on the main
// thread it delays every writer's appends (the wasmtime host runs it on its upload
// threads). Batches of 256 KiB and more are encoded on worker threads, each with a codec
// instance of its own (`codec.mjs`); smaller ones by the main thread's codec, where a
// round trip to a worker would cost more than it saves.

import { availableParallelism } from 'node:os';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';

import { CodecTrap, ComponentCodec, FormatError } from './codec.mjs';
import { loadTranspiled } from './component.mjs';

/** Below this many bytes of blocks, encoding inline is cheaper than a worker round trip. */
const INLINE_BELOW = 256 * 1024;

/** True when `bytes` is the whole of its buffer, so moving the buffer moves only it. */
function ownsBuffer(bytes) {
  return bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength && !(bytes.buffer instanceof SharedArrayBuffer);
}

/** Worker threads that encode changelog files with the component's `files.encode-file`. */
export class CodecPool {
  /**
   * @param {ComponentCodec} codec the main thread's codec (small batches)
   * @param {number} size at most this many workers (created on demand), and at most one per
   *   core besides the main thread's
   */
  constructor(codec, size) {
    this.codec = codec;
    this.size = Math.max(1, Math.min(size, availableParallelism() - 1));
    this.idle = [];
    this.all = [];
    this.queue = [];
    this.closed = false;
  }

  /**
   * The file holding `blocks` in order. The caller gives the blocks up: their buffers
   * may be moved to a worker.
   * @param {Uint8Array[]} blocks
   * @param {boolean} compression
   * @returns {Promise<{bytes: Uint8Array, offsets: BigUint64Array, logicalSize: bigint}>}
   *   rejects with a {@link FormatError} or {@link CodecTrap}
   */
  async encode(blocks, compression) {
    let total = 0;
    for (const block of blocks) total += block.length;
    if (total < INLINE_BELOW || this.closed) return this.codec.encodeFile(blocks, compression);
    return new Promise((resolve, reject) => {
      this.queue.push({ blocks, compression, resolve, reject });
      this.#pump();
    });
  }

  #spawn() {
    const worker = new Worker(new URL(import.meta.url), {
      workerData: { dstlCodecWorker: true, dir: this.codec.component.dir, wasm: this.codec.component.wasmPath },
    });
    worker.job = null;
    const gone = (error) => {
      this.all = this.all.filter((w) => w !== worker);
      this.idle = this.idle.filter((w) => w !== worker);
      const job = worker.job;
      worker.job = null;
      job?.reject(new CodecTrap(`codec worker failed: ${error?.message ?? error}`));
      this.#pump();
    };
    worker.on('error', gone);
    worker.on('exit', (code) => gone(`exited with code ${code}`));
    worker.on('message', (reply) => {
      const job = worker.job;
      worker.job = null;
      worker.unref();
      this.idle.push(worker);
      if (reply.file) job.resolve(reply.file);
      else job.reject(reply.format ? new FormatError(reply.message) : new CodecTrap(reply.message));
      this.#pump();
    });
    this.all.push(worker);
    return worker;
  }

  #pump() {
    while (this.queue.length > 0 && !this.closed) {
      let worker = this.idle.pop();
      if (!worker) {
        if (this.all.length >= this.size) return;
        worker = this.#spawn();
      }
      const job = this.queue.shift();
      worker.job = job;
      worker.ref();
      // Buffers a block owns are moved, not copied; a view into a buffer of other data
      // (or one already moved) is copied into a buffer of its own first, then moved.
      const moved = new Set();
      const blocks = job.blocks.map((block) => {
        const own = ownsBuffer(block) && !moved.has(block.buffer) ? block : new Uint8Array(block);
        moved.add(own.buffer);
        return own;
      });
      worker.postMessage({ blocks, compression: job.compression }, [...moved]);
    }
  }

  /** Stops the workers; jobs still queued fail, later encodes run inline. */
  async close() {
    this.closed = true;
    for (const job of this.queue.splice(0)) job.reject(new CodecTrap('the codec pool was closed'));
    const workers = this.all.splice(0);
    this.idle = [];
    await Promise.all(workers.map((w) => w.terminate()));
  }
}

if (!isMainThread && workerData?.dstlCodecWorker) {
  // The same transpiled directory as the main thread's component: nothing to locate again.
  const codec = loadTranspiled(workerData.dir, workerData.wasm).then((component) => new ComponentCodec(component));
  parentPort.on('message', async ({ blocks, compression }) => {
    // The blocks' buffers go back with the reply: a worker's isolate collects garbage
    // only when its own heap or external memory grows enough, so buffers dropped here
    // would stay resident for many batches; the main thread's collector frees them soon.
    const spent = [...new Set(blocks.map((b) => b.buffer))];
    try {
      const file = (await codec).encodeFile(blocks, compression);
      parentPort.postMessage({ file, spent }, [file.bytes.buffer, file.offsets.buffer, ...spent]);
    } catch (e) {
      parentPort.postMessage({ format: e instanceof FormatError, message: e?.message ?? String(e), spent }, spent);
    }
  });
}
