/**
 * PostgreSQL engine (the scale-out path): several coordinators share one
 * database. Transactions run at READ COMMITTED with explicit row locks
 * (`SELECT … FOR UPDATE`, `FOR UPDATE SKIP LOCKED` on queues and the due
 * index) and generation-checked updates; serialization failures and
 * deadlocks are retried with bounded backoff.
 */
import pg from "pg";
import { MIGRATIONS } from "../migrations.js";
import { runMigrations, SCHEMA_VERSION_TABLE } from "../migrate.js";
import { backoffMs, checkWrite, MAX_TX_ATTEMPTS, pauseForTest, runAfterCommit, type Param, type Store, type TransactionOptions, type Tx, type WriteOptions } from "../store.js";
import { batchStatement, checkBatch, heldWrite, sameStatementRisk, type HeldWrite } from "./held-writes.js";
import { BerthError } from "../../core/errors.js";

// BIGINT columns hold epoch milliseconds, well inside a double's exact range.
pg.types.setTypeParser(20, (v: string) => Number(v));

const RETRYABLE = new Set(["40001", "40P01", "55P03"]);

/** A statement as sent: `?` rewritten to `$1..$n`, and its prepared-statement name. */
interface PgStatement {
  text: string;
  /** Absent past NAMED_STATEMENTS distinct texts: sent unnamed (parsed and planned every time). */
  name?: string;
}

/**
 * Distinct statement texts that get a name. A named statement is parsed once
 * per connection and then only bound and executed (and PostgreSQL may keep
 * its plan), which is most of the server's CPU for berth's short statements.
 * Texts are few (held-write batches combine a handful of writes); the bound
 * keeps a text built from data from growing every connection's cache.
 */
const NAMED_STATEMENTS = 2000;

/** Rewrites `?` placeholders to `$1..$n` (berth's SQL never has a literal `?`) and names the statement. */
function toPg(sql: string, cache: Map<string, PgStatement>): PgStatement {
  let out = cache.get(sql);
  if (out === undefined) {
    let n = 0;
    const text = sql.replace(/\?/g, () => `$${++n}`);
    out = cache.size < NAMED_STATEMENTS ? { text, name: `berth_${cache.size}` } : { text };
    cache.set(sql, out);
  }
  return out;
}

export interface PostgresStoreOptions {
  connectionString: string;
  poolSize?: number;
  /** Schema to use (created if missing): lets tests run in isolation on one server. */
  schema?: string;
}

export class PostgresStore implements Store {
  readonly dialect = "postgres" as const;
  readonly stats = { retries: 0, transactions: 0 };
  readonly pool: pg.Pool;
  readonly #sqlCache = new Map<string, PgStatement>();
  readonly #schema: string | undefined;

  private constructor(opts: PostgresStoreOptions) {
    this.#schema = opts.schema;
    // The schema is a startup parameter of every connection: the server sets
    // search_path before the connection exists, or refuses it, so no statement
    // can run on a connection still in the default schema. The name is checked
    // in open() (a plain identifier: nothing in it needs quoting).
    this.pool = new pg.Pool({
      connectionString: opts.connectionString,
      max: opts.poolSize ?? 16,
      ...(opts.schema ? { options: `-c search_path=${opts.schema}` } : {}),
    });
  }

  static async open(opts: PostgresStoreOptions): Promise<PostgresStore> {
    if (opts.schema !== undefined && !/^[a-z_][a-z0-9_]{0,62}$/.test(opts.schema)) {
      throw new BerthError("invalid_request", `invalid_request: PostgreSQL schema name ${JSON.stringify(opts.schema)} is not a plain identifier`);
    }
    const s = new PostgresStore(opts);
    try {
      await s.migrate();
    } catch (e) {
      // A store that could not be set up is never handed out (nor its connections).
      await s.pool.end().catch(() => undefined);
      const where = opts.schema ? `schema "${opts.schema}"` : "the default schema";
      throw new Error(`PostgreSQL ${where} could not be set up: ${(e as Error).message}`, { cause: e });
    }
    return s;
  }

  private async migrate(): Promise<void> {
    const c = await this.pool.connect();
    try {
      if (this.#schema) {
        await c.query(`CREATE SCHEMA IF NOT EXISTS "${this.#schema}"`);
      }
      // One migrator at a time across coordinators.
      await c.query("SELECT pg_advisory_lock(7261337)");
      try {
        await runMigrations(
          {
            dialect: "postgres",
            applied: async () => {
              await c.query(SCHEMA_VERSION_TABLE);
              return (await c.query<{ version: number }>("SELECT version FROM schema_version")).rows.map((r) => r.version);
            },
            apply: async (m, sql, at) => {
              await c.query("BEGIN");
              try {
                await c.query(sql);
                await c.query("INSERT INTO schema_version (version, name, applied_at) VALUES ($1, $2, $3)", [m.version, m.name, at]);
                await c.query("COMMIT");
              } catch (e) {
                await c.query("ROLLBACK");
                throw e;
              }
            },
          },
          MIGRATIONS,
        );
      } finally {
        await c.query("SELECT pg_advisory_unlock(7261337)");
      }
    } finally {
      c.release();
    }
  }

  async transaction<T>(fn: (tx: Tx) => Promise<T>, opts?: TransactionOptions): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      this.stats.transactions++;
      const c = await this.pool.connect();
      const afterCommit: Array<() => void> = [];
      const query = (sql: string, params: readonly Param[]) => c.query({ ...toPg(sql, this.#sqlCache), values: params as Param[] });
      const held: HeldWrite[] = [];
      const send = async (): Promise<void> => {
        if (held.length === 0) return;
        const writes = held.splice(0);
        if (writes.length === 1) return checkWrite((await query(writes[0]!.sql, writes[0]!.params)).rowCount ?? 0, writes[0]!.expect);
        const b = batchStatement(writes);
        checkBatch(writes, (await query(b.sql, b.params)).rows[0] as Record<string, number>);
      };
      const tx: Tx = {
        dialect: "postgres",
        forUpdate: " FOR UPDATE",
        skipLocked: " FOR UPDATE SKIP LOCKED",
        all: async <R>(sql: string, params: readonly Param[] = []) => (await send(), (await query(sql, params)).rows as R[]),
        get: async <R>(sql: string, params: readonly Param[] = []) => (await send(), (await query(sql, params)).rows[0] as R | undefined),
        run: async (sql: string, params: readonly Param[] = []) => (await send(), (await query(sql, params)).rowCount ?? 0),
        write: async (sql: string, params: readonly Param[] = [], opts?: WriteOptions) => {
          const w = heldWrite(sql, params, opts);
          if (held.some((h) => sameStatementRisk(h, w))) await send();
          held.push(w);
        },
        afterCommit: (fn: () => void) => {
          afterCommit.push(fn);
        },
      };
      let result: T;
      try {
        await c.query("BEGIN");
        result = await fn(tx);
        await send();
        await pauseForTest(opts?.name);
        await c.query("COMMIT");
      } catch (e) {
        let broken = false;
        try {
          await c.query("ROLLBACK");
        } catch {
          broken = true;
        }
        c.release(broken);
        const code = (e as { code?: string }).code;
        if (code && RETRYABLE.has(code)) {
          if (attempt < MAX_TX_ATTEMPTS) {
            this.stats.retries++;
            await new Promise((r) => setTimeout(r, backoffMs(attempt)));
            continue;
          }
          throw new BerthError("store_busy", "store_busy: the database kept reporting conflicts; try again");
        }
        throw e;
      }
      c.release();
      runAfterCommit(afterCommit);
      return result;
    }
  }

  async readCommitted<T>(sql: string, params: readonly Param[] = []): Promise<T | undefined> {
    // A single autocommit statement: one round trip instead of BEGIN, SELECT, COMMIT.
    return (await this.pool.query({ ...toPg(sql, this.#sqlCache), values: params as Param[] })).rows[0] as T | undefined;
  }

  async close(): Promise<void> {
    await this.pool.end();
  }
}
