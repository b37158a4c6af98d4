/**
 * SQLite engine (the embedded default): one file, WAL, synchronous=FULL so a
 * commit is on disk when `transaction` resolves. better-sqlite3 is
 * synchronous, so transactions are serialized through one in-process queue
 * and each one runs BEGIN IMMEDIATE ... COMMIT with no other transaction
 * interleaved; a second process on the same file is handled by busy retries.
 */
import Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import { MIGRATIONS } from "../migrations.js";
import { backoffMs, MAX_TX_ATTEMPTS, pauseForTest, runAfterCommit, type Param, type Store, type TransactionOptions, type Tx } from "../store.js";
import { BerthError } from "../../core/errors.js";

export interface SqliteStoreOptions {
  path: string;
  /** Milliseconds SQLite itself waits on a lock held by another process before reporting busy. */
  busyTimeoutMs?: number;
}

function isBusy(e: unknown): boolean {
  const code = (e as { code?: string }).code ?? "";
  return code === "SQLITE_BUSY" || code.startsWith("SQLITE_BUSY_") || code === "SQLITE_LOCKED";
}

export class SqliteStore implements Store {
  readonly dialect = "sqlite" as const;
  readonly stats = { retries: 0, transactions: 0 };
  readonly db: Database.Database;
  readonly #statements = new Map<string, Statement>();
  #queue: Promise<unknown> = Promise.resolve();
  readonly #tx: Tx;
  /** After-commit callbacks of the transaction now running (only one runs at a time). */
  #afterCommit: Array<() => void> = [];

  constructor(opts: SqliteStoreOptions) {
    this.db = new Database(opts.path);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("synchronous = FULL");
    this.db.pragma("foreign_keys = ON");
    this.db.pragma(`busy_timeout = ${opts.busyTimeoutMs ?? 2000}`);
    const stmt = (sql: string): Statement => {
      let s = this.#statements.get(sql);
      if (!s) {
        s = this.db.prepare(sql);
        this.#statements.set(sql, s);
      }
      return s;
    };
    this.#tx = {
      dialect: "sqlite",
      forUpdate: "",
      skipLocked: "",
      all: async <T>(sql: string, params: readonly Param[] = []) => stmt(sql).all(...params) as T[],
      get: async <T>(sql: string, params: readonly Param[] = []) => stmt(sql).get(...params) as T | undefined,
      run: async (sql: string, params: readonly Param[] = []) => stmt(sql).run(...params).changes,
      afterCommit: (fn: () => void) => {
        this.#afterCommit.push(fn);
      },
    };
    this.migrate();
  }

  private migrate(): void {
    this.db.exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)");
    const applied = new Set((this.db.prepare("SELECT version FROM schema_version").all() as { version: number }[]).map((r) => r.version));
    for (const m of MIGRATIONS) {
      if (applied.has(m.version)) continue;
      const run = this.db.transaction(() => {
        this.db.exec(m.sql.replaceAll("{{SERIAL_PK}}", "INTEGER PRIMARY KEY AUTOINCREMENT"));
        this.db.prepare("INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)").run(m.version, m.name, Date.now());
      });
      run.immediate();
    }
  }

  transaction<T>(fn: (tx: Tx) => Promise<T>, opts?: TransactionOptions): Promise<T> {
    const next = this.#queue.then(() => this.#runWithRetry(fn, opts?.name));
    // The queue only orders transactions; one failing must not stall the next.
    this.#queue = next.catch(() => undefined);
    return next;
  }

  async #runWithRetry<T>(fn: (tx: Tx) => Promise<T>, name: string | undefined): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      this.stats.transactions++;
      try {
        this.db.exec("BEGIN IMMEDIATE");
      } catch (e) {
        if (isBusy(e) && attempt < MAX_TX_ATTEMPTS) {
          this.stats.retries++;
          await sleep(backoffMs(attempt));
          continue;
        }
        if (isBusy(e)) throw new BerthError("store_busy", "store_busy: the database stayed locked by another process; try again");
        throw e;
      }
      this.#afterCommit = [];
      try {
        const result = await fn(this.#tx);
        await pauseForTest(name);
        this.db.exec("COMMIT");
        const done = this.#afterCommit;
        this.#afterCommit = [];
        runAfterCommit(done);
        return result;
      } catch (e) {
        this.#afterCommit = [];
        if (this.db.inTransaction) this.db.exec("ROLLBACK");
        if (isBusy(e) && attempt < MAX_TX_ATTEMPTS) {
          this.stats.retries++;
          await sleep(backoffMs(attempt));
          continue;
        }
        throw e;
      }
    }
  }

  async close(): Promise<void> {
    await this.#queue;
    this.db.close();
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
