/**
 * Pure decisions about what a client may ask of a session: which environment
 * variables pass, which window sizes are valid, which SSH signal names map to
 * which process-group signal. No I/O; every arm is tested directly.
 */

/** Variables the agent itself sets inside a machine; a client can never override them. */
export const RESERVED_ENV = new Set([
  "BERTH_INCARNATION",
  "BERTH_MACHINE",
  "BERTH_MACHINE_ID",
  "BERTH_SESSION",
  "BERTH_SESSION_ID",
  "BERTH_GRANT",
  "BERTH_GRANT_ID",
  "BERTH_GENERATION",
]);

export const MAX_ENV_VARS = 64;
export const MAX_ENV_VALUE = 4096;

export type EnvDecision = { kind: "accept" } | { kind: "refuse"; why: string };

/** SSH `env` requests: LANG, LC_*, TERM, TZ and BERTH_* (minus reserved names) only. */
export function envDecision(name: string, value: string, alreadySet: number): EnvDecision {
  if (!/^[A-Za-z_][A-Za-z0-9_]{0,127}$/.test(name)) return { kind: "refuse", why: "not a valid variable name" };
  if (value.length > MAX_ENV_VALUE || value.includes("\0")) return { kind: "refuse", why: "value too long or contains NUL" };
  if (alreadySet >= MAX_ENV_VARS) return { kind: "refuse", why: `at most ${MAX_ENV_VARS} variables per session` };
  if (RESERVED_ENV.has(name)) return { kind: "refuse", why: "reserved for the agent" };
  if (name === "LANG" || name === "TERM" || name === "TZ") return { kind: "accept" };
  if (name.startsWith("LC_") || name.startsWith("BERTH_")) return { kind: "accept" };
  return { kind: "refuse", why: "not in the allowlist (LANG, LC_*, TERM, TZ, BERTH_*)" };
}

/** Rows and columns are non-zero unsigned 16-bit values; pixel sizes are ignored (may be 0). */
export function validWindow(cols: unknown, rows: unknown): { cols: number; rows: number } | null {
  if (typeof cols !== "number" || typeof rows !== "number") return null;
  if (!Number.isInteger(cols) || !Number.isInteger(rows)) return null;
  if (cols < 1 || cols > 0xffff || rows < 1 || rows > 0xffff) return null;
  return { cols, rows };
}

/** RFC 4254 signal names a client may send, and what they become; others are refused. */
export function groupSignalFor(sshName: string): NodeJS.Signals | null {
  switch (sshName) {
    case "INT":
      return "SIGINT";
    case "QUIT":
      return "SIGQUIT";
    case "TSTP":
      return "SIGTSTP";
    // What a client forwards when it is itself told to stop (`berth run` on SIGTERM/SIGHUP).
    case "TERM":
      return "SIGTERM";
    case "HUP":
      return "SIGHUP";
    default:
      return null;
  }
}

/** RFC 4254 exit-signal names are the signal name without "SIG". */
export function sshSignalName(signal: string): string {
  return signal.startsWith("SIG") ? signal.slice(3) : signal;
}
