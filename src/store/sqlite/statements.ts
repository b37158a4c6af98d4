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
