/**
 * The flags of `berth serve` and `berth agent` that bound what a client can
 * hold before it proves anything (docs/operations.md "Timeouts and limits").
 */
import type { Command } from "commander";
import type { HttpLimits } from "../http/admission.js";
import { durationArg, intArg } from "./common.js";

export interface HttpLimitFlags {
  headerTimeout?: number;
  requestTimeout?: number;
  idleTimeout?: number;
  maxConnections?: number;
  maxConnectionsPerAddress?: number;
  unauthenticatedRate?: number;
}

export function httpLimitOptions(c: Command, what: string): Command {
  return c
    .option("--header-timeout <duration>", `${what}: a request's headers must arrive within this, else 408 and the connection is closed (default 10s)`, durationArg("--header-timeout"))
    .option("--request-timeout <duration>", `${what}: a whole request, headers and body, must arrive within this (default 29s: closed within 30s)`, durationArg("--request-timeout"))
    .option("--idle-timeout <duration>", `${what}: a kept-alive connection with no request is closed after this (default 30s)`, durationArg("--idle-timeout"))
    .option("--max-connections <n>", `${what}: open connections at once, 0 for no cap (default 4096, or the open-files limit less 256)`, intArg("--max-connections", 0, 1_000_000))
    .option("--max-connections-per-address <n>", `${what}: open connections at once from one client address, 0 for no cap (default 256)`, intArg("--max-connections-per-address", 0, 1_000_000))
    .option("--unauthenticated-rate <n>", `${what}: requests per second per client address on routes that take no token, 0 for no limit (default 20, bursts of 40)`, intArg("--unauthenticated-rate", 0, 1_000_000));
}

/** The flags given, as limits (the rest take the defaults); refuses a request timeout shorter than the header timeout. */
export function httpLimitsFrom(o: HttpLimitFlags): Partial<HttpLimits> {
  const l: Partial<HttpLimits> = {};
  if (o.headerTimeout !== undefined) l.headerTimeoutMs = o.headerTimeout;
  if (o.requestTimeout !== undefined) l.requestTimeoutMs = o.requestTimeout;
  if (o.idleTimeout !== undefined) l.idleTimeoutMs = o.idleTimeout;
  if (o.maxConnections !== undefined) l.maxConnections = o.maxConnections;
  if (o.maxConnectionsPerAddress !== undefined) l.maxConnectionsPerAddress = o.maxConnectionsPerAddress;
  if (o.unauthenticatedRate !== undefined) {
    l.unauthenticatedRate = o.unauthenticatedRate;
    l.unauthenticatedBurst = o.unauthenticatedRate * 2;
  }
  for (const [flag, v] of [["--header-timeout", l.headerTimeoutMs], ["--request-timeout", l.requestTimeoutMs], ["--idle-timeout", l.idleTimeoutMs]] as const) {
    if (v !== undefined && v < 100) throw new Error(`${flag}: at least 100ms`);
  }
  return l;
}
