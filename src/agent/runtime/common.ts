/** Small pieces both runtimes share: the clean environment, the login shell, PTY sizes, incarnation ids. */
import { existsSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { BerthError } from "../../core/errors.js";

/** A fresh boot id: 128 random bits as 32 hex characters. */
export function newIncarnation(): string {
  return randomBytes(16).toString("hex");
}

/** Names the runtime owns; a request can never set or override them. */
const RESERVED = new Set(["PATH", "HOME", "USER", "SHELL", "BERTH_MACHINE", "BERTH_INCARNATION"]);

/**
 * The whole environment of a command: the runtime's base variables plus the
 * request's (already allow-listed by the agent), minus anything reserved,
 * over the image's Env when the machine boots one.
 * LANG defaults to C.UTF-8 on the host's root; TERM comes from the PTY request.
 */
export function cleanEnv(requested: Record<string, string>, base: Record<string, string>, image: Record<string, string> | null = null): Record<string, string> {
  // The host root has C.UTF-8; an image sets its own locale (or none), as docker leaves it.
  const env: Record<string, string> = image === null ? { LANG: "C.UTF-8" } : {};
  const defaults = image ?? {};
  // An image's own environment: below the request, above LANG's default.
  for (const [k, v] of Object.entries(defaults)) if (!RESERVED.has(k) && !v.includes("\0")) env[k] = v;
  for (const [k, v] of Object.entries(requested)) {
    // BERTH_* other than the reserved names pass: the agent's allowlist (sessions/events.ts)
    // already refused the names it sets itself, and the base below always wins.
    if (RESERVED.has(k)) continue;
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k) || v.includes("\0")) continue;
    env[k] = v;
  }
  return { ...env, ...base };
}

/** The login shell: bash where present, else sh. */
export function loginShell(root = ""): string {
  return existsSync(`${root}/bin/bash`) ? "/bin/bash" : "/bin/sh";
}

/** Rows and columns are non-zero unsigned 16-bit values. */
export function validatePty(cols: number, rows: number): void {
  const ok = (n: number): boolean => Number.isInteger(n) && n >= 1 && n <= 65535;
  if (!ok(cols) || !ok(rows)) {
    throw new BerthError("invalid_request", `invalid_request: terminal size ${cols}x${rows} is invalid; columns and rows must be integers from 1 to 65535`);
  }
}
