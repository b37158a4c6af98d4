/**
 * The agent's local store: one SQLite file (`agent.db`) in the state
 * directory, opened only by the process that holds the directory's lock.
 *
 * The lock is SQLite's own: `locking_mode=EXCLUSIVE` plus an immediate write
 * transaction at open takes the file's exclusive lock and keeps it until the
 * connection closes or the process dies (a SIGKILLed agent leaves no stale
 * lock: the kernel drops its file locks). A second agent on the same directory
 * meets SQLITE_BUSY at open, with no wait, and refuses to start
 * (`agent_locked`). Everything else in the state directory (runtime machine
 * directories, the gateway's host key) is owned by whoever holds this lock.
 *
 * Durability: WAL + `synchronous=FULL`, so a committed transaction survives a
 * crash of the process or the host. Every operation result is committed
 * before the agent replies (src/agent/operations/dispatch.ts).
 *
 * One file per table beside this one, each with its row type and named
 * statements (prepared once per connection); every migration is in
 * migrations.ts (tests may pass more to `AgentStore.open`). Callers group
 * statements of several tables in `transaction`.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { runMigrations, sqliteMigrationDriver, SCHEMA_VERSION_TABLE, type Migration } from "../../store/migrate.js";
import { statements } from "../../store/sqlite/statements.js";
import { privateDatabaseFile } from "../../store/private-file.js";
import type { SessionStore } from "../sessions/store.js";
import { AGENT_MIGRATIONS, LEGACY_NAMES } from "./migrations.js";
import { MetaTable } from "./meta.js";
import { MachineTable } from "./machines.js";
import { KeyTable } from "./keys.js";
import { RemovedKeyTable } from "./removed-keys.js";
import { OperationTable } from "./operations.js";
import { HoldTable } from "./holds.js";
import { VolumeTable } from "./volumes.js";
import { NetworkTable } from "./networks.js";
import { SessionTable } from "./sessions.js";
import { FloorMark } from "./floor-mark.js";

export { AGENT_MIGRATIONS };
export type { MachineRecord, MachineState } from "./machines.js";
export type { StoredKey } from "./keys.js";
export type { OpRecord, OpStatus } from "./operations.js";

export const STORE_FILE = "agent.db";

/** A refusal to open: another process holds the state directory. */
export class AgentLockedError extends Error {
  readonly code = "agent_locked";
  constructor(readonly stateDir: string) {
    super(
      `agent_locked: another berth agent holds ${stateDir}; stop it first, or give this agent its own --state-dir`,
    );
    this.name = "AgentLockedError";
  }
}

export interface OpenOptions {
  /** Extra migrations (tests), versioned after the agent's own. */
  migrations?: Migration[];
}

export class AgentStore {
  readonly path: string;
  readonly db: Database.Database;
  #closed = false;
  /** Small named values: the host id, the host-call token's hash. */
  readonly meta: MetaTable;
  readonly machines: MachineTable;
  readonly keys: KeyTable;
  readonly removedKeys: RemovedKeyTable;
  readonly operations: OperationTable;
  /** Allocation slot holds. */
  readonly holds: HoldTable;
  /** Allocation workspace volumes. */
  readonly volumes: VolumeTable;
  /** Machine networks. */
  readonly networks: NetworkTable;
  /** Session records (the gateway's). */
  readonly sessions: SessionStore;
  /** The host identity floor's mark in the store (src/agent/identity/floor.ts). */
  readonly floor: FloorMark;

  private constructor(readonly stateDir: string, db: Database.Database, path: string) {
    this.db = db;
    this.path = path;
    const q = statements(db);
    this.meta = new MetaTable(q);
    this.machines = new MachineTable(q);
    this.keys = new KeyTable(q);
    this.removedKeys = new RemovedKeyTable(q);
    this.operations = new OperationTable(q);
    this.holds = new HoldTable(q);
    this.volumes = new VolumeTable(q);
    this.networks = new NetworkTable(q);
    this.floor = new FloorMark(q);
    this.sessions = new SessionTable(q, db);
  }

  /**
   * Opens (creating if needed) the store of `stateDir` and takes its lock.
   * Throws AgentLockedError when another process holds it.
   */
  static open(stateDir: string, opts: OpenOptions = {}): AgentStore {
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    const path = join(stateDir, STORE_FILE);
    // 0600 before SQLite opens it: its -wal file takes the database file's mode.
    privateDatabaseFile(path);
    // timeout 0: a held lock is a refusal now, not a wait.
    const db = new Database(path, { timeout: 0 });
    try {
      // Order matters: exclusive locking before WAL, so the WAL index lives in
      // this process's memory and no other process can even read the file.
      db.pragma("locking_mode = EXCLUSIVE");
      db.pragma("journal_mode = WAL");
      db.pragma("synchronous = FULL");
      db.pragma("foreign_keys = ON");
      // Takes the exclusive lock now and keeps it (exclusive locking mode
      // never releases it after a write transaction).
      db.exec("BEGIN IMMEDIATE; COMMIT;");
    } catch (e) {
      db.close();
      if (isBusy(e)) throw new AgentLockedError(stateDir);
      throw e;
    }
    const store = new AgentStore(stateDir, db, path);
    store.#migrate([...AGENT_MIGRATIONS, ...(opts.migrations ?? [])]);
    return store;
  }

  #migrate(list: Migration[]): void {
    this.#adoptLegacySchema();
    runMigrations(sqliteMigrationDriver(this.db), list);
  }

  /** A store written before `schema_version`: record its named migrations by version, once. */
  #adoptLegacySchema(): void {
    const legacy = this.db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'").get();
    if (!legacy) return;
    // The host identity floor (src/agent/identity/floor.ts) lives in this
    // table on purpose: builds from before it refuse the store. It stays.
    const floor = this.db.prepare("SELECT 1 FROM schema_migrations WHERE name = 'identity_floor'").get() !== undefined;
    const others = this.db.prepare("SELECT COUNT(*) AS n FROM schema_migrations WHERE name <> 'identity_floor'").get() as { n: number };
    if (floor && others.n === 0) return;
    this.transaction(() => {
      this.db.exec(SCHEMA_VERSION_TABLE);
      const rows = this.db.prepare("SELECT name, applied_at FROM schema_migrations WHERE name <> 'identity_floor'").all() as Array<{ name: string; applied_at: number }>;
      for (const r of rows) {
        const version = LEGACY_NAMES[r.name];
        if (version === undefined) throw new Error(`agent store: unknown migration ${r.name} recorded; it was written by another berth build`);
        this.db.prepare("INSERT OR IGNORE INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)").run(version, r.name, r.applied_at);
      }
      if (floor) this.db.exec("DELETE FROM schema_migrations WHERE name <> 'identity_floor'");
      else this.db.exec("DROP TABLE schema_migrations");
    });
  }

  /** Runs `fn` in one immediate write transaction (all or nothing). */
  transaction<T>(fn: () => T): T {
    return this.db.transaction(fn).immediate();
  }

  /** Releases the lock. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.db.close();
  }
}

function isBusy(e: unknown): boolean {
  const code = (e as { code?: unknown }).code;
  return code === "SQLITE_BUSY" || code === "SQLITE_LOCKED" || (typeof code === "string" && code.startsWith("SQLITE_BUSY"));
}
