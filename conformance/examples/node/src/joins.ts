// Several pieces of one global tensor on one rank (SPEC 7.2 rules 3, 6, 7; since format 1.3):
// when they are joinable, and their join. No Node APIs.

export interface Box { offset: readonly bigint[]; shape: readonly bigint[] }
export interface PieceArray extends Box { data: Uint8Array }

/**
 * SPEC 7.2 rule 7: the dimension d along which k >= 2 pieces of one rank are joinable, or null.
 * They must have the same offset and size in every dimension other than d, distinct offsets
 * along d and, in increasing offset along d, each must end no later than the next begins.
 * A scalar (no dimension) never joins.
 */
export function joinDimension(pieces: readonly Box[]): number | null {
  const first = pieces[0];
  if (first === undefined) return null;
  const n = first.offset.length;
  const differ: number[] = [];
  for (let d = 0; d < n; d++) if (pieces.some((p) => p.offset[d] !== first.offset[d])) differ.push(d);
  if (differ.length !== 1) return null;
  const d = differ[0] as number;
  for (const p of pieces) {
    for (let e = 0; e < n; e++) if (e !== d && p.shape[e] !== first.shape[e]) return null;
  }
  const runs = pieces.map((p) => [p.offset[d] as bigint, p.shape[d] as bigint] as const)
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  for (let i = 1; i < runs.length; i++) {
    const [o1, s1] = runs[i - 1] as readonly [bigint, bigint];
    const [o2] = runs[i] as readonly [bigint, bigint];
    if (o1 === o2 || o1 + s1 > o2) return null;
  }
  return d;
}

/** Copy `n` bits of the bit stream `src` (SPEC 6.5 rule 3) from bit `from` to bit `to` of `dst`. */
function copyBits(src: Uint8Array, from: number, dst: Uint8Array, to: number, n: number): void {
  if (from % 8 === 0 && to % 8 === 0 && n % 8 === 0) {
    dst.set(src.subarray(from / 8, (from + n) / 8), to / 8);
    return;
  }
  for (let k = 0; k < n; k++) {
    const s = from + k;
    const t = to + k;
    const bit = ((src[s >> 3] as number) >> (s & 7)) & 1;
    dst[t >> 3] = (dst[t >> 3] as number) | (bit << (t & 7));
  }
}

/**
 * The join of joinable pieces (SPEC 7.2 rule 7): its shape and bytes. Along the join dimension d
 * the pieces follow one another in increasing offset; in row-major order that is, for each index
 * of the dimensions before d, each piece's block of that index in turn. A block of a sub-byte
 * dtype (SPEC 6.5) may end inside a byte, so blocks are copied as bit strings.
 */
export function join(pieces: readonly PieceArray[]): { shape: bigint[]; data: Uint8Array } {
  const d = joinDimension(pieces);
  if (d === null) throw new Error("the manifest checks made these pieces joinable");
  const order = [...pieces].sort((a, b) => {
    const x = a.offset[d] as bigint;
    const y = b.offset[d] as bigint;
    return x < y ? -1 : x > y ? 1 : 0;
  });
  const shape = [...(order[0] as PieceArray).shape];
  shape[d] = order.reduce((sum, p) => sum + (p.shape[d] as bigint), 0n);
  const outer = Number(shape.slice(0, d).reduce((a, b) => a * b, 1n));
  const data = new Uint8Array(order.reduce((sum, p) => sum + p.data.length, 0));
  if (outer === 0 || data.length === 0) return { shape, data };
  const blockBits = order.map((p) => (p.data.length * 8) / outer); // each piece: `outer` blocks
  let at = 0;
  for (let i = 0; i < outer; i++) {
    order.forEach((p, j) => {
      const n = blockBits[j] as number;
      copyBits(p.data, i * n, data, at, n);
      at += n;
    });
  }
  return { shape, data };
}
