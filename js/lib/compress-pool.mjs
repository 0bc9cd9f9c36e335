// Snappy framing off Node's main thread: compressing a batch's logical bytes is the one
// CPU-heavy step of an upload, and on the main thread it would stall every writer (the
// wasmtime host runs it on its upload threads). Small inputs are framed inline.

import { availableParallelism } from 'node:os';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';

import { frameCompress } from './snappy.mjs';

/** Below this many bytes, framing inline is cheaper than a round trip to a worker. */
const INLINE_BELOW = 256 * 1024;

function joined(parts) {
  const total = parts.reduce((n, p) => n + p.length, 0);
  const out = new Uint8Array(total);
  let offset = 0;
  for (const part of parts) {
    out.set(part, offset);
    offset += part.length;
  }
  return out;
}

/** Worker threads that frame logical bytes as one Snappy framed stream. */
export class CompressPool {
  /** @param {number} size at most this many workers (created on demand) */
  constructor(size) {
    this.size = Math.max(1, Math.min(size, availableParallelism()));
    this.idle = [];
    this.all = [];
    this.queue = [];
    this.closed = false;
  }

  /**
   * The framed stream of `data` (which the caller gives up: its buffer may be moved).
   * @param {Uint8Array} data
   * @returns {Promise<Uint8Array>}
   */
  compress(data) {
    if (data.length < INLINE_BELOW || this.closed) return Promise.resolve(joined(frameCompress(data)));
    return new Promise((resolve, reject) => {
      this.queue.push({ data, resolve, reject });
      this.#pump();
    });
  }

  #pump() {
    while (this.queue.length > 0) {
      let worker = this.idle.pop();
      if (!worker) {
        if (this.all.length >= this.size) return;
        worker = new Worker(new URL(import.meta.url), { workerData: { dstlCompressWorker: true } });
        worker.on('error', (e) => worker.job?.reject(e));
        this.all.push(worker);
      }
      const job = this.queue.shift();
      worker.job = job;
      worker.ref();
      worker.once('message', (framed) => {
        worker.job = null;
        worker.unref();
        this.idle.push(worker);
        job.resolve(framed);
        this.#pump();
      });
      // The bytes are moved, not copied, when they own their buffer.
      const owned = job.data.byteOffset === 0 && job.data.byteLength === job.data.buffer.byteLength;
      const data = owned ? job.data : Uint8Array.from(job.data);
      worker.postMessage(data, [data.buffer]);
    }
  }

  /** Stops the workers. */
  async close() {
    this.closed = true;
    await Promise.all(this.all.map((w) => w.terminate()));
    this.all = [];
    this.idle = [];
  }
}

if (!isMainThread && workerData?.dstlCompressWorker) {
  parentPort.on('message', (data) => {
    const framed = joined(frameCompress(data));
    parentPort.postMessage(framed, [framed.buffer]);
  });
}
