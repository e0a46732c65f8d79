// The safetensors container (SPEC 6.3-6.5), its agreement with the manifest (SPEC 7.2 rule 5),
// and writing a plain safetensors file (the adapter's output). Works on bytes: no Node APIs.

import { byteCount, DTYPE_BITS } from "./dtypes";
import { fail, MAX_DIMS, MAX_JSON_DEPTH, MAX_SAFETENSORS_HEADER_BYTES, MAX_SIZE, show } from "./errors";
import { decodeUtf8, isArray, isObject, JsonError, JValue, parseJson } from "./json";

export interface Entry { name: string; dtype: string; shape: bigint[]; begin: bigint; end: bigint }

/** SPEC 6.3 rule 1: the header length N from the first 8 bytes. */
export function headerLength(first8: Uint8Array, fileSize: bigint, file: string): bigint {
  if (fileSize < 8n || first8.length < 8) fail("st-header-length", `${file}: shorter than 8 bytes`, "6.3");
  const n = new DataView(first8.buffer, first8.byteOffset, 8).getBigUint64(0, true);
  if (n > MAX_SAFETENSORS_HEADER_BYTES) fail("st-header-length", `${file}: header length ${n} is over ${MAX_SAFETENSORS_HEADER_BYTES}`, "6.3");
  if (8n + n > fileSize) fail("st-header-length", `${file}: header length ${n} runs past the end of the file (${fileSize} bytes)`, "6.3");
  return n;
}

function isInt(v: JValue | undefined, max: bigint = MAX_SIZE): v is bigint {
  return typeof v === "bigint" && v >= 0n && v <= max;
}

/** SPEC 6.3 rules 2-7 for a header of a file whose data region has `dataLength` bytes. */
export function parseHeader(header: Uint8Array, dataLength: bigint, file: string): Entry[] {
  // Rule 2: first byte '{', UTF-8, one JSON object, only spaces after it.
  if (header[0] !== 0x7b) fail("st-header-json", `${file}: the header does not start with '{'`, "6.3");
  let root: JValue;
  try {
    root = parseJson(decodeUtf8(header), { maxDepth: MAX_JSON_DEPTH, trailing: "spaces" });
  } catch (e) {
    if (!(e instanceof JsonError)) throw e;
    // Rule 3: duplicate names; everything else breaks rule 2.
    if (e.problem === "duplicate") fail("st-duplicate-key", `${file}: header: ${e.message}`, "6.3");
    fail("st-header-json", `${file}: header: ${e.message}`, "6.3");
  }
  if (!isObject(root)) fail("st-header-json", `${file}: the header is not a JSON object`, "6.3");
  const entries: Entry[] = [];
  for (const [name, v] of root) {
    if (name === "__metadata__") {
      // Rule 4.
      if (!isObject(v) || [...v.values()].some((x) => typeof x !== "string")) {
        fail("st-metadata", `${file}: __metadata__ is not an object of strings`, "6.3");
      }
      continue;
    }
    // Rule 5.
    const bad: (why: string) => never = (why) => fail("st-entry", `${file}: entry ${JSON.stringify(name)}: ${why}`, "6.3");
    if (!isObject(v)) bad("not an object");
    const keys = [...v.keys()];
    if (keys.length !== 3 || !v.has("dtype") || !v.has("shape") || !v.has("data_offsets")) {
      bad(`members ${show(keys)}, not exactly dtype, shape, data_offsets`);
    }
    const dtype = v.get("dtype");
    const shape = v.get("shape");
    const offsets = v.get("data_offsets");
    if (!isArray(shape) || shape.length > MAX_DIMS || !shape.every((d) => isInt(d))) bad("shape is not an array of at most 64 integers in 0..MAX_SIZE");
    if (!isArray(offsets) || offsets.length !== 2 || !isInt(offsets[0]) || !isInt(offsets[1]) || offsets[0] > offsets[1]) {
      bad("data_offsets is not [begin, end] with 0 <= begin <= end <= MAX_SIZE");
    }
    if (typeof dtype !== "string") bad("dtype is not a string");
    if (!DTYPE_BITS.has(dtype)) fail("st-dtype", `${file}: entry ${JSON.stringify(name)}: unknown dtype ${JSON.stringify(dtype)}`, "6.4");
    const entry: Entry = { name, dtype, shape: shape as bigint[], begin: offsets[0] as bigint, end: offsets[1] as bigint };
    // Rule 6.
    const bytes = byteCount(dtype, entry.shape);
    if (typeof bytes === "string") fail("st-size", `${file}: entry ${JSON.stringify(name)}: ${bytes}`, "6.5");
    if (entry.end - entry.begin !== bytes) {
      fail("st-size", `${file}: entry ${JSON.stringify(name)} spans ${entry.end - entry.begin} bytes; ${dtype} ${show(entry.shape)} needs ${bytes}`, "6.3");
    }
    entries.push(entry);
  }
  // Rule 7: no overlap, no hole, no trailing byte.
  const sorted = [...entries].sort((a, b) => (a.begin !== b.begin ? (a.begin < b.begin ? -1 : 1) : a.end < b.end ? -1 : a.end > b.end ? 1 : 0));
  let position = 0n;
  for (const e of sorted) {
    if (e.begin !== position) {
      fail("st-offsets", `${file}: entry ${JSON.stringify(e.name)} begins at ${e.begin}, expected ${position} (overlap or hole)`, "6.3");
    }
    position = e.end;
  }
  if (position !== dataLength) fail("st-offsets", `${file}: entries end at ${position}; the data region has ${dataLength} bytes`, "6.3");
  return entries;
}

export interface Expected { name: string; dtype: string; shape: bigint[] }

/** SPEC 7.2 rule 5: the header agrees with the pieces the manifest places in the file. */
export function checkAgreement(entries: Entry[], expected: Expected[], file: string): Map<string, Entry> {
  const byName = new Map(entries.map((e) => [e.name, e]));
  for (const x of expected) {
    const e = byName.get(x.name);
    if (e === undefined) fail("st-missing-tensor", `${file} has no entry ${JSON.stringify(x.name)}`, "7.2");
    if (e.dtype !== x.dtype || e.shape.length !== x.shape.length || e.shape.some((d, i) => d !== x.shape[i])) {
      fail("st-mismatch", `${file}: entry ${JSON.stringify(x.name)} is ${e.dtype} ${show(e.shape)}; the manifest says ${x.dtype} ${show(x.shape)}`, "7.2");
    }
  }
  const names = new Set(expected.map((x) => x.name));
  for (const e of entries) {
    if (!names.has(e.name)) fail("st-extra-tensor", `${file} holds ${JSON.stringify(e.name)}, which the manifest does not place there`, "7.2");
  }
  return byName;
}

export interface OutTensor { name: string; dtype: string; shape: bigint[]; data: Uint8Array }

/** A plain safetensors file: header padded with spaces to a multiple of 8 (SPEC 6.3 rule 8). */
export function buildSafetensors(tensors: OutTensor[]): Uint8Array[] {
  let offset = 0;
  const parts: string[] = [];
  for (const t of tensors) {
    const end = offset + t.data.length;
    parts.push(`${JSON.stringify(t.name)}:{"dtype":${JSON.stringify(t.dtype)},"shape":[${t.shape.join(",")}],"data_offsets":[${offset},${end}]}`);
    offset = end;
  }
  let header = new TextEncoder().encode(`{${parts.join(",")}}`);
  const padded = Math.ceil((8 + header.length) / 8) * 8 - 8;
  if (padded !== header.length) {
    const h = new Uint8Array(padded).fill(0x20);
    h.set(header);
    header = h;
  }
  const prefix = new Uint8Array(8);
  new DataView(prefix.buffer).setBigUint64(0, BigInt(header.length), true);
  return [prefix, header, ...tensors.map((t) => t.data)];
}
