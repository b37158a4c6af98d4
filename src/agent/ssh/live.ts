/**
 * The gateway's live connections and sessions (gateway.ts): what its parts
 * share, ending a connection, and starting a session on an accepted channel
 * (the key authority re-asked first; a timer at the key's expiresAt cuts it).
 */
import { randomBytes } from "node:crypto";
import type { Connection, ServerChannel } from "ssh2";
import { newId } from "../../core/ids.js";
import type { InstalledKey, KeyAuthority } from "../contracts.js";
import type { PtyRequest } from "../runtime/types.js";
import { Session } from "../sessions/session.js";
import type { SessionDeps } from "../sessions/types.js";

export const MAX_SESSIONS_PER_CONNECTION = 16;
const MAX_TIMER_MS = 2 ** 31 - 1;

/** What every part of the gateway shares: what a session needs (runtime, session store, clock, log, timing), the key authority, and what is live now. */
export interface GatewayContext extends SessionDeps {
  /** Which keys may open which machine. */
  keys: KeyAuthority;
  /** Every accepted connection not yet lost. */
  conns: Set<Conn>;
  /** Every session not yet ended. */
  live: Set<Session>;
  /** Set once the gateway is closing: nothing new is authenticated or started. */
  closing: boolean;
}

/** One authenticated connection: one machine, one key. */
export interface Conn {
  client: Connection;
  machineId: string | null;
  key: InstalledKey | null;
  sessions: Set<Session>;
  /** Fires at the key's expiresAt. */
  timer: { cancel(): void } | null;
  ended: boolean;
}

/** Cut the connection's sessions and end it (once). */
export function endConn(c: Conn, why: string): void {
  c.timer?.cancel();
  for (const s of c.sessions) void s.cut(why);
  if (!c.ended) {
    c.ended = true;
    try {
      c.client.end();
    } catch {
      /* already gone */
    }
  }
}

/** The authority still answers with the key this connection authenticated (same grant; a grant key of the same generation). */
export function stillSameKey(authenticated: InstalledKey, now: InstalledKey | null): boolean {
  if (!now || now.grantId !== authenticated.grantId || now.mode !== authenticated.mode) return false;
  return now.mode === "keeper" || now.generation === authenticated.generation;
}

/** Call `fn` once `now() >= at`, re-arming if the timer fires early (clock skew, long delays). */
export function armAt(now: () => number, at: number, fn: () => void): { cancel(): void } {
  let t: NodeJS.Timeout | null = null;
  const tick = () => {
    const left = at - now();
    if (left <= 0) {
      t = null;
      fn();
      return;
    }
    t = setTimeout(tick, Math.min(left, MAX_TIMER_MS));
  };
  tick();
  return {
    cancel() {
      if (t) clearTimeout(t);
      t = null;
    },
  };
}

/** One session on an accepted channel; null (nothing accepted) when the connection is ending or the key is no longer valid. */
export function startSession(g: GatewayContext, c: Conn, key: InstalledKey, argv: string[] | null, env: Record<string, string>, pty: PtyRequest | null, acceptCh: () => ServerChannel): Session | null {
  if (c.ended || g.closing) return null;
  const still = g.keys.authorize(c.machineId!, key.fingerprint, g.now());
  if (!stillSameKey(key, still)) {
    endConn(c, "key no longer authorized");
    return null;
  }
  const { runtime, store, now, log, timing } = g;
  const channel = acceptCh();
  const s = new Session(
    { runtime, store, now, log, timing },
    {
      sessionId: newId("s", (n) => randomBytes(n)),
      machineId: c.machineId!,
      grantId: key.grantId,
      fingerprint: key.fingerprint,
      argv,
      env,
      pty,
    },
    channel,
  );
  c.sessions.add(s);
  g.live.add(s);
  const expiry = key.expiresAt !== null ? armAt(now, key.expiresAt, () => void s.cut(`key expired (grant ${key.grantId})`)) : null;
  void s.done.then((out) => {
    expiry?.cancel();
    c.sessions.delete(s);
    g.live.delete(s);
    log.info({ session: out.sessionId, machine: c.machineId, state: out.state, reason: out.reason }, "session ended");
  });
  void s.start();
  return s;
}

