/** Parses "30s", "10m", "2h", "30d" or a plain number of milliseconds. */
import { BerthError } from "./errors.js";

/** The longest borrow any pool grants (a keeper pool's own cap, its machines' life, may be shorter). */
export const MAX_BORROW_MS = 24 * 3_600_000;
/** The shortest borrow. */
export const MIN_BORROW_MS = 1_000;

const UNIT: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

export function parseDuration(s: string, what = "duration"): number {
  const m = /^(\d{1,9})(ms|s|m|h|d)?$/.exec(s.trim());
  if (!m) throw new BerthError("invalid_request", `invalid_request: ${what} ${JSON.stringify(s)} is not a duration; use e.g. 90s, 10m, 2h or 30d`);
  return Number(m[1]) * UNIT[m[2] ?? "ms"]!;
}

export function formatDuration(ms: number): string {
  if (ms % 86_400_000 === 0 && ms > 0) return `${ms / 86_400_000}d`;
  if (ms % 3_600_000 === 0 && ms > 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0 && ms > 0) return `${ms / 60_000}m`;
  if (ms % 1000 === 0) return `${ms / 1000}s`;
  return `${ms}ms`;
}
