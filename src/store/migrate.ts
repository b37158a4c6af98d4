/**
 * The one migration runner and scheme, for all three stores (the
 * coordinator's SQLite and PostgreSQL databases, the agent's local SQLite):
 *
 *   - a migration is `{version, name, sql}`: portable SQL, versions strictly
 *     increasing, append only (never edit an applied entry);
 *   - `schema_version (version, name, applied_at)` records what ran;
 *   - each migration and its record commit in one transaction, in order.
 *
 * `{{SERIAL_PK}}` in the SQL becomes the dialect's auto-increment key.
 * better-sqlite3 is synchronous and node-postgres is not, so a driver may
 * answer either way; the runner stays synchronous for a synchronous driver
 * (the SQLite stores migrate inside their constructor).
 */
import type { Dialect } from "./store.js";

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

type Maybe<T> = T | Promise<T>;

export interface MigrationDriver {
  readonly dialect: Dialect;
  /** Creates `schema_version` if absent; resolves to the versions it records. */
  applied(): Maybe<number[]>;
  /** Runs `sql` and records `m`, in one transaction. */
  apply(m: Migration, sql: string, at: number): Maybe<void>;
}

export const SCHEMA_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)";

function then<T, U>(v: Maybe<T>, f: (t: T) => Maybe<U>): Maybe<U> {
  return v instanceof Promise ? v.then(f) : f(v);
}

export function renderSql(sql: string, dialect: Dialect): string {
  return sql.replaceAll("{{SERIAL_PK}}", dialect === "postgres" ? "BIGSERIAL PRIMARY KEY" : "INTEGER PRIMARY KEY AUTOINCREMENT");
}

/** Applies the migrations of `list` the database has not recorded; resolves to the versions applied now. */
export function runMigrations(driver: MigrationDriver, list: readonly Migration[], now: () => number = Date.now): Maybe<number[]> {
  for (let i = 1; i < list.length; i++) {
    if (list[i]!.version <= list[i - 1]!.version) throw new Error(`migration ${list[i]!.name}: versions must increase (${list[i - 1]!.version} then ${list[i]!.version})`);
  }
  return then(driver.applied(), (applied) => {
    const done = new Set(applied);
    const todo = list.filter((m) => !done.has(m.version));
    const step = (i: number): Maybe<number[]> =>
      i >= todo.length ? todo.map((m) => m.version) : then(driver.apply(todo[i]!, renderSql(todo[i]!.sql, driver.dialect), now()), () => step(i + 1));
    return step(0);
  });
}

/** A driver for a better-sqlite3 connection (the coordinator's SQLite store and the agent's). */
export function sqliteMigrationDriver(db: {
  exec(sql: string): unknown;
  prepare(sql: string): { all(...p: unknown[]): unknown[]; run(...p: unknown[]): unknown };
  transaction(fn: () => void): { immediate(): void };
}): MigrationDriver {
  return {
    dialect: "sqlite",
    applied() {
      db.exec(SCHEMA_VERSION_TABLE);
      return (db.prepare("SELECT version FROM schema_version").all() as Array<{ version: number }>).map((r) => r.version);
    },
    apply(m, sql, at) {
      db.transaction(() => {
        db.exec(sql);
        db.prepare("INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)").run(m.version, m.name, at);
      }).immediate();
    },
  };
}
