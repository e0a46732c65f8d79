// The manifest's structure: version rules (SPEC 4.2), the JSON Schema
// schema/manifest.schema.json implemented by hand (SPEC 3.5), unknown fields (SPEC 4.3).
// Produces a typed manifest. No Node APIs.

import { codePointLength, fail, MAX_NAME_BYTES, MAX_SIZE, SUPPORTED_MAJOR, SUPPORTED_MINOR, utf8Length, Warning } from "./errors";
import { DTYPES } from "./dtypes";
import { isArray, isObject, JObject, JValue } from "./json";

export const RANK_ORDERS = ["pp-ep-tp", "pp-tp-ep", "ep-pp-tp", "ep-tp-pp", "tp-pp-ep", "tp-ep-pp"] as const;

export interface FileRecord { path: string; size: bigint; checksums: Map<string, string> }
export interface Layout { tp_size: number; pp_size: number; ep_size: number; world_size: number; rank_order: string }
export interface RankRecord { rank: number; tp_rank: number; pp_rank: number; ep_rank: number; files: FileRecord[] }
export interface Logical { dtype: string; shape: bigint[] }
export interface Tie { tensor: string; block: bigint[] | null; axes: number[] | null }
/** A piece; rank-local pieces have offset null and replica 0 (SPEC 7.2 rule 1, 7.5). */
export interface Piece { rank: number; file: string; offset: bigint[] | null; shape: bigint[]; replica: number }
export type TensorRecord =
  | { kind: "global"; dtype: string; shape: bigint[]; logical: Logical | null; tiedTo: Tie | null; pieces: Piece[] }
  | { kind: "local"; dtype: string; logical: Logical | null; pieces: Piece[] }
  | { kind: "alias"; aliasOf: string };
export interface Extension { mustUnderstand: boolean }
export interface Manifest {
  formatVersion: string;
  layout: Layout;
  ranks: RankRecord[];
  quantization: { method: string };
  tensors: Map<string, TensorRecord>;
  extraFiles: FileRecord[];
  extensions: Map<string, Extension>;
}

const VERSION = /^(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})$/;

/**
 * SPEC 4.2: read format_version before the schema. Returns whether the manifest is of a newer
 * minor version (then unknown fields are warnings, 4.3 rule 3).
 */
export function checkVersion(root: JValue, warnings: Warning[]): boolean {
  if (!isObject(root)) fail("schema", "the manifest is not a JSON object", "3.2");
  const v = root.get("format_version");
  if (typeof v !== "string") return false; // absent or malformed: the schema reports it (4.2 rule 1)
  const m = VERSION.exec(v);
  if (m === null) return false;
  const major = Number(m[1]);
  const minor = Number(m[2]);
  if (major !== SUPPORTED_MAJOR) {
    fail("version-major", `format_version ${v}: this reader implements major version ${SUPPORTED_MAJOR}`, "4.2");
  }
  if (minor > SUPPORTED_MINOR) {
    warnings.push({ code: "version-newer-minor", message: `format_version ${v} is newer than ${SUPPORTED_MAJOR}.${SUPPORTED_MINOR}: unknown fields are ignored`, section: "4.2" });
    return true;
  }
  return false;
}

class Validator {
  constructor(
    private readonly newerMinor: boolean,
    private readonly warnings: Warning[],
  ) {}

  err(where: string, what: string): never {
    return fail("schema", `${where}: ${what}`, "3.5");
  }

  /** additionalProperties: false and required, with unknown fields per SPEC 4.3. */
  members(obj: JObject, where: string, required: readonly string[], optional: readonly string[]): void {
    for (const r of required) if (!obj.has(r)) this.err(where, `missing required member "${r}"`);
    for (const k of obj.keys()) {
      if (required.includes(k) || optional.includes(k)) continue;
      if (this.newerMinor) {
        this.warnings.push({ code: "unknown-field", message: `${where}: unknown member ${JSON.stringify(k)} ignored`, section: "4.3" });
      } else {
        this.err(where, `unknown member ${JSON.stringify(k)}`);
      }
    }
  }

  object(v: JValue | undefined, where: string): JObject {
    if (!isObject(v)) this.err(where, "must be an object");
    return v;
  }

  array(v: JValue | undefined, where: string, minItems = 0, maxItems = Infinity): JValue[] {
    if (!isArray(v)) this.err(where, "must be an array");
    if (v.length < minItems) this.err(where, `must have at least ${minItems} items`);
    if (v.length > maxItems) this.err(where, `must have at most ${maxItems} items`);
    return v;
  }

  string(v: JValue | undefined, where: string, pattern?: RegExp, maxLength?: number, minLength = 0): string {
    if (typeof v !== "string") this.err(where, "must be a string");
    const len = codePointLength(v);
    if (len < minLength) this.err(where, `must have at least ${minLength} characters`);
    if (maxLength !== undefined && len > maxLength) this.err(where, `must have at most ${maxLength} characters`);
    if (pattern !== undefined && !pattern.test(v)) this.err(where, `must match ${pattern.source}`);
    return v;
  }

  /** An integer token (SPEC 3.3 rule 3) in [min, max]. */
  integer(v: JValue | undefined, where: string, min: bigint, max: bigint): bigint {
    if (typeof v !== "bigint") this.err(where, "must be an integer");
    if (v < min || v > max) this.err(where, `must be in ${min}..${max}`);
    return v;
  }

  small(v: JValue | undefined, where: string, min: number, max: number): number {
    return Number(this.integer(v, where, BigInt(min), BigInt(max)));
  }

  enumeration(v: JValue | undefined, where: string, values: readonly string[]): string {
    if (typeof v !== "string" || !values.includes(v)) this.err(where, `must be one of ${values.join(", ")}`);
    return v;
  }

  shape(v: JValue | undefined, where: string): bigint[] {
    return this.array(v, where, 0, 64).map((d, i) => this.integer(d, `${where}[${i}]`, 0n, MAX_SIZE));
  }

  /** The "path" definition (SPEC 2.2 rules 2-4, 1024 characters). */
  path(v: JValue | undefined, where: string): string {
    const p = this.string(v, where, undefined, 1024, 1);
    if (p.includes("\\") || p.includes("\u0000")) this.err(where, "a path contains no backslash and no NUL");
    for (const seg of p.split("/")) {
      if (seg === "" || seg === "." || seg === "..") this.err(where, `invalid path ${JSON.stringify(p)}`);
    }
    return p;
  }

  /** The "tensor_name" definition; the byte limit of SPEC 7.1 rule 2 is error schema too. */
  tensorName(v: JValue | undefined, where: string): string {
    const s = this.string(v, where, undefined, 1024, 1);
    if (s === "__metadata__") this.err(where, "__metadata__ is reserved (SPEC 7.1)");
    if (utf8Length(s) > MAX_NAME_BYTES) this.err(where, `name over ${MAX_NAME_BYTES} UTF-8 bytes (SPEC 7.1)`);
    return s;
  }

  checksums(v: JValue | undefined, where: string): Map<string, string> {
    const o = this.object(v, where);
    if (!o.has("sha256")) this.err(where, 'missing required member "sha256"');
    const out = new Map<string, string>();
    for (const [k, x] of o) {
      this.string(k, `${where} name`, /^[a-z0-9][a-z0-9_-]{0,31}$/);
      const pattern = k === "sha256" ? /^[0-9a-f]{64}$/ : k === "blake2b" ? /^[0-9a-f]{128}$/ : /^[0-9a-f]{8,256}$/;
      out.set(k, this.string(x, `${where}.${k}`, pattern));
    }
    return out;
  }

  file(v: JValue | undefined, where: string): FileRecord {
    const o = this.object(v, where);
    this.members(o, where, ["path", "size", "checksums"], []);
    return {
      path: this.path(o.get("path"), `${where}.path`),
      size: this.integer(o.get("size"), `${where}.size`, 0n, MAX_SIZE),
      checksums: this.checksums(o.get("checksums"), `${where}.checksums`),
    };
  }

  layout(v: JValue | undefined): Layout {
    const w = "layout";
    const o = this.object(v, w);
    this.members(o, w, ["tp_size", "pp_size", "ep_size", "world_size", "rank_order"], []);
    return {
      tp_size: this.small(o.get("tp_size"), `${w}.tp_size`, 1, 65536),
      pp_size: this.small(o.get("pp_size"), `${w}.pp_size`, 1, 65536),
      ep_size: this.small(o.get("ep_size"), `${w}.ep_size`, 1, 65536),
      world_size: this.small(o.get("world_size"), `${w}.world_size`, 1, 65536),
      rank_order: this.enumeration(o.get("rank_order"), `${w}.rank_order`, RANK_ORDERS),
    };
  }

  rank(v: JValue, where: string): RankRecord {
    const o = this.object(v, where);
    this.members(o, where, ["rank", "tp_rank", "pp_rank", "ep_rank", "files"], []);
    return {
      rank: this.small(o.get("rank"), `${where}.rank`, 0, 65535),
      tp_rank: this.small(o.get("tp_rank"), `${where}.tp_rank`, 0, 65535),
      pp_rank: this.small(o.get("pp_rank"), `${where}.pp_rank`, 0, 65535),
      ep_rank: this.small(o.get("ep_rank"), `${where}.ep_rank`, 0, 65535),
      files: this.array(o.get("files"), `${where}.files`).map((f, i) => this.file(f, `${where}.files[${i}]`)),
    };
  }

  logical(v: JValue | undefined, where: string): Logical | null {
    if (v === undefined) return null;
    const o = this.object(v, where);
    this.members(o, where, ["dtype", "shape"], []);
    return {
      dtype: this.enumeration(o.get("dtype"), `${where}.dtype`, DTYPES),
      shape: this.shape(o.get("shape"), `${where}.shape`),
    };
  }

  tie(v: JValue | undefined, where: string): Tie | null {
    if (v === undefined) return null;
    const o = this.object(v, where);
    this.members(o, where, ["tensor"], ["axes", "block"]);
    const axesV = o.get("axes");
    const blockV = o.get("block");
    if (axesV !== undefined && blockV === undefined) this.err(where, '"axes" requires "block" (dependentRequired)');
    return {
      tensor: this.tensorName(o.get("tensor"), `${where}.tensor`),
      axes: axesV === undefined ? null : this.array(axesV, `${where}.axes`, 1, 64).map((a, i) => this.small(a, `${where}.axes[${i}]`, 0, 63)),
      block: blockV === undefined ? null : this.array(blockV, `${where}.block`, 1, 64).map((b, i) => this.integer(b, `${where}.block[${i}]`, 1n, MAX_SIZE)),
    };
  }

  piece(v: JValue, where: string, global: boolean): Piece {
    const o = this.object(v, where);
    if (global) this.members(o, where, ["rank", "file", "offset", "shape"], ["replica"]);
    else this.members(o, where, ["rank", "file", "shape"], []);
    const replica = global ? o.get("replica") : undefined;
    return {
      rank: this.small(o.get("rank"), `${where}.rank`, 0, 65535),
      file: this.path(o.get("file"), `${where}.file`),
      offset: global ? this.shape(o.get("offset"), `${where}.offset`) : null,
      shape: this.shape(o.get("shape"), `${where}.shape`),
      replica: replica === undefined ? 0 : this.small(replica, `${where}.replica`, 0, 65535),
    };
  }

  /** SPEC 4.3 rule 2: alias_of makes an alias, rank_local a rank-local tensor, else global. */
  tensor(v: JValue | undefined, where: string): TensorRecord {
    const o = this.object(v, where);
    if (o.has("alias_of")) {
      this.members(o, where, ["alias_of"], []);
      return { kind: "alias", aliasOf: this.tensorName(o.get("alias_of"), `${where}.alias_of`) };
    }
    const pieces = (global: boolean): Piece[] =>
      this.array(o.get("pieces"), `${where}.pieces`, 1).map((p, i) => this.piece(p, `${where}.pieces[${i}]`, global));
    if (o.has("rank_local")) {
      this.members(o, where, ["dtype", "rank_local", "pieces"], ["logical"]);
      if (o.get("rank_local") !== true) this.err(`${where}.rank_local`, "must be true");
      return {
        kind: "local",
        dtype: this.enumeration(o.get("dtype"), `${where}.dtype`, DTYPES),
        logical: this.logical(o.get("logical"), `${where}.logical`),
        pieces: pieces(false),
      };
    }
    this.members(o, where, ["dtype", "shape", "pieces"], ["logical", "tied_to"]);
    return {
      kind: "global",
      dtype: this.enumeration(o.get("dtype"), `${where}.dtype`, DTYPES),
      shape: this.shape(o.get("shape"), `${where}.shape`),
      logical: this.logical(o.get("logical"), `${where}.logical`),
      tiedTo: this.tie(o.get("tied_to"), `${where}.tied_to`),
      pieces: pieces(true),
    };
  }

  manifest(root: JValue): Manifest {
    const o = this.object(root, "manifest");
    this.members(o, "manifest", ["format", "format_version", "layout", "ranks", "quantization", "tensors"],
      ["generator", "extra_files", "metadata", "extensions"]);
    if (o.get("format") !== "shardspec") this.err("format", 'must be "shardspec" (SPEC 3.1)');
    const formatVersion = this.string(o.get("format_version"), "format_version", VERSION);
    if (o.has("generator")) this.string(o.get("generator"), "generator", undefined, 256);
    const layout = this.layout(o.get("layout"));
    const ranks = this.array(o.get("ranks"), "ranks", 1).map((r, i) => this.rank(r, `ranks[${i}]`));

    const q = this.object(o.get("quantization"), "quantization");
    this.members(q, "quantization", ["method"], ["config"]);
    const method = this.string(q.get("method"), "quantization.method", /^[a-z0-9][a-z0-9_.-]{0,63}$/);
    if (q.has("config")) this.object(q.get("config"), "quantization.config");

    const tensors = new Map<string, TensorRecord>();
    for (const [name, t] of this.object(o.get("tensors"), "tensors")) {
      const where = `tensors[${JSON.stringify(name)}]`;
      this.tensorName(name, `${where} name`);
      tensors.set(name, this.tensor(t, where));
    }

    const extraFiles = o.has("extra_files")
      ? this.array(o.get("extra_files"), "extra_files").map((f, i) => this.file(f, `extra_files[${i}]`))
      : [];

    if (o.has("metadata")) {
      for (const [k, x] of this.object(o.get("metadata"), "metadata")) this.string(x, `metadata[${JSON.stringify(k)}]`);
    }

    const extensions = new Map<string, Extension>();
    if (o.has("extensions")) {
      for (const [k, x] of this.object(o.get("extensions"), "extensions")) {
        const where = `extensions[${JSON.stringify(k)}]`;
        this.string(k, `${where} name`, /^[a-z0-9][a-z0-9_.-]{0,127}$/);
        const rec = this.object(x, where); // extension records are free-form (SPEC 4.3 rule 1)
        if (!rec.has("must_understand")) this.err(where, 'missing required member "must_understand"');
        const mu = rec.get("must_understand");
        if (typeof mu !== "boolean") this.err(`${where}.must_understand`, "must be a boolean");
        extensions.set(k, { mustUnderstand: mu });
      }
    }
    return { formatVersion, layout, ranks, quantization: { method }, tensors, extraFiles, extensions };
  }
}

/** SPEC 3.5 with 4.3: validate the structure and build the typed manifest. */
export function validateSchema(root: JValue, newerMinor: boolean, warnings: Warning[]): Manifest {
  return new Validator(newerMinor, warnings).manifest(root);
}
