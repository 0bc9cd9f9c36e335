// The public API's argument checks, shared by its modules: a bad argument is an
// InvalidArgumentError naming it and what it got, before anything reaches a component.

import { InvalidArgumentError } from './errors.mjs';

/** The largest s32: also the format's longest value. */
export const I32_MAX = 2147483647;
const U64_MAX = (1n << 64n) - 1n;
const S64_MIN = -(1n << 63n);
const S64_MAX = (1n << 63n) - 1n;

/** A u64 argument as a BigInt; numbers must be safe integers. */
export function u64(value, what) {
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return BigInt(value);
  if (typeof value === 'bigint' && value >= 0n && value <= U64_MAX) return value;
  throw new InvalidArgumentError(`${what} must be an unsigned 64-bit integer (a bigint, or a safe non-negative integer number), got ${describe(value)}`);
}

/** An s64 argument as a BigInt. */
export function s64(value, what) {
  if (typeof value === 'number' && Number.isSafeInteger(value)) return BigInt(value);
  if (typeof value === 'bigint' && value >= S64_MIN && value <= S64_MAX) return value;
  throw new InvalidArgumentError(`${what} must be a signed 64-bit integer (a bigint, or a safe integer number), got ${describe(value)}`);
}

/** Whether `value` is a number that fits an s32. */
export function isI32(value) {
  return Number.isInteger(value) && value >= -I32_MAX - 1 && value <= I32_MAX;
}

/** An s32 argument. */
export function i32(value, what) {
  if (isI32(value)) return value;
  throw new InvalidArgumentError(`${what} must be a 32-bit integer, got ${describe(value)}`);
}

/** A byte-array argument. */
export function bytes(value, what) {
  if (value instanceof Uint8Array) return value;
  throw new InvalidArgumentError(`${what} must be a Uint8Array (or Buffer), got ${describe(value)}`);
}

/** `value` as a message shows it. */
export function describe(value) {
  if (typeof value === 'string') return `the string ${JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value)}`;
  if (typeof value === 'bigint') return `${value}n`;
  if (value === null || value === undefined) return String(value);
  if (typeof value === 'object') return `a ${value.constructor?.name ?? 'object'}`;
  return `${typeof value} ${String(value)}`;
}
