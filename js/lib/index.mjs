// The Node host of the dstl writer component: public API.

export { ChangelogStorage, defaultLogger } from './storage.mjs';
export { Writer } from './writer.mjs';
export { Config, KEYS, parseDuration, parseMemory } from './config.mjs';
export {
  ConfigError,
  DstlError,
  InvalidArgumentError,
  StorageClosedError,
  ReadError,
  SetupError,
  TrappedError,
  WRITER_ERROR_KINDS,
  WriterError,
} from './errors.mjs';
export { LocalStore } from './store.mjs';
export { digest, META_KEY_GROUP, readHandle } from './reader.mjs';
export { loadManifest, manifestJson, storeManifest } from './manifest.mjs';
export { CodecTrap, ComponentCodec, FormatError } from './codec.mjs';
export { capMemory, loadComponent, locateGuestWasm, PACKAGED_COMPONENT_DIR } from './component.mjs';
export { cacheDir } from './cache-dir.mjs';
