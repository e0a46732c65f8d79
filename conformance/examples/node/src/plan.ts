// Rank planning: what rank r reads and returns (SPEC 6.1, 7.2 rules 6-7, 7.6 rule 3, 11.1 step 8).
// No Node APIs.

import { fail } from "./errors";
import { FileRecord, Manifest } from "./schema";
import { Expected } from "./safetensors";

/** A piece of rank r: its entry in its file, and its offset (null for a rank-local piece). */
export interface PlannedPiece extends Expected { offset: bigint[] | null }
export interface FilePlan { record: FileRecord; pieces: PlannedPiece[] }
export interface RankPlan {
  rank: number;
  /** The rank's files in part order (SPEC 6.1 rule 1), each with the pieces it holds. */
  files: FilePlan[];
  /** alias name -> target name, for targets with a piece on this rank (SPEC 7.6 rule 3). */
  aliases: Map<string, string>;
}

/** SPEC 11.1 step 8: parse and check the requested rank. */
export function parseRank(arg: string, worldSize: number): number {
  if (!/^[0-9]+$/.test(arg) || BigInt(arg) >= BigInt(worldSize)) {
    fail("rank-out-of-range", `rank ${JSON.stringify(arg)} is not an integer in 0..${worldSize - 1}`, "11.1");
  }
  return Number(arg);
}

export function planRank(m: Manifest, rank: number): RankPlan {
  const record = m.ranks[rank];
  if (record === undefined) fail("rank-out-of-range", `rank ${rank} is not in the layout`, "11.1");
  const byFile = new Map<string, PlannedPiece[]>(record.files.map((f) => [f.path, []]));
  const held = new Set<string>();
  for (const [name, t] of m.tensors) {
    if (t.kind === "alias") continue;
    for (const p of t.pieces) {
      if (p.rank !== rank) continue;
      // The file is owned by this rank (checked, SPEC 6.1 rule 2).
      (byFile.get(p.file) as PlannedPiece[]).push({ name, dtype: t.dtype, shape: p.shape, offset: p.offset });
      held.add(name);
    }
  }
  const aliases = new Map<string, string>();
  for (const [name, t] of m.tensors) {
    if (t.kind === "alias" && held.has(t.aliasOf)) aliases.set(name, t.aliasOf);
  }
  return { rank, files: record.files.map((f) => ({ record: f, pieces: byFile.get(f.path) as PlannedPiece[] })), aliases };
}
