/**
 * The one storage interface. Everything the coordinator persists goes through
 * `transaction(fn)`: `fn` sees a Tx, runs portable SQL (`?` placeholders; the
 * PostgreSQL engine rewrites them), and either commits whole or not at all.
 *
 * `fn` may be re-run after a conflict (SQLite busy, PostgreSQL serialization
 * failure or deadlock), so it must be safe to repeat: randomness, tokens, ids
 * and the clock are computed by the caller before the transaction and passed
 * in. No provider call ever runs inside `fn`.
 */
export type Dialect = "sqlite" | "postgres";

export type Param = string | number | null;

export interface Tx {
  readonly dialect: Dialect;
  all<T = Record<string, unknown>>(sql: string, params?: readonly Param[]): Promise<T[]>;
  get<T = Record<string, unknown>>(sql: string, params?: readonly Param[]): Promise<T | undefined>;
  /** Runs a statement; resolves to the number of rows it changed. */
  run(sql: string, params?: readonly Param[]): Promise<number>;
  /** " FOR UPDATE" on PostgreSQL, "" on SQLite (whose writers are already serialized). */
  readonly forUpdate: string;
  /** " FOR UPDATE SKIP LOCKED" on PostgreSQL, "" on SQLite. */
  readonly skipLocked: string;
}

export interface TransactionOptions {
  /** A name for logs and the retry counter. */
  name?: string;
}

export interface Store {
  readonly dialect: Dialect;
  transaction<T>(fn: (tx: Tx) => Promise<T>, opts?: TransactionOptions): Promise<T>;
  /** Statistics for metrics: how many transactions were retried after a conflict. */
  readonly stats: { retries: number; transactions: number };
  close(): Promise<void>;
}

/** Bounded exponential backoff with jitter for conflict retries. */
export function backoffMs(attempt: number, random: () => number = Math.random): number {
  const base = Math.min(2 ** attempt, 64);
  return base * (0.5 + random());
}

export const MAX_TX_ATTEMPTS = 12;
