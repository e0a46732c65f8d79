// Several pieces of one global tensor on one rank (SPEC 7.2 rules 3, 6, 7; since format 1.3):
// when they are joinable, and their join. No Node APIs.

export interface Box { offset: readonly bigint[]; shape: readonly bigint[] }
export interface PieceArray extends Box { data: Uint8Array }

/**
 * SPEC 7.2 rule 7: the dimension d along which k >= 2 pieces of one rank, of a dtype of `bits`
 * bits per element, are joinable, or null. They must have the same offset and size in every
 * dimension other than d, pairwise distinct offsets along d (a piece of size 0 along d included)
 * and, in increasing offset along d, each must end no later than the next begins. For a dtype of
 * fewer than 8 bits (SPEC 6.5), each piece's run `s[d] × … × s[n−1]` elements must also be whole
 * bytes. These are conditions of offsets and shapes alone, so they hold pieces with no elements
 * too: an empty piece inside another's run, or empty pieces whose sub-byte runs end inside a
 * byte, do not join. A scalar (no dimension) never joins.
 */
export function joinDimension(pieces: readonly Box[], bits: bigint): number | null {
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
  for (const p of pieces) {
    const run = p.shape.slice(d).reduce((a, b) => a * b, 1n); // a bigint: no overflow
    if ((run * bits) % 8n !== 0n) return null; // a sub-byte run that ends inside a byte
  }
  return d;
}

/**
 * The join of joinable pieces (SPEC 7.2 rule 7): its shape and bytes. Along the join dimension d
 * (where their offsets differ) the pieces follow one another in increasing offset; in row-major
 * order that is, for each index of the dimensions before d, each piece's run of that index in
 * turn. Every run is whole bytes, for a sub-byte dtype too (the manifest checks refused any
 * other), so the runs' bytes are laid one after the other. The order is the offsets' alone,
 * not the manifest's nor the files' part order.
 */
export function join(pieces: readonly PieceArray[]): { shape: bigint[]; data: Uint8Array } {
  const first = pieces[0] as PieceArray;
  const d = first.offset.findIndex((o, e) => pieces.some((p) => p.offset[e] !== o));
  if (d < 0) throw new Error("the manifest checks made these pieces joinable");
  const order = [...pieces].sort((a, b) => {
    const x = a.offset[d] as bigint;
    const y = b.offset[d] as bigint;
    return x < y ? -1 : x > y ? 1 : 0;
  });
  const shape = [...first.shape];
  shape[d] = order.reduce((sum, p) => sum + (p.shape[d] as bigint), 0n);
  const outer = Number(shape.slice(0, d).reduce((a, b) => a * b, 1n));
  const data = new Uint8Array(order.reduce((sum, p) => sum + p.data.length, 0));
  if (outer === 0 || data.length === 0) return { shape, data };
  let at = 0;
  for (let i = 0; i < outer; i++) {
    for (const p of order) {
      const run = p.data.length / outer; // each piece: `outer` runs of whole bytes
      data.set(p.data.subarray(i * run, (i + 1) * run), at);
      at += run;
    }
  }
  return { shape, data };
}
