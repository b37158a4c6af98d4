/**
 * The one HTTP layer of berth (coordinator API, agent API, and the
 * dashboard), on node:http, so every server refuses the same way. (Fastify
 * was measured against it and cost more than the 10 % allowed: see
 * docs/performance.md.)
 *
 * The order every request goes through, the first failure answering:
 *   1. the route (router.ts): unknown → 404 `not_found`; known path, other
 *      method → 405 `method_not_allowed` with `Allow`; a param that is not
 *      one valid id segment → 400 `invalid_id`;
 *   2. the route's `auth` (token, role) → 401/403, before any byte of the
 *      body is read;
 *   3. the body (not read for GET), whatever its content-type, up to
 *      `bodyLimit` → 413 `body_too_large` (declared or counted), parsed as
 *      JSON → 400 `invalid_request` (or, for a route that takes an HTML form,
 *      as `application/x-www-form-urlencoded` fields); an absent or empty body is `{}`;
 *   4. the route's zod schema → 400, the message from the one refusal
 *      formatter (refusal.ts);
 *   5. the handler; a BerthError it throws is answered with its code's
 *      status, anything else is logged and answered 500 `internal` without
 *      detail.
 *
 * Every answer carries `cache-control: no-store` (answers hold tokens); JSON
 * is `application/json; charset=utf-8`; a refusal is exactly
 * `{"error":{"code","message"}}`, also for bytes Node's parser refuses. A
 * refusal sent while the client is still sending its body closes the
 * connection after the answer (the rest is discarded up to a bound), so an
 * unread body is never parsed as the next request.
 *
 * For the dashboard: a handler may answer anything itself through `req.res`
 * (server-sent events, static files, HTML with a `set-cookie` header) and
 * return `TAKEN`; a route may take an HTML form body (`bodyType: "form"`).
 */
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import type { z } from "zod";
import { BerthError, isBerthError } from "../core/errors.js";
import type { Id } from "../core/ids.js";
import { zodRefusal } from "../core/refusal.js";
import { discardBounded, LINGER_BYTES, LINGER_MS, parseForm, parseJson, readBody } from "./body.js";
import { Router } from "./router.js";
import { AddressRate, checkIntervalMs, ConnectionCaps, defaultHttpLimits, refuseConnection, type HttpLimits, type RefusalReason } from "./admission.js";

export const DEFAULT_BODY_LIMIT = 64 * 1024;

/** Where refusals (debug) and failures (error) are logged. Messages never hold secrets. */
export interface HttpLog {
  debug?(fields: Record<string, unknown>, msg: string): void;
  error(fields: Record<string, unknown>, msg: string): void;
}

export interface HttpServerOptions {
  log: HttpLog;
  /** The `internal` answer's message: who failed and where to look. */
  internalMessage: string;
  bodyLimit?: number;
  /** Timeouts, connection caps and the unauthenticated rate (admission.ts); unset fields take the defaults. */
  limits?: Partial<HttpLimits>;
  /** Told of every connection or request refused by a cap or the rate (for a metric). */
  onRefused?: (reason: RefusalReason) => void;
}

export interface HttpRequest<B, A> {
  method: string;
  params: Record<string, Id>;
  headers: IncomingHttpHeaders;
  body: B;
  /** What the route's `auth` returned (the caller). */
  auth: A;
  raw: IncomingMessage;
  res: ServerResponse;
}

/** A handler's answer other than 200 JSON. */
export class Reply {
  constructor(
    readonly status: number,
    readonly body: unknown,
    /** Set for a text answer (`body` is then the text). */
    readonly contentType: string | null = null,
  ) {}
}

/** Returned by a handler that answered through `req.res` itself. */
export const TAKEN: unique symbol = Symbol("taken");

export interface RouteOptions<S extends z.ZodType | undefined, A> {
  /** Checks the caller from the headers before the body is read (throws 401/403). */
  auth?: (req: IncomingMessage) => A | Promise<A>;
  /** The body's schema; without one the body is not validated (nor read for GET). */
  body?: S;
  /**
   * How the body is parsed: JSON (the API; the default) or an HTML form
   * (`application/x-www-form-urlencoded`, the dashboard), whose fields become
   * an object of strings (a field sent twice keeps its last value).
   */
  bodyType?: "json" | "form";
  /**
   * A route without `auth` is limited per client address (limits.unauthenticatedRate);
   * `unlimited` exempts one that costs nothing (the health check).
   */
  unlimited?: boolean;
  /**
   * A limited route's request for which this answers true is not counted
   * against the address's rate (the dashboard: a signed-in session's pages).
   */
  exempt?: (req: IncomingMessage) => Promise<boolean>;
}

type BodyOf<S> = S extends z.ZodType ? z.output<S> : unknown;
type Handler<S, A> = (req: HttpRequest<BodyOf<S>, A>) => Promise<unknown>;

interface Route {
  auth?: (req: IncomingMessage) => unknown;
  body?: z.ZodType;
  bodyType?: "json" | "form";
  /** Limited per client address: no `auth`, not `unlimited`. */
  limited: boolean;
  exempt?: (req: IncomingMessage) => Promise<boolean>;
  handler: Handler<unknown, unknown>;
}

export interface HttpServer {
  get<S extends z.ZodType | undefined = undefined, A = undefined>(path: string, o: RouteOptions<S, A>, handler: Handler<S, A>): void;
  post<S extends z.ZodType | undefined = undefined, A = undefined>(path: string, o: RouteOptions<S, A>, handler: Handler<S, A>): void;
  /** Starts listening; returns the URL the server is reachable at. */
  listen(host: string, port: number): Promise<{ url: string; port: number }>;
  close(): Promise<void>;
  readonly server: Server;
  /** The limits in force. */
  readonly limits: HttpLimits;
  /** Connections open now. */
  connections(): number;
  /** Every route added (method and `/path/:param`), for the API contract's test. */
  routes(): Array<{ method: string; path: string }>;
}

/**
 * Its steps: limits, router, caps and rate; the request pipeline (`answer`); the caps at
 * accept (`admitConnections`); bytes Node's parser refuses (`answerClientErrors`); routes.
 */
export function createHttpServer(o: HttpServerOptions): HttpServer {
  const bodyLimit = o.bodyLimit ?? DEFAULT_BODY_LIMIT;
  const limits: HttpLimits = { ...defaultHttpLimits(), ...o.limits };
  const router = new Router<Route>();
  const caps = new ConnectionCaps(limits.maxConnections, limits.maxConnectionsPerAddress);
  const rate = new AddressRate(limits.unauthenticatedRate, limits.unauthenticatedBurst);
  const pipeline: Pipeline = { router, rate, bodyLimit, o };

  const server = createServer({ connectionsCheckingInterval: checkIntervalMs(limits) }, (req, res) => {
    answer(pipeline, req, res).catch((e: unknown) => refuse(req, res, e, o, bodyLimit));
  });
  // Deadlines for receiving a request only: Node stops timing a request once it is complete, so a
  // handler may take as long as its work (a gVisor fence) needs. Past either deadline Node answers
  // 408 and closes the connection.
  server.headersTimeout = Math.min(limits.headerTimeoutMs, limits.requestTimeoutMs);
  server.requestTimeout = limits.requestTimeoutMs;
  server.keepAliveTimeout = limits.idleTimeoutMs;
  admitConnections(server, caps, o);
  answerClientErrors(server);

  const add = (method: string) => (path: string, ro: RouteOptions<z.ZodType | undefined, unknown>, handler: Handler<unknown, unknown>) =>
    router.add(method, path, { auth: ro.auth, body: ro.body, bodyType: ro.bodyType, limited: ro.auth === undefined && ro.unlimited !== true, ...(ro.exempt ? { exempt: ro.exempt } : {}), handler });
  return {
    get: add("GET") as HttpServer["get"],
    post: add("POST") as HttpServer["post"],
    server,
    limits,
    connections: () => caps.open,
    routes: () => router.list(),
    listen: (host, port) => listenOn(server, host, port),
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

/** What answering a request needs: the routes, the unauthenticated rate, the body limit, the options. */
interface Pipeline {
  router: Router<Route>;
  rate: AddressRate;
  bodyLimit: number;
  o: HttpServerOptions;
}

/** One request through steps 1–5 of the header; a refusal is thrown (and answered by `refuse`). */
async function answer(p: Pipeline, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const { router, rate, bodyLimit, o } = p;
  const method = req.method ?? "GET";
  const url = req.url ?? "/";
  const q = url.indexOf("?");
  const m = router.match(method, q < 0 ? url : url.slice(0, q));
  if ("error" in m) {
    if (m.allow) res.setHeader("allow", m.allow.join(", "));
    throw m.error;
  }
  const { route, params } = m;
  if (route.limited && !(route.exempt && (await route.exempt(req)))) {
    const wait = rate.take(req.socket.remoteAddress ?? "", Date.now());
    if (wait > 0) {
      o.onRefused?.("rate");
      res.setHeader("retry-after", String(wait));
      throw new BerthError("rate_limited", `rate_limited: too many requests without a token from this address; try again in ${wait} s`);
    }
  }
  const auth = route.auth ? await route.auth(req) : undefined;
  let body: unknown = undefined;
  if (method !== "GET" && method !== "HEAD") {
    const buf = await readBody(req, bodyLimit);
    body = route.bodyType === "form" ? parseForm(buf) : parseJson(buf);
  }
  if (route.body) {
    const r = route.body.safeParse(body ?? {});
    if (!r.success) throw zodRefusal(r.error);
    body = r.data;
  }
  const out = await route.handler({ method, params, headers: req.headers, body, auth, raw: req, res });
  if (out === TAKEN) return;
  if (out instanceof Reply) send(res, out.status, out.body, out.contentType);
  else send(res, 200, out, null);
}

/** The caps come before Node's HTTP parser sees the socket: a refused connection costs one write. */
function admitConnections(server: Server, caps: ConnectionCaps, o: HttpServerOptions): void {
  const parse = server.listeners("connection") as Array<(socket: Socket) => void>;
  server.removeAllListeners("connection");
  server.on("connection", (socket: Socket) => {
    const refused = caps.admit(socket);
    if (refused !== null) {
      o.onRefused?.(refused);
      refuseConnection(socket, refused, caps);
      return;
    }
    for (const l of parse) l.call(server, socket);
  });
}

/** Bytes Node's parser refuses (a bad request line or header) get the same shape. */
function answerClientErrors(server: Server): void {
  server.on("clientError", (e: NodeJS.ErrnoException, socket) => {
    if (!socket.writable || e.code === "ECONNRESET") {
      socket.destroy();
      return;
    }
    // Past the header or request deadline Node reports ERR_HTTP_REQUEST_TIMEOUT: answered 408 and closed.
    const late = e.code === "ERR_HTTP_REQUEST_TIMEOUT";
    const text = late
      ? JSON.stringify({ error: { code: "request_timeout", message: "request_timeout: the request did not arrive whole within the server's deadline; the connection is closed" } })
      : JSON.stringify({ error: { code: "invalid_request", message: "invalid_request: the request is not valid HTTP/1.1" } });
    socket.end(
      `HTTP/1.1 ${late ? "408 Request Timeout" : "400 Bad Request"}\r\ncontent-type: application/json; charset=utf-8\r\ncache-control: no-store\r\n` +
        `content-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
    );
    // Whatever the client does next (it may never read or close), the connection is gone a second later.
    setTimeout(() => socket.destroy(), 1000).unref();
  });
}

async function listenOn(server: Server, host: string, port: number): Promise<{ url: string; port: number }> {
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const addr = server.address() as AddressInfo;
  const shown = addr.family === "IPv6" ? `[${addr.address}]` : addr.address;
  return { url: `http://${shown}:${addr.port}`, port: addr.port };
}

function send(res: ServerResponse, status: number, body: unknown, contentType: string | null): void {
  const text = contentType === null ? JSON.stringify(body) : String(body);
  res.writeHead(status, {
    "content-type": contentType ?? "application/json; charset=utf-8",
    "content-length": Buffer.byteLength(text),
    "cache-control": "no-store",
  });
  res.end(text);
}

function refuse(req: IncomingMessage, res: ServerResponse, e: unknown, o: HttpServerOptions, bodyLimit: number): void {
  const r = isBerthError(e) ? e : new BerthError("internal", o.internalMessage);
  if (r.code === "internal") o.log.error({ err: e instanceof Error ? e.message : String(e) }, "request failed");
  else o.log.debug?.({ code: r.code, status: r.status, message: r.message }, "request refused");
  if (res.headersSent) {
    res.destroy();
    return;
  }
  if (!req.complete) {
    // The client is still sending a body this answer will not read: discard it (so the client can
    // read the answer rather than a reset: a chunked body of 10 MB gets its 413), up to a bound in
    // bytes and in time, and end the connection after the answer.
    res.setHeader("connection", "close");
    discardBounded(req, Math.max(bodyLimit * 16, LINGER_BYTES), LINGER_MS);
  }
  send(res, r.status, { error: { code: r.code, message: r.message } }, null);
}
