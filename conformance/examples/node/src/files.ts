// File access, the only module that uses Node APIs: opening files safely inside the checkpoint
// (SPEC 2.2 rules 5-7, 2.3), sizes (9.1), checksums (9.2), and writing the output atomically.

import { createHash } from "crypto";
import * as fs from "fs";
import * as nodePath from "path";
import { fail, MANIFEST_NAME, MAX_MANIFEST_BYTES } from "./errors";
import { FileRecord } from "./schema";

const MAX_LINKS = 40;

/**
 * Resolve `rel` against the real directory `root`, following symbolic links component by
 * component (SPEC 2.2 rule 5). Components that do not exist are kept literally, so a dangling
 * link still resolves to where it points (to tell path-escapes from file-missing). Null: a loop.
 */
function resolveNonStrict(root: string, rel: string): string | null {
  let cur = root;
  const pending = rel.split("/");
  let links = 0;
  while (pending.length > 0) {
    const seg = pending.shift() as string;
    if (seg === "" || seg === ".") continue;
    if (seg === "..") {
      cur = nodePath.dirname(cur);
      continue;
    }
    const next = nodePath.join(cur, seg);
    let st: fs.Stats | undefined;
    try {
      st = fs.lstatSync(next);
    } catch {
      st = undefined;
    }
    if (st !== undefined && st.isSymbolicLink()) {
      if (++links > MAX_LINKS) return null; // a loop of links: nothing can be reached there
      const target = fs.readlinkSync(next);
      if (target.startsWith("/")) cur = "/";
      pending.unshift(...target.split("/"));
      continue;
    }
    cur = next;
  }
  return cur;
}

function inside(root: string, p: string): boolean {
  const base = root.endsWith(nodePath.sep) ? root : root + nodePath.sep;
  return p === root || p.startsWith(base);
}

export interface Opened { fd: number; size: bigint; path: string }

/** Open a listed path by SPEC 2.2 rules 5-7, without following a link or blocking on a FIFO. */
export function openInside(root: string, rel: string): Opened {
  const resolved = resolveNonStrict(root, rel);
  if (resolved === null) fail("file-missing", `${JSON.stringify(rel)} is a loop of symbolic links`, "2.2");
  if (!inside(root, resolved)) fail("path-escapes", `${JSON.stringify(rel)} resolves to ${resolved}, outside the checkpoint directory`, "2.2");
  let st: fs.Stats;
  try {
    st = fs.lstatSync(resolved);
  } catch {
    return fail("file-missing", `${JSON.stringify(rel)} does not exist`, "2.2");
  }
  if (!st.isFile()) fail("file-not-regular", `${JSON.stringify(rel)} is not a regular file`, "2.2");
  let fd: number;
  try {
    fd = fs.openSync(resolved, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
  } catch (e) {
    return fail("file-missing", `${JSON.stringify(rel)} cannot be opened: ${(e as Error).message}`, "2.2");
  }
  const fst = fs.fstatSync(fd, { bigint: true });
  if (!fst.isFile() || fst.ino !== BigInt(st.ino) || fst.dev !== BigInt(st.dev)) {
    fs.closeSync(fd);
    fail("file-not-regular", `${JSON.stringify(rel)} changed into something else while it was opened`, "2.2");
  }
  return { fd, size: fst.size, path: rel };
}

/** Read exactly `size` bytes from the opened file; fewer means the file changed size (9.1). */
function readAll(f: Opened, size: bigint): Buffer {
  if (size > BigInt(Number.MAX_SAFE_INTEGER) || Number(size) > 0x100000000) {
    fail("file-size", `${f.path}: ${size} bytes is more than this reader can hold in memory`, "9.1");
  }
  const n = Number(size);
  const buf = Buffer.allocUnsafe(n);
  let pos = 0;
  while (pos < n) {
    const got = fs.readSync(f.fd, buf, pos, Math.min(n - pos, 1 << 26), pos);
    if (got === 0) fail("file-size", `${f.path}: ended after ${pos} of ${n} bytes while read`, "9.1");
    pos += got;
  }
  return buf;
}

/** SPEC 11.1 steps 1-2 and the read of step 3: the manifest's bytes. */
export function readManifest(dir: string): Uint8Array {
  const manifest = nodePath.join(dir, MANIFEST_NAME);
  try {
    fs.lstatSync(manifest);
  } catch {
    fail("not-committed", `${dir} has no ${MANIFEST_NAME}`, "2.3");
  }
  const root = fs.realpathSync(dir);
  const f = openInside(root, MANIFEST_NAME);
  try {
    // SPEC 3.4 rule 1: compare the size before reading.
    if (f.size > MAX_MANIFEST_BYTES) fail("json-too-large", `${MANIFEST_NAME} has ${f.size} bytes, over ${MAX_MANIFEST_BYTES}`, "3.4");
    return readAll(f, f.size);
  } finally {
    fs.closeSync(f.fd);
  }
}

export function realRoot(dir: string): string {
  return fs.realpathSync(dir);
}

/** SPEC 11.1 step 9 (a), (b) and the read: the bytes of a data file whose size matches its record. */
export function readDataFile(root: string, record: FileRecord): Uint8Array {
  const f = openInside(root, record.path);
  try {
    if (f.size !== record.size) fail("file-size", `${record.path} has ${f.size} bytes; the manifest says ${record.size}`, "9.1");
    return readAll(f, f.size);
  } finally {
    fs.closeSync(f.fd);
  }
}

/** SPEC 9.2: verify every algorithm this reader knows (sha256, blake2b); others are ignored. */
export function verifyChecksums(record: FileRecord, bytes: Uint8Array): void {
  const known: Record<string, string> = { sha256: "sha256", blake2b: "blake2b512" };
  for (const [name, want] of record.checksums) {
    const algorithm = known[name];
    if (algorithm === undefined) continue;
    const got = createHash(algorithm).update(bytes).digest("hex");
    if (got !== want) fail("checksum-mismatch", `${record.path}: ${name} is ${got}; the manifest says ${want}`, "9.2");
  }
}

/** Write the output under a temporary name in its directory, then rename it (adapter protocol). */
export function writeAtomically(path: string, chunks: Uint8Array[]): void {
  const tmp = nodePath.join(nodePath.dirname(path), `.${nodePath.basename(path)}.tmp-${process.pid}`);
  const fd = fs.openSync(tmp, "wx", 0o644);
  try {
    for (const c of chunks) {
      let off = 0;
      while (off < c.length) off += fs.writeSync(fd, c, off, c.length - off);
    }
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fs.renameSync(tmp, path);
  } catch (e) {
    try { fs.closeSync(fd); } catch { /* already closed */ }
    try { fs.unlinkSync(tmp); } catch { /* not there */ }
    throw e;
  }
}
