/**
 * SQLite engine (the embedded default): one file, WAL, synchronous=FULL so a
 * commit is on disk when `transaction` resolves. better-sqlite3 is
 * synchronous, so transactions are serialized through one in-process queue;
 * a second process on the same file is handled by busy retries.
 *
 * Group commit: the transactions queued while the previous commit was on
 * its way to disk run one after another inside one BEGIN IMMEDIATE ...
 * COMMIT, each in its own SAVEPOINT (a body that throws is rolled back to
 * its savepoint and affects no other). Every transaction of the group
 * resolves or rejects only after the group's COMMIT returned, so nothing is
 * answered before the state it wrote (or read) is durable. The order is the
 * queue order, so the outcome is the same as running them one at a time;
 * only the number of WAL fsyncs drops (one per group instead of one per
 * transaction).
 */
import { privateDatabaseFile } from "../private-file.js";
import Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import { MIGRATIONS } from "../migrations.js";
import { runMigrations, sqliteMigrationDriver } from "../migrate.js";
import { backoffMs, checkWrite, writeTable, MAX_TX_ATTEMPTS, pauseForTest, runAfterCommit, type Param, type Store, type TransactionOptions, type Tx, type WriteOptions } from "../store.js";
import { BerthError } from "../../core/errors.js";
import { readers, statements, type Readers } from "./statements.js";

export interface SqliteStoreOptions {
  path: string;
  /** Milliseconds SQLite itself waits on a lock held by another process before reporting busy. */
  busyTimeoutMs?: number;
}

function isBusy(e: unknown): boolean {
  const code = (e as { code?: string }).code ?? "";
  return code === "SQLITE_BUSY" || code.startsWith("SQLITE_BUSY_") || code === "SQLITE_LOCKED";
}

/** Most transactions one group commit carries (bounds the wait of the group's first member). */
const MAX_GROUP = 128;

interface Pending {
  fn: (tx: Tx) => Promise<unknown>;
  name: string | undefined;
  attempt: number;
  resolve(v: unknown): void;
  reject(e: unknown): void;
}

export class SqliteStore implements Store {
  readonly dialect = "sqlite" as const;
  readonly stats = { retries: 0, transactions: 0 };
  readonly db: Database.Database;
  readonly #pending: Pending[] = [];
  #draining = false;
  readonly #idle: Array<() => void> = [];
  readonly #stmts: Record<"begin" | "commit" | "rollback" | "savepoint" | "release" | "rollbackTo", Statement>;
  readonly #tx: Tx;
  /** A second, read-only connection: each statement on it sees the last committed state (WAL snapshot), never the open group. */
  readonly #reader: Database.Database;
  readonly #readerStatement: Readers;
  /** After-commit callbacks of the transaction now running (only one runs at a time). */
  #afterCommit: Array<() => void> = [];

  constructor(opts: SqliteStoreOptions) {
    if (opts.path !== ":memory:" && !opts.path.startsWith("file:")) privateDatabaseFile(opts.path);
    this.db = new Database(opts.path);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("synchronous = FULL");
    this.db.pragma("foreign_keys = ON");
    this.db.pragma(`busy_timeout = ${opts.busyTimeoutMs ?? 2000}`);
    const stmt = statements(this.db);
    const reader = readers(this.db);
    this.#tx = {
      dialect: "sqlite",
      forUpdate: "",
      skipLocked: "",
      all: async <T>(sql: string, params: readonly Param[] = []) => {
        const r = reader(sql);
        return (r.statement.all(...params) as unknown[][]).map(r.row) as T[];
      },
      get: async <T>(sql: string, params: readonly Param[] = []) => readRow<T>(reader, sql, params),
      run: async (sql: string, params: readonly Param[] = []) => stmt(sql).run(...params).changes,
      // One writer, in process, no round trips: nothing to gain by holding a write.
      write: async (sql: string, params: readonly Param[] = [], opts?: WriteOptions) => {
        writeTable(sql); // the same statements as on PostgreSQL
        checkWrite(stmt(sql).run(...params).changes, opts?.expect);
      },
      afterCommit: (fn: () => void) => {
        this.#afterCommit.push(fn);
      },
    };
    this.migrate();
    const memory = opts.path === ":memory:" || opts.path.startsWith("file::memory");
    this.#reader = memory ? this.db : new Database(opts.path, { readonly: true, fileMustExist: true });
    if (!memory) this.#reader.pragma(`busy_timeout = ${opts.busyTimeoutMs ?? 2000}`);
    this.#readerStatement = readers(this.#reader);
    this.#stmts = {
      begin: this.db.prepare("BEGIN IMMEDIATE"),
      commit: this.db.prepare("COMMIT"),
      rollback: this.db.prepare("ROLLBACK"),
      savepoint: this.db.prepare("SAVEPOINT berth_tx"),
      release: this.db.prepare("RELEASE berth_tx"),
      rollbackTo: this.db.prepare("ROLLBACK TO berth_tx"),
    };
  }

  private migrate(): void {
    runMigrations(sqliteMigrationDriver(this.db), MIGRATIONS);
  }

  transaction<T>(fn: (tx: Tx) => Promise<T>, opts?: TransactionOptions): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.#pending.push({ fn, name: opts?.name, attempt: 0, resolve: resolve as (v: unknown) => void, reject });
      if (!this.#draining) {
        this.#draining = true;
        // After the current I/O phase, so that requests read in the same
        // turn of the event loop join one group.
        setImmediate(() => void this.#drain());
      }
    });
  }

  async #drain(): Promise<void> {
    while (this.#pending.length > 0) {
      await this.#runGroup(this.#pending.splice(0, MAX_GROUP));
      if (this.#pending.length > 0) await new Promise((r) => setImmediate(r));
    }
    this.#draining = false;
    for (const w of this.#idle.splice(0)) w();
  }

  /** BEGIN IMMEDIATE, waiting with backoff while another process holds the write lock. */
  async #begin(): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        this.#stmts.begin.run();
        return;
      } catch (e) {
        if (isBusy(e) && attempt < MAX_TX_ATTEMPTS) {
          this.stats.retries++;
          await sleep(backoffMs(attempt));
          continue;
        }
        if (isBusy(e)) throw new BerthError("store_busy", "store_busy: the database stayed locked by another process; try again");
        throw e;
      }
    }
  }

  async #runGroup(group: Pending[]): Promise<void> {
    try {
      await this.#begin();
    } catch (e) {
      for (const p of group) p.reject(e);
      return;
    }
    const single = group.length === 1;
    const settled: Array<{ p: Pending; ok: true; value: unknown; after: Array<() => void> } | { p: Pending; ok: false; error: unknown }> = [];
    const again: Pending[] = [];
    for (let i = 0; i < group.length; i++) {
      const p = group[i]!;
      this.stats.transactions++;
      this.#afterCommit = [];
      if (!single) this.#stmts.savepoint.run();
      try {
        const value = await p.fn(this.#tx);
        await pauseForTest(p.name);
        if (!single) this.#stmts.release.run();
        settled.push({ p, ok: true, value, after: this.#afterCommit });
      } catch (e) {
        this.#afterCommit = [];
        if (!this.db.inTransaction) {
          // SQLite rolled the whole transaction back itself (I/O error, disk
          // full, ...): the group's earlier bodies lost their writes too, so
          // they and the ones not yet run go round again; this one fails.
          p.reject(e);
          this.#retryLater([...settled.filter((s) => s.ok).map((s) => s.p), ...group.slice(i + 1)], settled);
          return;
        }
        if (single) this.#stmts.rollback.run();
        else {
          this.#stmts.rollbackTo.run();
          this.#stmts.release.run();
        }
        if (isBusy(e) && p.attempt < MAX_TX_ATTEMPTS) {
          p.attempt++;
          this.stats.retries++;
          again.push(p);
        } else settled.push({ p, ok: false, error: e });
      }
    }
    if (this.db.inTransaction) {
      try {
        this.#stmts.commit.run();
      } catch (e) {
        if (this.db.inTransaction) this.#stmts.rollback.run();
        // Nothing of the group is durable: busy goes round again, anything else refuses them all.
        if (isBusy(e)) this.#retryLater([...settled.map((s) => s.p), ...again], []);
        else for (const s of [...settled, ...again.map((p) => ({ p }))]) s.p.reject(e);
        return;
      }
    }
    for (const s of settled) {
      if (s.ok) {
        runAfterCommit(s.after);
        s.p.resolve(s.value);
      } else s.p.reject(s.error);
    }
    if (again.length > 0) {
      await sleep(backoffMs(Math.max(...again.map((p) => p.attempt))));
      this.#pending.unshift(...again);
    }
  }

  /** Puts bodies back at the head of the queue (they are safe to re-run); refusals already decided are sent. */
  #retryLater(ps: Pending[], settled: Array<{ p: Pending; ok: boolean; error?: unknown }>): void {
    for (const s of settled) if (!s.ok) s.p.reject(s.error);
    const keep: Pending[] = [];
    for (const p of ps) {
      if (p.attempt >= MAX_TX_ATTEMPTS) p.reject(new BerthError("store_busy", "store_busy: the database kept failing to commit; try again"));
      else {
        p.attempt++;
        this.stats.retries++;
        keep.push(p);
      }
    }
    this.#pending.unshift(...keep);
  }

  async readCommitted<T>(sql: string, params: readonly Param[] = []): Promise<T | undefined> {
    return readRow<T>(this.#readerStatement, sql, params);
  }

  async close(): Promise<void> {
    if (this.#draining) await new Promise<void>((r) => this.#idle.push(r));
    if (this.#reader !== this.db) this.#reader.close();
    this.db.close();
  }
}

/** One row of a reading statement as an object, or undefined. */
function readRow<T>(reader: Readers, sql: string, params: readonly Param[]): T | undefined {
  const r = reader(sql);
  const values = r.statement.get(...params) as unknown[] | undefined;
  return values === undefined ? undefined : (r.row(values) as T);
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
