/** Statements prepared once per connection and reused: preparing costs more than running most of berth's statements (the coordinator's SQLite store and the agent's). */
import type Database from "better-sqlite3";

/** A statement by its SQL, prepared on first use. */
export type Statements = (sql: string) => Database.Statement;

export function statements(db: Database.Database): Statements {
  const cache = new Map<string, Database.Statement>();
  return (sql) => {
    let st = cache.get(sql);
    if (st === undefined) cache.set(sql, (st = db.prepare(sql)));
    return st;
  };
}

/** A statement that returns rows, and how one of its rows (as an array of column values) becomes an object. */
export interface Reader {
  readonly statement: Database.Statement;
  readonly row: (values: unknown[]) => Record<string, unknown>;
}

/** A reading statement by its SQL, prepared on first use. */
export type Readers = (sql: string) => Reader;

/**
 * Readers prepared once per connection, returning the same objects as
 * better-sqlite3's default rows (a column named twice keeps its last value)
 * but built here: on Node 20 better-sqlite3 adds each column to a row object
 * from C++ one property at a time (`v8::Object::Set`, a name lookup and a
 * shape change per column), which was 14 % of the coordinator's main-thread
 * instructions per keeper borrow + return (callgrind, docs/performance.md).
 * The statement answers arrays (`raw`); each statement's row maker is one
 * object literal of its column names, so every row of it has one shape.
 */
export function readers(db: Database.Database): Readers {
  const cache = new Map<string, Reader>();
  return (sql) => {
    let r = cache.get(sql);
    if (r === undefined) {
      const statement = db.prepare(sql).raw(true);
      cache.set(sql, (r = { statement, row: rowMaker(statement.columns().map((c) => c.name)) }));
    }
    return r;
  };
}

function rowMaker(names: string[]): (values: unknown[]) => Record<string, unknown> {
  // An own property named __proto__ cannot be written as a literal key; no berth column is named so.
  if (names.includes("__proto__")) {
    return (values) => {
      const o: Record<string, unknown> = {};
      names.forEach((n, i) => Object.defineProperty(o, n, { value: values[i], writable: true, enumerable: true, configurable: true }));
      return o;
    };
  }
  // The names are the statement's own column names (berth's SQL), each written as a JSON string literal.
  return new Function("v", `return {${names.map((n, i) => `${JSON.stringify(n)}: v[${i}]`).join(", ")}};`) as (values: unknown[]) => Record<string, unknown>;
}
