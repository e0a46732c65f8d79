// Manifest semantics that the schema cannot express (SPEC 3.5 rule 3): extensions (4.4), paths
// (2.1, 2.2), layout (5), pieces (6.1, 7.2, several on one rank in joins.ts), coverage (7.3),
// replicas (7.4), aliases (7.6) and tied tensors (8.4): steps 6 and 7 of the reader procedure
// (11.1). No Node APIs.

import { bitsFit, byteCount, DTYPE_BITS } from "./dtypes";
import { fail, MANIFEST_NAME, MAX_PATH_BYTES, product, show, utf8Length, Warning } from "./errors";
import { joinDimension } from "./joins";
import { Manifest, Piece, TensorRecord } from "./schema";

/** SPEC 4.4: no extension is understood here; `ignore` names those the user allows ignoring. */
export function checkExtensions(m: Manifest, ignore: ReadonlySet<string>, warnings: Warning[]): void {
  for (const [name, ext] of m.extensions) {
    if (ext.mustUnderstand && !ignore.has(name)) {
      fail("extension-unsupported", `extension ${JSON.stringify(name)} must be understood and is not supported`, "4.4");
    }
    warnings.push({
      code: "extension-ignored",
      message: ext.mustUnderstand
        ? `must-understand extension ${JSON.stringify(name)} ignored as the user asked`
        : `optional extension ${JSON.stringify(name)} ignored`,
      section: "4.4",
    });
  }
}

/** SPEC 2.2 rule 1 (rules 2-4 were checked by the schema). */
function checkPathBytes(path: string): void {
  if (utf8Length(path) > MAX_PATH_BYTES) {
    fail("path-unsafe", `path ${JSON.stringify(path.slice(0, 40))}... has more than ${MAX_PATH_BYTES} UTF-8 bytes`, "2.2");
  }
}

/** SPEC 2.1 rule 3 and 2.2 rules 1-4 for every listed path. */
function checkPaths(m: Manifest): void {
  const seen = new Set<string>();
  const listed = [...m.ranks.flatMap((r) => r.files), ...m.extraFiles];
  for (const f of listed) {
    checkPathBytes(f.path);
    if (f.path === MANIFEST_NAME) fail("path-unsafe", `a listed path may not be ${MANIFEST_NAME}`, "2.1");
    if (seen.has(f.path)) fail("file-duplicate", `path ${JSON.stringify(f.path)} is listed more than once`, "2.1");
    seen.add(f.path);
  }
  for (const t of m.tensors.values()) {
    if (t.kind !== "alias") for (const p of t.pieces) checkPathBytes(p.file);
  }
}

/** Coordinates of `rank` under rank_order A-B-C (SPEC 5.2 rule 2). */
export function coordinates(m: Manifest, rank: number): { tp: number; pp: number; ep: number } {
  const l = m.layout;
  const size: Record<string, number> = { tp: l.tp_size, pp: l.pp_size, ep: l.ep_size };
  const [a, b, c] = l.rank_order.split("-") as [string, string, string];
  const sb = size[b] as number;
  const sc = size[c] as number;
  const coord: Record<string, number> = {};
  coord[c] = rank % sc;
  coord[b] = Math.floor(rank / sc) % sb;
  coord[a] = Math.floor(rank / (sb * sc));
  return { tp: coord["tp"] as number, pp: coord["pp"] as number, ep: coord["ep"] as number };
}

/** SPEC 5.1-5.3. */
function checkLayout(m: Manifest): void {
  const l = m.layout;
  if (l.world_size !== l.tp_size * l.pp_size * l.ep_size) {
    fail("layout-world-size", `world_size ${l.world_size} != tp_size ${l.tp_size} x pp_size ${l.pp_size} x ep_size ${l.ep_size}`, "5.1");
  }
  if (m.ranks.length !== l.world_size) {
    fail("layout-world-size", `${m.ranks.length} rank records for world_size ${l.world_size}`, "5.1");
  }
  m.ranks.forEach((r, i) => {
    if (r.rank !== i) fail("layout-ranks", `ranks[${i}].rank is ${r.rank}, not ${i}`, "5.3");
  });
  m.ranks.forEach((r, i) => {
    const c = coordinates(m, i);
    if (r.tp_rank !== c.tp || r.pp_rank !== c.pp || r.ep_rank !== c.ep) {
      fail("layout-rank-order",
        `rank ${i} has (pp, ep, tp) = (${r.pp_rank}, ${r.ep_rank}, ${r.tp_rank}); ${l.rank_order} gives (${c.pp}, ${c.ep}, ${c.tp})`, "5.2");
    }
  });
}

function sameDims(a: readonly bigint[] | null, b: readonly bigint[] | null): boolean {
  if (a === null || b === null) return a === b;
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/**
 * SPEC 7.2 rule 3: a rank's several pieces of one tensor. Only a manifest of format 1.3 or later
 * may have them (4.2 rule 4: a manifest is read by its own version's rules), and only for a
 * global tensor that is neither tied nor the base of a tie (8.4 rule 1); each must lie in a file
 * of its own, and they must be joinable (7.2 rule 7; for a sub-byte dtype, in runs of whole
 * bytes). Files are told apart by their listed paths, as strings (2.1 rule 3): a path that links
 * to another listed one is another file, read from its own path.
 */
function checkSeveral(m: Manifest, name: string, t: Exclude<TensorRecord, { kind: "alias" }>, rank: number, held: Piece[], isBase: boolean): void {
  const q = JSON.stringify(name);
  const minor = Number(m.formatVersion.split(".")[1]); // the schema checked the pattern
  if (minor < 3) {
    fail("piece-duplicate", `${q} has ${held.length} pieces on rank ${rank}, which format ${m.formatVersion} does not allow (1.3 first does, SPEC 4.2 rule 4)`, "7.2");
  }
  if (t.kind !== "global" || t.tiedTo !== null || isBase) {
    fail("piece-duplicate", `${q} has ${held.length} pieces on rank ${rank}; a rank-local tensor, a tied tensor and the base of a tie have one piece per rank`, "7.2");
  }
  if (new Set(held.map((p) => p.file)).size !== held.length) {
    fail("piece-duplicate", `${q} has two pieces on rank ${rank} in one file`, "7.2");
  }
  const bits = DTYPE_BITS.get(t.dtype) as bigint; // the schema checked the dtype
  if (joinDimension(held.map((p) => ({ offset: p.offset as bigint[], shape: p.shape })), bits) === null) {
    fail("piece-duplicate", `${q} has ${held.length} pieces on rank ${rank} that cannot be joined along one dimension (rule 7)`, "7.2");
  }
}

/** SPEC 7.2 rules 2-4 and 6.5 rule 2 for the pieces of one tensor; 6.1 rule 2. */
function checkPieces(m: Manifest, name: string, t: Exclude<TensorRecord, { kind: "alias" }>, isBase: boolean): void {
  const ranks = new Map<number, Piece[]>();
  for (const p of t.pieces) {
    if (p.rank >= m.layout.world_size) {
      fail("piece-rank", `a piece of ${JSON.stringify(name)} names rank ${p.rank}; world_size is ${m.layout.world_size}`, "7.2");
    }
    const owner = m.ranks[p.rank];
    if (owner === undefined || !owner.files.some((f) => f.path === p.file)) {
      fail("file-rank", `a piece of ${JSON.stringify(name)} on rank ${p.rank} lies in ${JSON.stringify(p.file)}, which rank ${p.rank} does not own`, "6.1");
    }
    const held = ranks.get(p.rank);
    if (held === undefined) ranks.set(p.rank, [p]);
    else held.push(p);
    if (t.kind === "global") {
      const o = p.offset as bigint[];
      const g = t.shape;
      if (o.length !== g.length || p.shape.length !== g.length) {
        fail("piece-bounds", `a piece of ${JSON.stringify(name)} has ${o.length}/${p.shape.length} dimensions; the tensor has ${g.length}`, "7.2");
      }
      g.forEach((gd, d) => {
        if ((o[d] as bigint) + (p.shape[d] as bigint) > gd) {
          fail("piece-bounds", `piece on rank ${p.rank} of ${JSON.stringify(name)} (offset ${show(o)}, shape ${show(p.shape)}) lies outside ${show(g)}`, "7.2");
        }
      });
    }
    const bytes = byteCount(t.dtype, p.shape);
    if (typeof bytes === "string") {
      fail("st-size", `piece on rank ${p.rank} of ${JSON.stringify(name)} (${t.dtype} ${show(p.shape)}): ${bytes}`, "6.5");
    }
  }
  // SPEC 7.2 rule 3, once every piece lies inside its tensor.
  for (const [rank, held] of [...ranks].sort((a, b) => a[0] - b[0])) {
    if (held.length > 1) checkSeveral(m, name, t, rank, held, isBase);
  }
}

function overlaps(a: Piece, b: Piece): boolean {
  const ao = a.offset as bigint[];
  const bo = b.offset as bigint[];
  return ao.every((x, d) => {
    const y = bo[d] as bigint;
    const lo = x > y ? x : y;
    const ea = x + (a.shape[d] as bigint);
    const eb = y + (b.shape[d] as bigint);
    return lo < (ea < eb ? ea : eb);
  });
}

/** SPEC 7.3 coverage and 7.4 replicas of a global tensor. */
function checkCoverage(name: string, t: Extract<TensorRecord, { kind: "global" }>): void {
  const total = product(t.shape) as bigint;
  const primary = t.pieces.filter((p) => p.replica === 0);
  if (total > 0n) {
    if (t.shape.length === 0) {
      if (primary.length > 1) fail("coverage-overlap", `scalar ${JSON.stringify(name)} has ${primary.length} replica-0 pieces`, "7.3");
    } else {
      // Sweep along dimension 0 (SPEC 7.3 rule 5).
      const sorted = [...primary].sort((a, b) => {
        const x = (a.offset as bigint[])[0] as bigint;
        const y = (b.offset as bigint[])[0] as bigint;
        return x < y ? -1 : x > y ? 1 : 0;
      });
      for (let i = 0; i < sorted.length; i++) {
        const a = sorted[i] as Piece;
        const end = ((a.offset as bigint[])[0] as bigint) + (a.shape[0] as bigint);
        for (let j = i + 1; j < sorted.length; j++) {
          const b = sorted[j] as Piece;
          if (((b.offset as bigint[])[0] as bigint) >= end) break;
          if (overlaps(a, b)) {
            fail("coverage-overlap", `replica-0 pieces of ${JSON.stringify(name)} on ranks ${a.rank} and ${b.rank} overlap`, "7.3");
          }
        }
      }
    }
    let sum = 0n;
    for (const p of primary) sum += product(p.shape) as bigint;
    if (sum !== total) {
      fail("coverage-gap", `replica-0 pieces of ${JSON.stringify(name)} cover ${sum} of ${total} elements`, "7.3");
    }
  }
  for (const p of t.pieces) {
    if (p.replica > 0 && !primary.some((q) => sameDims(q.offset, p.offset) && sameDims(q.shape, p.shape))) {
      fail("replica-mismatch", `replica ${p.replica} of ${JSON.stringify(name)} on rank ${p.rank} copies no replica-0 piece`, "7.4");
    }
  }
}

const ceilDiv = (a: bigint, b: bigint): bigint => (a + b - 1n) / b;

/** SPEC 8.4: a tied tensor's base, shape and placement. */
function checkTie(m: Manifest, name: string, t: Extract<TensorRecord, { kind: "global" }>): void {
  const tie = t.tiedTo;
  if (tie === null) return;
  const q = JSON.stringify(name);
  const w = m.tensors.get(tie.tensor);
  // Rule 1.
  if (w === undefined || tie.tensor === name || w.kind !== "global" || w.tiedTo !== null) {
    const why = w === undefined ? "is missing" : tie.tensor === name ? "is the tensor itself"
      : w.kind !== "global" ? `is ${w.kind === "alias" ? "an alias" : "rank-local"}` : "is tied itself";
    fail("tie-target", `${q} is tied to ${JSON.stringify(tie.tensor)}, which ${why}`, "8.4");
  }
  // Rule 2: the grid and the packing.
  const grid = w.logical !== null ? w.logical.shape : w.shape;
  const n = grid.length;
  if (w.shape.length < n) fail("tie-shape", `base ${JSON.stringify(tie.tensor)} has fewer dimensions than its grid`, "8.4");
  const pack: bigint[] = grid.map((l, d) => {
    const s = w.shape[d] as bigint;
    if (s === 0n && l === 0n) return 1n;
    if (s > 0n && l > 0n && l % s === 0n) return l / s;
    return fail("tie-shape", `base ${JSON.stringify(tie.tensor)}: shape[${d}] = ${s} does not divide grid ${l}`, "8.4");
  });
  // Rule 3: T's shape is the grid in blocks.
  const block = tie.block;
  const k = block === null ? 0 : block.length;
  const axes = tie.axes ?? Array.from({ length: k }, (_, j) => j);
  if (block !== null) {
    if (axes.length !== k) fail("tie-shape", `${q}: axes and block differ in length`, "8.4");
    if (new Set(axes).size !== k || axes.some((a) => a >= n)) {
      fail("tie-shape", `${q}: axes ${show(axes)} are not distinct dimensions of a ${n}-dimensional grid`, "8.4");
    }
    if (t.shape.length < k) fail("tie-shape", `${q} has fewer than ${k} dimensions`, "8.4");
    for (let j = 0; j < k; j++) {
      const want = ceilDiv(grid[axes[j] as number] as bigint, block[j] as bigint);
      if (t.shape[j] !== want) {
        fail("tie-shape", `${q}: shape[${j}] is ${t.shape[j]}; grid ${grid[axes[j] as number]} in blocks of ${block[j]} gives ${want}`, "8.4");
      }
    }
  } else if (product(t.shape) !== 1n) {
    fail("tie-shape", `${q} has no block, so it must have exactly one element`, "8.4");
  }
  // Rule 4: placement.
  const wRanks = new Set(w.pieces.map((p) => p.rank));
  const tRanks = new Set(t.pieces.map((p) => p.rank));
  if (wRanks.size !== tRanks.size || [...wRanks].some((r) => !tRanks.has(r))) {
    fail("tie-split", `${q} must have a piece on exactly the ranks holding ${JSON.stringify(tie.tensor)}`, "8.4");
  }
  for (const wp of w.pieces) {
    const o = wp.offset as bigint[];
    const s = wp.shape;
    for (let d = n; d < w.shape.length; d++) {
      if (o[d] !== 0n || s[d] !== w.shape[d]) {
        fail("tie-split", `the piece of ${JSON.stringify(tie.tensor)} on rank ${wp.rank} cuts inner dimension ${d}`, "8.4");
      }
    }
    const wantOffset: bigint[] = [];
    const wantShape: bigint[] = [];
    for (let j = 0; j < t.shape.length; j++) {
      if (j < k && block !== null) {
        const d = axes[j] as number;
        const b = block[j] as bigint;
        const lo = (o[d] as bigint) * (pack[d] as bigint);
        const hi = ((o[d] as bigint) + (s[d] as bigint)) * (pack[d] as bigint);
        if (lo % b !== 0n || (hi % b !== 0n && hi !== grid[d])) {
          fail("tie-split", `the piece of ${JSON.stringify(tie.tensor)} on rank ${wp.rank} cuts a block of ${q} along grid dimension ${d}`, "8.4");
        }
        wantOffset.push(lo / b);
        wantShape.push(ceilDiv(hi, b) - lo / b);
      } else {
        wantOffset.push(0n);
        wantShape.push(t.shape[j] as bigint);
      }
    }
    const tp = t.pieces.find((p) => p.rank === wp.rank) as Piece;
    if (!sameDims(tp.offset, wantOffset) || !sameDims(tp.shape, wantShape)) {
      fail("tie-split", `${q} on rank ${wp.rank} has offset ${show(tp.offset)}, shape ${show(tp.shape)}; its base's piece gives ${show(wantOffset)}, ${show(wantShape)}`, "8.4");
    }
  }
}

/** Step 7 of SPEC 11.1: everything about the manifest that does not depend on the rank. */
export function checkManifest(m: Manifest): void {
  checkPaths(m);
  checkLayout(m);
  // The bases of ties (8.4 rule 1), which hold one piece per rank (7.2 rule 3).
  const bases = new Set<string>();
  for (const t of m.tensors.values()) if (t.kind === "global" && t.tiedTo !== null) bases.add(t.tiedTo.tensor);
  for (const [name, t] of m.tensors) {
    if (t.kind === "alias") continue;
    // SPEC 7.1 rule 4.
    if (t.kind === "global" && !bitsFit(t.dtype, t.shape)) {
      fail("shape-overflow", `${JSON.stringify(name)}: shape ${show(t.shape)} has more than MAX_SIZE elements or bits`, "7.1");
    }
    if (t.logical !== null && !bitsFit(t.logical.dtype, t.logical.shape)) {
      fail("shape-overflow", `${JSON.stringify(name)}: logical shape ${show(t.logical.shape)} has more than MAX_SIZE elements or bits`, "7.1");
    }
    checkPieces(m, name, t, bases.has(name));
    if (t.kind === "global") checkCoverage(name, t);
  }
  // SPEC 7.6 rule 1.
  for (const [name, t] of m.tensors) {
    if (t.kind !== "alias") continue;
    const target = m.tensors.get(t.aliasOf);
    if (target === undefined || target.kind === "alias") {
      fail("alias-target", `alias ${JSON.stringify(name)} points at ${JSON.stringify(t.aliasOf)}, which ${target === undefined ? "does not exist" : "is an alias"}`, "7.6");
    }
  }
  for (const [name, t] of m.tensors) if (t.kind === "global") checkTie(m, name, t);
}
