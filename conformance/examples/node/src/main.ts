#!/usr/bin/env node
// The conformance adapter (conformance/README.md): node dist/main.js CHECKPOINT_DIR RANK OUTPUT_FILE.
// Loads one rank by the reader procedure of SPEC 11.1 and writes its tensors as safetensors.

import { checkExtensions, checkManifest } from "./checks";
import { MAX_JSON_DEPTH, SpecError, Warning } from "./errors";
import { readDataFile, readManifest, realRoot, verifyChecksums, writeAtomically } from "./files";
import { join, PieceArray } from "./joins";
import { decodeUtf8, JsonError, parseJson, JValue } from "./json";
import { parseRank, planRank } from "./plan";
import { buildSafetensors, checkAgreement, headerLength, OutTensor, parseHeader } from "./safetensors";
import { checkVersion, validateSchema } from "./schema";

const JSON_CODES: Record<string, string> = {
  encoding: "json-encoding",
  syntax: "json-syntax",
  duplicate: "json-duplicate-name",
  nonfinite: "json-nonfinite",
  depth: "json-too-deep",
};
const JSON_SECTIONS: Record<string, string> = { encoding: "3.2", syntax: "3.2", duplicate: "3.3", nonfinite: "3.3", depth: "3.4" };

/** SPEC 11.1 steps 1-12, always verifying checksums (the adapter protocol asks for it). */
export function loadRank(dir: string, rankArg: string, ignoreExtensions: ReadonlySet<string>, warnings: Warning[]): OutTensor[] {
  // Steps 1-3: commit, size, parse.
  const bytes = readManifest(dir);
  let root: JValue;
  try {
    root = parseJson(decodeUtf8(bytes), { maxDepth: MAX_JSON_DEPTH, trailing: "json" });
  } catch (e) {
    if (!(e instanceof JsonError)) throw e;
    throw new SpecError(JSON_CODES[e.problem] as string, `shardspec.json: ${e.message}`, JSON_SECTIONS[e.problem] as string);
  }
  // Steps 4-7: version, schema, extensions, manifest semantics.
  const newerMinor = checkVersion(root, warnings);
  const manifest = validateSchema(root, newerMinor, warnings);
  checkExtensions(manifest, ignoreExtensions, warnings);
  checkManifest(manifest);
  // Step 8: the request.
  const rank = parseRank(rankArg, manifest.layout.world_size);
  const plan = planRank(manifest, rank);
  // Step 9: each file of the rank, in part order.
  const checkpoint = realRoot(dir);
  const arrays = new Map<string, { dtype: string; pieces: PieceArray[] }>(); // name -> its pieces on rank r
  for (const { record, pieces } of plan.files) {
    const data = readDataFile(checkpoint, record); // (a), (b)
    const n = headerLength(data.subarray(0, 8), BigInt(data.length), record.path); // (c)
    const headerEnd = 8 + Number(n);
    const entries = parseHeader(data.subarray(8, headerEnd), BigInt(data.length - headerEnd), record.path);
    const byName = checkAgreement(entries, pieces, record.path); // (d)
    verifyChecksums(record, data); // (f), before any tensor of the file is used
    for (const p of pieces) { // (e)
      const e = byName.get(p.name);
      if (e === undefined) continue; // checked by (d)
      const view = data.subarray(headerEnd + Number(e.begin), headerEnd + Number(e.end));
      const held = arrays.get(p.name) ?? { dtype: p.dtype, pieces: [] };
      held.pieces.push({ offset: p.offset ?? [], shape: p.shape, data: view });
      arrays.set(p.name, held);
    }
  }
  // Step 10: a tensor's value is its piece, or the join of its several pieces (SPEC 7.2 rules 6, 7).
  const values = new Map<string, OutTensor>();
  for (const [name, { dtype, pieces }] of arrays) {
    const value = pieces.length === 1 ? (pieces[0] as PieceArray) : join(pieces);
    values.set(name, { name, dtype, shape: [...value.shape], data: value.data });
  }
  // Step 11: aliases share their target's storage.
  const tensors = [...values.values()];
  for (const [alias, target] of plan.aliases) {
    const t = values.get(target);
    if (t !== undefined) tensors.push({ ...t, name: alias });
  }
  return tensors;
}

function main(argv: string[]): number {
  if (argv.length !== 3) {
    process.stderr.write("usage: node dist/main.js CHECKPOINT_DIR RANK OUTPUT_FILE\n");
    return 2;
  }
  const [dir, rank, output] = argv as [string, string, string];
  const ignore = new Set(
    (process.env["SHARDSPEC_IGNORE_EXTENSIONS"] ?? "")
      .split(",")
      .map((s) => s.replace(/^[ \t]+|[ \t]+$/g, ""))
      .filter((s) => s !== ""),
  );
  const warnings: Warning[] = [];
  const report = (): void => {
    for (const w of warnings) process.stderr.write(`warning [${w.code}] ${w.message} (SPEC ${w.section})\n`);
  };
  try {
    const tensors = loadRank(dir, rank, ignore, warnings);
    report();
    writeAtomically(output, buildSafetensors(tensors));
    return 0;
  } catch (e) {
    report();
    if (e instanceof SpecError) {
      process.stderr.write(`${e.toString()}\n`);
      return 1;
    }
    process.stderr.write(`error [internal] ${(e as Error).stack ?? String(e)}\n`);
    return 3;
  }
}

if (require.main === module) process.exitCode = main(process.argv.slice(2));
