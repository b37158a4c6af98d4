/**
 * Durable whole-file writes for every record outside the database that gates
 * an irreversible step (receipts, keys, tokens, the agent's runtime records,
 * the gateway host key): temp file in the same directory, fsync, rename,
 * fsync of the directory. The write counts only once the directory sync
 * succeeded; a crash leaves the old file or the new one, never a torn one.
 */
import { closeSync, fsyncSync, mkdirSync, openSync, renameSync, unlinkSync, writeSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { randomBytes } from "node:crypto";

export function writeFileDurable(path: string, data: string | Buffer, mode = 0o600): void {
  const dir = dirname(path);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const tmp = join(dir, `.${basename(path)}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
  const fd = openSync(tmp, "wx", mode);
  try {
    const buf = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    let off = 0;
    while (off < buf.length) off += writeSync(fd, buf, off, buf.length - off);
    fsyncSync(fd);
  } catch (e) {
    closeSync(fd);
    try {
      unlinkSync(tmp);
    } catch {
      /* best effort: the temp file is never read */
    }
    throw e;
  }
  closeSync(fd);
  renameSync(tmp, path);
  const dfd = openSync(dir, "r");
  try {
    fsyncSync(dfd);
  } finally {
    closeSync(dfd);
  }
}

