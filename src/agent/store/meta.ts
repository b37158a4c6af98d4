/** The agent's `meta` table (migration 1): small named values (the host id, the host-call token's hash). */
import type { Statements } from "../../store/sqlite/statements.js";

export class MetaTable {
  constructor(private readonly q: Statements) {}

  get(key: string): string | null {
    const row = this.q("SELECT value FROM meta WHERE key = ?").get(key) as { value: string } | undefined;
    return row?.value ?? null;
  }

  set(key: string, value: string): void {
    this.q("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value").run(key, value);
  }
}
