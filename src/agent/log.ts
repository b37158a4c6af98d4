/**
 * The agent's log: a pino logger or anything shaped like one. Always called
 * as `(fields, message)`. Nothing logged ever carries a token or a private key.
 */
export interface AgentLog {
  info(fields: Record<string, unknown>, msg: string): void;
  warn(fields: Record<string, unknown>, msg: string): void;
  error(fields: Record<string, unknown>, msg: string): void;
}

/** A log that drops everything (library use without a logger). */
export const silentLog: AgentLog = {
  info() {},
  warn() {},
  error() {},
};

/** An error's message, bounded, for logs and operation records. */
export function errorMessage(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).slice(0, 1000);
}
