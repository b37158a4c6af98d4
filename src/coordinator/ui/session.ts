/**
 * Dashboard sessions: sign in once with an API token (posted in a form body,
 * never a URL), then an httpOnly, SameSite=Strict cookie holding a random
 * session id that lives `sessionMs` at most (and never past its token's
 * expiry). The store keeps only the id's domain-separated hash
 * (src/store/ui-sessions.ts).
 *
 * Every request re-reads the session with its token and derives the
 * principal through `principalOf`, the same check as the API's bearer
 * tokens: a revoked or expired token ends its sessions from the next request
 * on; the role and organisation are the token's, exactly as in the API.
 *
 * CSRF: each session has one CSRF token, derived from the session id under
 * its own domain (`hashToken("csrf", id)`), put in every action form and
 * checked on every POST in constant time. It is never stored, and knowing it
 * reveals neither the session id nor the stored hash.
 */
import type { IncomingMessage } from "node:http";
import { BerthError } from "../../core/errors.js";
import { hashToken, newToken, sameHash } from "../../core/tokens.js";
import { authenticate, principalOf, requireRole, type Principal } from "../auth.js";
import { deleteSession, insertSession, readSession } from "../../store/ui-sessions.js";
import type { Store } from "../../store/store.js";

export const COOKIE = "berth_session";
export const DEFAULT_SESSION_MS = 60 * 60_000;

export interface Session {
  principal: Principal;
  /** The stored hash (the key to end it); never the cookie's value. */
  hash: string;
  csrf: string;
  expiresAt: number;
  /** The token's label (shown beside its id). */
  label: string | null;
}

export interface SessionDeps {
  store: Store;
  now: () => number;
  randomBytes: (n: number) => Uint8Array;
  sessionMs: number;
}

/** Signs in with an API token: the token is checked as the API checks it; agent tokens open no session. */
export async function openSession(d: SessionDeps, rawToken: string): Promise<{ cookie: string; expiresAt: number }> {
  const now = d.now();
  const p = await authenticate(d.store, `Bearer ${rawToken}`, now);
  requireRole(p, "member");
  const id = newToken("session", d.randomBytes);
  const expiresAt = Math.min(now + d.sessionMs, p.expiresAt ?? Infinity);
  await insertSession(d.store, { hash: hashToken("session", id), tokenId: p.tokenId, now, expiresAt });
  return { cookie: id, expiresAt };
}

export function cookieValue(req: IncomingMessage, name = COOKIE): string | null {
  const header = req.headers.cookie;
  if (!header) return null;
  for (const part of header.split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim() || null;
  }
  return null;
}

/** The request's session, or `unauthorized` (no cookie, unknown, expired, or its token no longer valid). */
export async function sessionOf(d: SessionDeps, req: IncomingMessage): Promise<Session> {
  const id = cookieValue(req);
  if (!id) throw new BerthError("unauthorized", "unauthorized: sign in to the dashboard with an API token");
  const hash = hashToken("session", id);
  const row = await readSession(d.store, hash);
  const now = d.now();
  if (!row || now >= row.expiresAt) throw new BerthError("unauthorized", "unauthorized: the dashboard session has ended; sign in again");
  const principal = principalOf(row.token, now);
  return { principal, hash, csrf: hashToken("csrf", id), expiresAt: row.expiresAt, label: row.label };
}

/** Whether a stored session is still valid now (the live stream re-checks its session with it). */
export async function sessionStillValid(d: SessionDeps, hash: string): Promise<boolean> {
  const row = await readSession(d.store, hash);
  if (!row || d.now() >= row.expiresAt) return false;
  try {
    principalOf(row.token, d.now());
    return true;
  } catch {
    return false;
  }
}

export async function closeSession(d: SessionDeps, hash: string): Promise<void> {
  await deleteSession(d.store, hash);
}

/** Refuses a form whose CSRF field is missing or not this session's. */
export function checkCsrf(s: Session, given: unknown): void {
  if (typeof given !== "string" || !sameHash(given, s.csrf)) {
    throw new BerthError("forbidden", "forbidden: the form's CSRF token is missing or does not match this session; reload the page and try again");
  }
}

/**
 * The browser's Origin, when it sent one, must be this server: a second
 * line behind SameSite=Strict and the CSRF token.
 */
export function checkOrigin(req: IncomingMessage): void {
  const origin = req.headers.origin;
  if (origin === undefined) return;
  let host: string;
  try {
    host = new URL(origin).host;
  } catch {
    throw new BerthError("forbidden", "forbidden: the request's Origin is not valid");
  }
  if (host !== req.headers.host) throw new BerthError("forbidden", "forbidden: the form was posted from another site");
}

export function setCookieHeader(value: string, maxAgeMs: number, secure: boolean): string {
  const maxAge = Math.max(0, Math.floor(maxAgeMs / 1000));
  return `${COOKIE}=${value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=${maxAge}${secure ? "; Secure" : ""}`;
}

/** Whether the browser reached us over TLS (directly, or through a proxy that says so). */
export function overTls(req: IncomingMessage): boolean {
  return Boolean((req.socket as { encrypted?: boolean }).encrypted) || req.headers["x-forwarded-proto"] === "https";
}
