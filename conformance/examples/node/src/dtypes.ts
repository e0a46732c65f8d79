// Dtypes (SPEC 6.4) and byte counts with sub-byte packing (SPEC 6.5). No Node APIs.

import { MAX_SIZE, product } from "./errors";

export const DTYPES = [
  "BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64",
  "F16", "BF16", "F32", "F64", "C64",
  "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
  "F4", "F6_E2M3", "F6_E3M2",
] as const;
/** Bits per element of each dtype (SPEC 6.4). */
export const DTYPE_BITS: ReadonlyMap<string, bigint> = new Map([
  ["BOOL", 8n], ["U8", 8n], ["I8", 8n], ["I16", 16n], ["U16", 16n], ["I32", 32n], ["U32", 32n],
  ["I64", 64n], ["U64", 64n], ["F16", 16n], ["BF16", 16n], ["F32", 32n], ["F64", 64n], ["C64", 64n],
  ["F8_E4M3", 8n], ["F8_E5M2", 8n], ["F8_E8M0", 8n], ["F8_E4M3FNUZ", 8n], ["F8_E5M2FNUZ", 8n],
  ["F4", 4n], ["F6_E2M3", 6n], ["F6_E3M2", 6n],
]);

/**
 * SPEC 7.1 rule 4: the element count and the bit count of a tensor's shape are both at most
 * MAX_SIZE (a tensor's shape, unlike a stored array, need not fill whole bytes).
 */
export function bitsFit(dtype: string, shape: readonly bigint[]): boolean {
  const bits = DTYPE_BITS.get(dtype);
  const count = product(shape);
  return bits !== undefined && count !== null && count * bits <= MAX_SIZE;
}

/**
 * Byte count of an array of `shape` elements (SPEC 6.5 rule 2): the bit count must be a
 * multiple of 8 and at most MAX_SIZE, overflow-checked. Returns a reason string on failure.
 */
export function byteCount(dtype: string, shape: readonly bigint[]): bigint | string {
  const bits = DTYPE_BITS.get(dtype);
  if (bits === undefined) return `unknown dtype ${dtype}`;
  const count = product(shape);
  if (count === null) return "element count above MAX_SIZE";
  const total = count * bits;
  if (total > MAX_SIZE) return "bit count above MAX_SIZE";
  if (total % 8n !== 0n) return `bit count ${total} is not a multiple of 8`;
  return total / 8n;
}
