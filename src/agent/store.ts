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
 * before the agent replies (see ops.ts).
 *
 * Schema changes are versioned migrations run by the same runner and scheme
 * as the coordinator's stores (src/store/migrate.ts); other parts of the
 * agent add theirs by appending to `AGENT_MIGRATIONS` (or, in tests, passing
 * `migrations` to `AgentStore.open`).
 */
import { privateDatabaseFile } from "../store/private-file.js";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import type { InstalledKey } from "./contracts.js";
import { runMigrations, sqliteMigrationDriver, SCHEMA_VERSION_TABLE, type Migration } from "../store/migrate.js";
import { ALLOC_AGENT_MIGRATION } from "./alloc-store.js";
import { statements } from "../store/sqlite/statements.js";
import { NETWORK_MIGRATION } from "./network/store.js";

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

/** The agent daemon's own tables. Append only; never edit an applied entry. */
export const AGENT_MIGRATIONS: Migration[] = [
  {
    version: 1,
    name: "agent core",
    sql: `
      CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
      );
      CREATE TABLE machines (
        id          TEXT PRIMARY KEY,
        generation  INTEGER NOT NULL,
        state       TEXT NOT NULL,      -- creating | running | destroying | destroyed | mismatch
        incarnation TEXT,
        workspace   TEXT,
        identity    TEXT,               -- runtime identity JSON (RuntimeMachine.identity)
        mismatch    TEXT,               -- why recovery refused to adopt it
        created_at  INTEGER NOT NULL,
        updated_at  INTEGER NOT NULL
      );
      CREATE TABLE keys (
        machine_id  TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        public_key  TEXT NOT NULL,
        generation  INTEGER NOT NULL,
        mode        TEXT NOT NULL,      -- grant | keeper
        grant_id    TEXT NOT NULL,
        expires_at  INTEGER,            -- epoch ms; NULL = no expiry (keeper)
        installed_at INTEGER NOT NULL,
        PRIMARY KEY (machine_id, fingerprint)
      );
      -- Keys removed by remove_key, so that a delayed install_key of the same
      -- grant or key at the same generation never restores it.
      CREATE TABLE removed_keys (
        machine_id  TEXT NOT NULL,
        generation  INTEGER NOT NULL,
        grant_id    TEXT,
        fingerprint TEXT,
        removed_at  INTEGER NOT NULL
      );
      CREATE INDEX removed_keys_machine ON removed_keys (machine_id, generation);
      CREATE TABLE operations (
        op_id       TEXT PRIMARY KEY,
        kind        TEXT NOT NULL,
        machine_id  TEXT NOT NULL,
        generation  INTEGER NOT NULL,
        args_hash   TEXT NOT NULL,
        status      TEXT NOT NULL,      -- started | done | failed
        result      TEXT,               -- JSON, once done
        error       TEXT,               -- last failure message, when failed
        created_at  INTEGER NOT NULL,
        finished_at INTEGER
      );
      CREATE INDEX operations_machine ON operations (machine_id, status);
    `,
  },
  {
    // The agent's "create" is the protocol's "provision" (one word on both
    // sides). Its arguments are none, so the kept hash is that of {"kind":"provision"}.
    version: 2,
    name: "one word per operation",
    sql: `
      UPDATE operations SET kind = 'provision', args_hash = 'c6143d9041dff78179887d3720161c11460f1c85c3caa167dbea1807bdb9de41'
        WHERE kind = 'create';
    `,
  },
  ALLOC_AGENT_MIGRATION,
  NETWORK_MIGRATION,
];

/** Named migrations of the scheme before `schema_version` (adopted once, by version). */
const LEGACY_NAMES: Record<string, number> = { "001_agent_core": 1 };

export type MachineState = "creating" | "running" | "destroying" | "destroyed" | "mismatch";

export interface MachineRecord {
  id: string;
  generation: number;
  state: MachineState;
  incarnation: string | null;
  workspace: string | null;
  identity: Record<string, string | number> | null;
  mismatch: string | null;
  createdAt: number;
  updatedAt: number;
}

/** An installed key as stored: the contract's record plus its OpenSSH public key line. */
export interface StoredKey extends InstalledKey {
  publicKey: string;
  installedAt: number;
}

export type OpStatus = "started" | "done" | "failed";

export interface OpRecord {
  opId: string;
  kind: string;
  machineId: string;
  generation: number;
  argsHash: string;
  status: OpStatus;
  result: unknown;
  error: string | null;
  createdAt: number;
  finishedAt: number | null;
}

interface MachineRow {
  id: string;
  generation: number;
  state: string;
  incarnation: string | null;
  workspace: string | null;
  identity: string | null;
  mismatch: string | null;
  created_at: number;
  updated_at: number;
}
interface KeyRow {
  machine_id: string;
  fingerprint: string;
  public_key: string;
  generation: number;
  mode: string;
  grant_id: string;
  expires_at: number | null;
  installed_at: number;
}
interface OpRow {
  op_id: string;
  kind: string;
  machine_id: string;
  generation: number;
  args_hash: string;
  status: string;
  result: string | null;
  error: string | null;
  created_at: number;
  finished_at: number | null;
}

function machineFromRow(r: MachineRow): MachineRecord {
  return {
    id: r.id,
    generation: r.generation,
    state: r.state as MachineState,
    incarnation: r.incarnation,
    workspace: r.workspace,
    identity: r.identity === null ? null : (JSON.parse(r.identity) as Record<string, string | number>),
    mismatch: r.mismatch,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}
function keyFromRow(r: KeyRow): StoredKey {
  return {
    machineId: r.machine_id,
    fingerprint: r.fingerprint,
    publicKey: r.public_key,
    generation: r.generation,
    mode: r.mode === "keeper" ? "keeper" : "grant",
    grantId: r.grant_id,
    expiresAt: r.expires_at,
    installedAt: r.installed_at,
  };
}
function opFromRow(r: OpRow): OpRecord {
  return {
    opId: r.op_id,
    kind: r.kind,
    machineId: r.machine_id,
    generation: r.generation,
    argsHash: r.args_hash,
    status: r.status as OpStatus,
    result: r.result === null ? null : (JSON.parse(r.result) as unknown),
    error: r.error,
    createdAt: r.created_at,
    finishedAt: r.finished_at,
  };
}

export interface OpenOptions {
  /** Extra migrations (tests), versioned after the agent's own. */
  migrations?: Migration[];
}

export class AgentStore {
  readonly path: string;
  readonly db: Database.Database;
  #closed = false;
  #q: (sql: string) => Database.Statement;

  private constructor(readonly stateDir: string, db: Database.Database, path: string) {
    this.db = db;
    this.path = path;
    this.#q = statements(db);
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

  // ---- meta --------------------------------------------------------------

  getMeta(key: string): string | null {
    const row = this.#q("SELECT value FROM meta WHERE key = ?").get(key) as { value: string } | undefined;
    return row?.value ?? null;
  }

  setMeta(key: string, value: string): void {
    this.#q("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
      .run(key, value);
  }

  // ---- machines ----------------------------------------------------------

  getMachine(id: string): MachineRecord | null {
    const row = this.#q("SELECT * FROM machines WHERE id = ?").get(id) as MachineRow | undefined;
    return row ? machineFromRow(row) : null;
  }

  /** Every machine record, destroyed ones included when `all`. */
  listMachines(all = false): MachineRecord[] {
    const sql = all
      ? "SELECT * FROM machines ORDER BY id"
      : "SELECT * FROM machines WHERE state <> 'destroyed' ORDER BY id";
    return (this.#q(sql).all() as MachineRow[]).map(machineFromRow);
  }

  putMachine(m: MachineRecord): void {
    this.#q(
      `INSERT INTO machines (id, generation, state, incarnation, workspace, identity, mismatch, created_at, updated_at)
       VALUES (@id, @generation, @state, @incarnation, @workspace, @identity, @mismatch, @createdAt, @updatedAt)
       ON CONFLICT(id) DO UPDATE SET generation = excluded.generation, state = excluded.state,
         incarnation = excluded.incarnation, workspace = excluded.workspace, identity = excluded.identity,
         mismatch = excluded.mismatch, updated_at = excluded.updated_at`,
    )
      .run({ ...m, identity: m.identity === null ? null : JSON.stringify(m.identity) });
  }

  // ---- keys --------------------------------------------------------------

  listKeys(machineId?: string): StoredKey[] {
    const rows = (
      machineId === undefined
        ? this.#q("SELECT * FROM keys ORDER BY machine_id, installed_at").all()
        : this.#q("SELECT * FROM keys WHERE machine_id = ? ORDER BY installed_at").all(machineId)
    ) as KeyRow[];
    return rows.map(keyFromRow);
  }

  putKey(k: StoredKey): void {
    this.#q(
      `INSERT INTO keys (machine_id, fingerprint, public_key, generation, mode, grant_id, expires_at, installed_at)
       VALUES (@machineId, @fingerprint, @publicKey, @generation, @mode, @grantId, @expiresAt, @installedAt)
       ON CONFLICT(machine_id, fingerprint) DO UPDATE SET public_key = excluded.public_key,
         generation = excluded.generation, mode = excluded.mode, grant_id = excluded.grant_id,
         expires_at = excluded.expires_at, installed_at = excluded.installed_at`,
    )
      .run(k);
  }

  deleteKey(machineId: string, fingerprint: string): void {
    this.#q("DELETE FROM keys WHERE machine_id = ? AND fingerprint = ?").run(machineId, fingerprint);
  }

  recordRemoved(
    machineId: string,
    generation: number,
    grantId: string | null,
    fingerprint: string | null,
    now: number,
  ): void {
    this.#q(
      "INSERT INTO removed_keys (machine_id, generation, grant_id, fingerprint, removed_at) VALUES (?, ?, ?, ?, ?)",
    )
      .run(machineId, generation, grantId, fingerprint, now);
  }

  /** Whether this grant or key was removed from the machine at this generation. */
  wasRemoved(machineId: string, generation: number, grantId: string, fingerprint: string): boolean {
    return (
      this.#q(
        `SELECT 1 FROM removed_keys WHERE machine_id = ? AND generation = ? AND (grant_id = ? OR fingerprint = ?) LIMIT 1`,
      )
        .get(machineId, generation, grantId, fingerprint) !== undefined
    );
  }

  /** Tombstones of older generations can never matter again (installs for them are refused). */
  pruneRemoved(machineId: string, belowGeneration: number): void {
    this.#q("DELETE FROM removed_keys WHERE machine_id = ? AND generation < ?").run(machineId, belowGeneration);
  }

  // ---- operations --------------------------------------------------------

  getOp(opId: string): OpRecord | null {
    const row = this.#q("SELECT * FROM operations WHERE op_id = ?").get(opId) as OpRow | undefined;
    return row ? opFromRow(row) : null;
  }

  /** Operations begun and never finished (by a process that crashed, or in flight now). */
  unfinishedOps(machineId: string): OpRecord[] {
    return (
      this.#q("SELECT * FROM operations WHERE machine_id = ? AND status <> 'done' ORDER BY created_at")
        .all(machineId) as OpRow[]
    ).map(opFromRow);
  }

  insertOp(op: {
    opId: string;
    kind: string;
    machineId: string;
    generation: number;
    argsHash: string;
    now: number;
  }): void {
    this.#q(
      `INSERT INTO operations (op_id, kind, machine_id, generation, args_hash, status, created_at)
       VALUES (@opId, @kind, @machineId, @generation, @argsHash, 'started', @now)`,
    )
      .run(op);
  }

  markOpStarted(opId: string): void {
    this.#q("UPDATE operations SET status = 'started', error = NULL WHERE op_id = ?").run(opId);
  }

  finishOp(opId: string, result: unknown, now: number): void {
    this.#q("UPDATE operations SET status = 'done', result = ?, error = NULL, finished_at = ? WHERE op_id = ?")
      .run(JSON.stringify(result), now, opId);
  }

  failOp(opId: string, error: string, now: number): void {
    this.#q("UPDATE operations SET status = 'failed', error = ?, finished_at = ? WHERE op_id = ? AND status <> 'done'")
      .run(error, now, opId);
  }
}

function isBusy(e: unknown): boolean {
  const code = (e as { code?: unknown }).code;
  return code === "SQLITE_BUSY" || code === "SQLITE_LOCKED" || (typeof code === "string" && code.startsWith("SQLITE_BUSY"));
}
