/**
 * The host identity floor's mark in the store (src/agent/identity/floor.ts):
 * a `schema_migrations` row named `identity_floor`. Builds from before host
 * identity refuse to open a store that records a migration they do not know,
 * so once written it keeps them off this state directory for good.
 */
import type { Statements } from "../../store/sqlite/statements.js";

export const FLOOR_MIGRATION_NAME = "identity_floor";

export class FloorMark {
  constructor(private readonly q: Statements) {}

  present(): boolean {
    if (this.q("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'").get() === undefined) return false;
    return this.q("SELECT 1 FROM schema_migrations WHERE name = ?").get(FLOOR_MIGRATION_NAME) !== undefined;
  }

  /** Writes the mark (idempotent); the caller runs it in a transaction. */
  write(now: number): void {
    this.q("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)").run();
    this.q("INSERT OR IGNORE INTO schema_migrations (name, applied_at) VALUES (?, ?)").run(FLOOR_MIGRATION_NAME, now);
  }
}
