// Findings (SPEC 1.1, 13) and the limits of SPEC 12. No Node APIs: runs in a browser too.

export const MAX_MANIFEST_BYTES = 268435456n;
export const MAX_JSON_DEPTH = 64;
export const MAX_SAFETENSORS_HEADER_BYTES = 100000000n;
export const MAX_DIMS = 64;
export const MAX_NAME_BYTES = 1024;
export const MAX_PATH_BYTES = 1024;
export const MAX_WORLD_SIZE = 65536;
export const MAX_SIZE = 9223372036854775807n; // 2^63 - 1
export const MANIFEST_NAME = "shardspec.json";
export const SUPPORTED_MAJOR = 1;
export const SUPPORTED_MINOR = 3;

/** An error finding: the reader stops and returns no tensor (SPEC 1.1). */
export class SpecError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly section: string,
  ) {
    super(message);
    this.name = "SpecError";
  }

  toString(): string {
    return `error [${this.code}] ${this.message} (SPEC ${this.section})`;
  }
}

/** A warning finding: the reader continues and reports it (SPEC 1.1). */
export interface Warning {
  code: string;
  message: string;
  section: string;
}

export function fail(code: string, message: string, section: string): never {
  throw new SpecError(code, message, section);
}

const encoder = new TextEncoder();

/** Length of a string in UTF-8 bytes (SPEC 2.2 rule 1, 7.1 rule 2). */
export function utf8Length(s: string): number {
  return encoder.encode(s).length;
}

/** Length in Unicode code points, as JSON Schema's minLength/maxLength count. */
export function codePointLength(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) i++;
    }
    n++;
  }
  return n;
}

/** Product of dimensions, overflow-checked against MAX_SIZE (SPEC 1.1, 7.1 rule 4). Null: overflow. */
export function product(dims: readonly bigint[]): bigint | null {
  // SPEC 7.1 rule 4: in order, every partial product within MAX_SIZE ([2^62, 4, 0] overflows)
  let n = 1n;
  for (const d of dims) {
    n *= d;
    if (n > MAX_SIZE) return null;
  }
  return n;
}

/** JSON text for diagnostics, safe for bigint. */
export function show(v: unknown): string {
  return JSON.stringify(v, (_k, x: unknown) => (typeof x === "bigint" ? x.toString() : x));
}
