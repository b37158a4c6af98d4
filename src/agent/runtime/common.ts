/** Small pieces both runtimes share: per-machine serialisation, the clean environment, incarnation ids. */
import { existsSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { BerthError } from "../../core/errors.js";

/**
 * Serialises operations per machine id (create/exec-start/fence/scrub/destroy),
 * so a fence never races a half-started command or a second fence.
 */
export class KeyedLock {
  private readonly tails = new Map<string, Promise<unknown>>();
  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }
}

/** A fresh boot id: 128 random bits as 32 hex characters. */
export function newIncarnation(): string {
  return randomBytes(16).toString("hex");
}

/** Names the runtime owns; a request can never set or override them. */
const RESERVED = new Set(["PATH", "HOME", "USER", "SHELL", "BERTH_MACHINE", "BERTH_INCARNATION"]);

/**
 * The whole environment of a command: the runtime's base variables plus the
 * request's (already allow-listed by the agent), minus anything reserved.
 * LANG defaults to C.UTF-8; TERM comes from the PTY request.
 */
export function cleanEnv(requested: Record<string, string>, base: Record<string, string>): Record<string, string> {
  const env: Record<string, string> = { LANG: "C.UTF-8" };
  for (const [k, v] of Object.entries(requested)) {
    // BERTH_* other than the reserved names pass: the agent's allowlist (sessions-events.ts)
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
