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
  /**
   * An INSERT, UPDATE or DELETE (without RETURNING) whose row count the
   * caller does not read. On PostgreSQL it is held and sent with the writes
   * that follow it, as one statement, before the next read, `run` or the
   * commit — one round trip where there were several; a held write never
   * shares a statement with another write to the same table (each sees the
   * rows as they were before the statement), unless both name the one row
   * each touches (`row`) and the rows differ. On SQLite it runs at once.
   * `expect`, when given, is checked on the write's row count when it runs;
   * a mismatch fails the transaction with `expect.error()`. A held write that
   * fails fails the transaction where it is sent, as any statement would.
   */
  write(sql: string, params?: readonly Param[], opts?: WriteOptions): Promise<void>;
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

/** The row count a write must have, and the error that fails the transaction when it has not. */
export interface WriteExpectation {
  rows: number;
  error: () => Error;
}

export interface WriteOptions {
  expect?: WriteExpectation;
  /** The one row the write touches, named within its table (say `kind:ref`): writes naming different rows of one table may share a statement. */
  row?: string;
}

/** Checks a write's row count against its expectation (both engines). */
export function checkWrite(changed: number, expect: WriteExpectation | undefined): void {
  if (expect && changed !== expect.rows) throw expect.error();
}

const WRITE_TARGET = /^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+([A-Za-z_][A-Za-z0-9_]*)\b/i;

/** The table a `Tx.write` statement changes; throws for anything `write` does not take (both engines). */
export function writeTable(sql: string): string {
  const m = WRITE_TARGET.exec(sql);
  if (!m || /\bRETURNING\b/i.test(sql) || sql.trimEnd().endsWith(";")) {
    throw new Error(`Tx.write takes one INSERT, UPDATE or DELETE without RETURNING: ${sql.slice(0, 80)}`);
  }
  return m[1]!.toLowerCase();
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
