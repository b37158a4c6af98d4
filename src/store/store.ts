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
  /**
   * Runs `fn` once, after this attempt commits; dropped if it rolls back or is
   * retried. For side effects that must count only what really happened
   * (metrics), since the transaction body itself may run several times.
   */
  afterCommit(fn: () => void): void;
}

export interface TransactionOptions {
  /** A name for logs and the retry counter. */
  name?: string;
}

export interface Store {
  readonly dialect: Dialect;
  transaction<T>(fn: (tx: Tx) => Promise<T>, opts?: TransactionOptions): Promise<T>;
  /**
   * One read-only statement against the latest committed state, outside the
   * transaction queue (no BEGIN/COMMIT, no wait behind writers): for
   * per-request checks such as API-token lookup, where a separate
   * transaction would cost more than the read. It never sees uncommitted writes.
   */
  readCommitted<T = Record<string, unknown>>(sql: string, params?: readonly Param[]): Promise<T | undefined>;
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

/**
 * Test hook, for the crash-atomicity test only: when NODE_ENV=test and
 * BERTH_TEST_PAUSE_IN_TX names a transaction, the engine stops that
 * transaction after its body ran and before COMMIT, prints
 * `berth-test: paused in transaction <name>` on stderr and waits forever, so
 * the test can SIGKILL the process with every write made but none committed.
 * Without both variables this is a no-op.
 */
export async function pauseForTest(name: string | undefined): Promise<void> {
  if (name === undefined || process.env.NODE_ENV !== "test" || process.env.BERTH_TEST_PAUSE_IN_TX !== name) return;
  process.stderr.write(`berth-test: paused in transaction ${name}\n`);
  await new Promise<never>(() => setInterval(() => undefined, 60_000));
}

/** Runs after-commit callbacks; one that throws does not stop the others. */
export function runAfterCommit(fns: Array<() => void>): void {
  for (const fn of fns) {
    try {
      fn();
    } catch {
      // Metrics and similar bookkeeping only; the commit already happened.
    }
  }
}
