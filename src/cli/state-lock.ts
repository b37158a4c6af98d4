/**
 * The lock of a `berth up` / `berth serve` state directory: one `berth up`
 * uses a directory's database, writes its `client.json` and drains its pools.
 * Several `berth serve`s may share one SQLite database (several coordinators
 * on one database are supported), but never with a `berth up`.
 *
 * The lock is SQLite's own file lock on `lock.db` (rollback journal):
 * `berth up` writes it in `locking_mode=EXCLUSIVE` and so keeps the
 * exclusive lock; `berth serve` keeps a read transaction open and so a shared
 * lock. Held for the life of the process and dropped by the kernel at any
 * exit (kill -9 included), so a stale lock cannot exist. Taken before
 * anything else in the directory is opened or written. The holder describes
 * itself in `holder.json` (pid, command, URL; 0600), written after the lock
 * is taken, so a refused process can name it; the file is informative only —
 * the lock decides.
 */
import Database from "better-sqlite3";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { writeFileDurable } from "../io/durable-file.js";

export const LOCK_FILE = "lock.db";
export const HOLDER_FILE = "holder.json";

interface Holder {
  pid: number;
  command: string;
  url: string | null;
  since: string;
}

/** Another berth up (or, for berth up, a berth serve) holds the directory. Exit 3, as the agent's `agent_locked`. */
export class StateDirLockedError extends Error {
  readonly code = "state_dir_locked";
  constructor(dir: string, holder: Holder | null) {
    const who = holder
      ? `${holder.command} (pid ${holder.pid}${holder.url ? `, ${holder.url}` : ""}, since ${holder.since})`
      : "another berth up or berth serve";
    const stop = holder ? `stop it first (Ctrl-C in its terminal, or kill -INT ${holder.pid})` : "stop it first";
    super(`state_dir_locked: ${who} holds the state directory ${dir}; ${stop}, or give this one its own --state-dir`);
    this.name = "StateDirLockedError";
  }
}

export class StateDirLock {
  private constructor(
    private readonly dir: string,
    private readonly db: Database.Database,
    private holder: Holder,
  ) {}

  /**
   * Takes the lock of `dir` (which must exist) now — exclusive for `berth up`,
   * shared for `berth serve` — or throws StateDirLockedError naming the holder.
   */
  static take(dir: string, command: "berth up" | "berth serve"): StateDirLock {
    const db = new Database(join(dir, LOCK_FILE), { timeout: 0 });
    try {
      if (command === "berth up") {
        db.pragma("locking_mode = EXCLUSIVE");
        // A real write: its commit takes the exclusive lock, which exclusive mode never gives back.
        db.exec("BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS held (n INTEGER); DELETE FROM held; INSERT INTO held VALUES (1); COMMIT;");
      } else {
        db.exec("BEGIN");
        db.prepare("SELECT count(*) FROM sqlite_master").get();
      }
    } catch (e) {
      db.close();
      if ((e as { code?: string }).code === "SQLITE_BUSY") throw new StateDirLockedError(dir, readHolder(dir));
      throw e;
    }
    const lock = new StateDirLock(dir, db, { pid: process.pid, command, url: null, since: new Date().toISOString().replace(/\.\d+Z$/, "Z") });
    lock.write();
    return lock;
  }

  /** Names the URL the holder serves, for a refused second process to print. */
  setUrl(url: string): void {
    this.holder = { ...this.holder, url };
    this.write();
  }

  release(): void {
    if (this.db.open) this.db.close();
  }

  private write(): void {
    writeFileDurable(join(this.dir, HOLDER_FILE), JSON.stringify(this.holder) + "\n", 0o600);
  }
}

function readHolder(dir: string): Holder | null {
  try {
    const h = JSON.parse(readFileSync(join(dir, HOLDER_FILE), "utf8")) as Holder;
    return typeof h.pid === "number" && typeof h.command === "string" ? h : null;
  } catch {
    return null;
  }
}
