/**
 * What a client must do to be served at all, before any token is looked at
 * (docs/operations.md "Timeouts and limits"): the HTTP servers of the
 * coordinator and the agent admit a connection only under two caps (total,
 * and per client address), give a request a deadline for its headers and
 * one for the whole request, close an idle kept-alive connection, and limit
 * the rate of requests per client address on routes that take no token.
 *
 * Everything here is per connection or per unauthenticated request: a
 * request that carries a token costs nothing more than before (no
 * allocation, no lookup).
 */
import { readFileSync } from "node:fs";
import type { Socket } from "node:net";

export interface HttpLimits {
  /** A request's headers must arrive within this (from the connection, or from the end of the previous request). */
  headerTimeoutMs: number;
  /** A whole request, headers and body, must arrive within this. */
  requestTimeoutMs: number;
  /** A kept-alive connection with no request in flight is closed after this. */
  idleTimeoutMs: number;
  /** Open connections at once; 0: no cap. */
  maxConnections: number;
  /** Open connections at once from one client address; 0: no cap. */
  maxConnectionsPerAddress: number;
  /** Requests per second per client address on routes that take no token; 0: no limit. */
  unauthenticatedRate: number;
  /** How many such requests an address may make at once before the rate applies. */
  unauthenticatedBurst: number;
}

/**
 * The soft limit on open files of this process (Linux: /proc/self/limits);
 * null where it cannot be read.
 */
export function openFilesLimit(): number | null {
  try {
    const line = readFileSync("/proc/self/limits", "utf8")
      .split("\n")
      .find((l) => l.startsWith("Max open files"));
    const soft = line?.slice("Max open files".length).trim().split(/\s+/)[0];
    if (soft === undefined || soft === "unlimited") return null;
    const n = Number(soft);
    return Number.isSafeInteger(n) && n > 0 ? n : null;
  } catch {
    return null;
  }
}

/** Files kept free for the store, outgoing calls and logs when the connection cap follows the open-files limit. */
const RESERVED_FILES = 256;

/** The default connection cap: 4096, or the open-files limit less 256 when that is lower (at least 64). */
export function defaultMaxConnections(limit: number | null = openFilesLimit()): number {
  if (limit === null) return 4096;
  return Math.max(64, Math.min(4096, limit - RESERVED_FILES));
}

export function defaultHttpLimits(): HttpLimits {
  const max = defaultMaxConnections();
  return {
    headerTimeoutMs: 10_000,
    // With the 1 s check (checkIntervalMs), an incomplete request is closed within 30 s.
    requestTimeoutMs: 29_000,
    idleTimeoutMs: 30_000,
    maxConnections: max,
    maxConnectionsPerAddress: Math.min(256, max),
    unauthenticatedRate: 20,
    unauthenticatedBurst: 40,
  };
}

/** How often Node checks the header and request deadlines: every second, more often for short deadlines (tests). */
export function checkIntervalMs(l: HttpLimits): number {
  return Math.max(50, Math.min(1000, Math.floor(Math.min(l.headerTimeoutMs, l.requestTimeoutMs) / 4)));
}

export type RefusalReason = "connections" | "connections_per_address" | "rate";

/** Counts open connections, in total and per client address; refuses over either cap. */
export class ConnectionCaps {
  #total = 0;
  readonly #byAddress = new Map<string, number>();

  constructor(
    readonly max: number,
    readonly perAddress: number,
  ) {}

  get open(): number {
    return this.#total;
  }

  /** Admits the socket (and counts it until it closes), or says which cap refuses it. */
  admit(socket: Socket): RefusalReason | null {
    const address = socket.remoteAddress ?? "";
    const mine = this.#byAddress.get(address) ?? 0;
    if (this.max > 0 && this.#total >= this.max) return "connections";
    if (this.perAddress > 0 && mine >= this.perAddress) return "connections_per_address";
    this.#total++;
    this.#byAddress.set(address, mine + 1);
    socket.once("close", () => {
      this.#total--;
      const n = (this.#byAddress.get(address) ?? 1) - 1;
      if (n <= 0) this.#byAddress.delete(address);
      else this.#byAddress.set(address, n);
    });
    return null;
  }
}

/**
 * A token bucket per client address. Buckets refilled to the brim are
 * forgotten when the table grows past `maxAddresses`, so the table stays
 * bounded whatever the number of addresses.
 */
export class AddressRate {
  readonly #buckets = new Map<string, { tokens: number; at: number }>();

  constructor(
    readonly ratePerSecond: number,
    readonly burst: number,
    readonly maxAddresses = 10_000,
  ) {}

  /** 0 when the request may go ahead, else the seconds to wait. */
  take(address: string, now: number): number {
    if (this.ratePerSecond <= 0) return 0;
    let b = this.#buckets.get(address);
    if (b === undefined) {
      if (this.#buckets.size >= this.maxAddresses) this.#sweep(now);
      b = { tokens: this.burst, at: now };
      this.#buckets.set(address, b);
    } else {
      b.tokens = Math.min(this.burst, b.tokens + ((now - b.at) / 1000) * this.ratePerSecond);
      b.at = now;
    }
    if (b.tokens >= 1) {
      b.tokens -= 1;
      return 0;
    }
    return Math.max(1, Math.ceil((1 - b.tokens) / this.ratePerSecond));
  }

  #sweep(now: number): void {
    for (const [a, b] of this.#buckets) {
      if (b.tokens + ((now - b.at) / 1000) * this.ratePerSecond >= this.burst) this.#buckets.delete(a);
    }
    // Every address still owes: forget them all rather than grow (the limit is a cost, not an account).
    if (this.#buckets.size >= this.maxAddresses) this.#buckets.clear();
  }
}

/**
 * Answers a connection over a cap with one plain HTTP refusal and closes it:
 * a client sees `503 too_many_connections` instead of a reset. The socket is
 * destroyed a second later whatever the client does.
 */
export function refuseConnection(socket: Socket, reason: RefusalReason, caps: ConnectionCaps): void {
  const message =
    reason === "connections"
      ? `too_many_connections: the server holds its limit of ${caps.max} open connections; try again shortly`
      : `too_many_connections: this address holds the limit of ${caps.perAddress} open connections per client address; close some and try again`;
  const text = JSON.stringify({ error: { code: "too_many_connections", message } });
  socket.on("error", () => undefined);
  socket.setTimeout(1000, () => socket.destroy());
  socket.end(
    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json; charset=utf-8\r\ncache-control: no-store\r\nretry-after: 1\r\n" +
      `content-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
  );
  socket.resume();
}
