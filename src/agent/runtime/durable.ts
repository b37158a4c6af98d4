/**
 * Whole-file records for runtime state (the machine record a restarted agent
 * uses to recognise its sandboxes exactly). Written as PRODUCT.md requires:
 * temp file, fsync, rename, fsync of the directory. A record that cannot be
 * parsed is reported as an error, never read as "no machine".
 */
import { readFileSync, rmSync, readdirSync, lstatSync } from "node:fs";
import { join } from "node:path";
import { BerthError } from "../../core/errors.js";
import { writeFileDurable } from "../../io/durable-file.js";

export function writeRecord(path: string, value: unknown): void {
  writeFileDurable(path, JSON.stringify(value, null, 2) + "\n", 0o600);
}

/** The record, or null if the file does not exist. Unreadable or corrupt → BerthError. */
export function readRecord<T>(path: string): T | null {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw new BerthError("internal", `runtime record ${path} cannot be read (${(e as Error).message}); the machine must be quarantined`);
  }
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new BerthError("internal", `runtime record ${path} is corrupt; the machine must be quarantined`);
  }
}

/**
 * Remove everything inside `dir` but keep `dir` itself (same inode, so a bind
 * mount of it stays valid). Does not follow symlinks out of the directory.
 */
export function wipeDirectory(dir: string): number {
  let n = 0;
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    // lstat first: rmSync never follows a symlink, but be explicit about intent.
    lstatSync(p);
    rmSync(p, { recursive: true, force: true, maxRetries: 3 });
    n++;
  }
  const left = readdirSync(dir);
  if (left.length > 0) {
    throw new BerthError("operation_failed", `operation_failed: scrub left ${left.length} entries in ${dir} (e.g. ${left[0]}); the machine must be quarantined`);
  }
  return n;
}
