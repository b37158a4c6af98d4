/**
 * `berth mcp --listen HOST:PORT`: MCP over Streamable HTTP at `/mcp` (the SDK's
 * StreamableHTTPServerTransport, one per session), one session per client.
 *
 * Who may use it: every request carries `Authorization: Bearer <token>`, where
 * the token is a berth API token (`berth token create`, role member or above).
 * A session is opened only after the coordinator accepted the token (one
 * GET /v1/pools with it); the session borrows with that token, so it sees the
 * pools and borrows of that token's organisation only. Later requests of the
 * session must carry the same token (compared as SHA-256 digests); any other
 * token gets 404 for that session id, as an unknown id does. The server keeps
 * no token of its own in this mode, and never logs one.
 *
 * When a session ends, its machines are returned: on DELETE (the client closes
 * it), when the client's event stream (the GET the SDK client keeps open)
 * closes and no request follows within `disconnectGraceMs` (the client
 * process died or went away), after `idleMs` without any request, and for all
 * sessions on SIGINT/SIGTERM/SIGHUP before the process exits.
 */
import { createHash, randomUUID, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { BerthClient } from "../client/client.js";
import { Api, ApiError } from "../client/http.js";
import { BerthError } from "../core/errors.js";
import type { SessionLimits } from "./limits.js";
import { McpSession } from "./session.js";
import { toolOptions } from "./stdio.js";
import { buildServer } from "./tools.js";

export interface HttpServeOptions {
  listen: string;
  /** The coordinator. */
  url: string;
  keeperKeyFile: string | null;
  defaultPool: string | null;
  limits: SessionLimits;
  /** A session without requests for this long ends. */
  idleMs: number;
  /** After the client's event stream closed, how long a new request may take to show the client is still there. */
  disconnectGraceMs?: number;
  log: (line: string) => void;
  /** Called once listening (tests, benches); the process's signals are handled unless `signals: false`. */
  onListening?: (url: string) => void;
  signals?: boolean;
}

interface Entry {
  id: string | null;
  tokenDigest: Buffer;
  transport: StreamableHTTPServerTransport;
  session: McpSession;
  client: BerthClient;
  streams: number;
  idle: NodeJS.Timeout | null;
  gone: NodeJS.Timeout | null;
  ended: boolean;
}

const digest = (token: string) => createHash("sha256").update(token).digest();

function bearer(req: IncomingMessage): string | null {
  const h = req.headers.authorization;
  const m = typeof h === "string" ? /^Bearer\s+(\S+)\s*$/i.exec(h) : null;
  return m ? m[1]! : null;
}

function refuse(res: ServerResponse, status: number, code: string, message: string): void {
  res.writeHead(status, { "content-type": "application/json", ...(status === 401 ? { "www-authenticate": 'Bearer realm="berth mcp"' } : {}) });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: `${code}: ${message}` }, id: null }));
}

export function parseListen(listen: string): { host: string; port: number } {
  const m = /^(\[[^\]]+\]|[^:]*):(\d+)$/.exec(listen);
  const port = m ? Number(m[2]) : NaN;
  if (!m || !Number.isInteger(port) || port < 0 || port > 65535) throw new BerthError("invalid_request", `invalid_request: --listen ${JSON.stringify(listen)} is not HOST:PORT, e.g. 127.0.0.1:7430`);
  return { host: (m[1] || "127.0.0.1").replace(/^\[|\]$/g, ""), port };
}

/**
 * The sessions this server holds, by id once initialised (`pending` before),
 * and their ends: each ends once, returning its machines.
 */
class Sessions {
  readonly #o: HttpServeOptions;
  readonly #graceMs: number;
  readonly #byId = new Map<string, Entry>();
  /** Opened for an initialize that has not produced a session id (yet). */
  readonly #pending = new Set<Entry>();

  constructor(o: HttpServeOptions) {
    this.#o = o;
    this.#graceMs = o.disconnectGraceMs ?? 5000;
  }

  /** Every session and pending initialize, for the shutdown. */
  all(): Entry[] {
    return [...this.#byId.values(), ...this.#pending];
  }

  async end(e: Entry, why: string): Promise<void> {
    if (e.ended) return;
    e.ended = true;
    if (e.idle) clearTimeout(e.idle);
    if (e.gone) clearTimeout(e.gone);
    if (e.id) this.#byId.delete(e.id);
    this.#pending.delete(e);
    const held = e.session.handles.length;
    this.#o.log(`session ${e.id ?? "(uninitialised)"} ended (${why})${held > 0 ? `: returning ${held} machine${held === 1 ? "" : "s"}` : ""}`);
    await e.session.close(why);
    await e.transport.close().catch(() => undefined);
    await e.client.close();
  }

  /** A request came: the client is there; the idle clock starts again. */
  #touch(e: Entry): void {
    if (e.gone) clearTimeout(e.gone);
    e.gone = null;
    if (e.idle) clearTimeout(e.idle);
    e.idle = setTimeout(() => void this.end(e, `idle for ${Math.round(this.#o.idleMs / 1000)} s`), this.#o.idleMs);
    e.idle.unref();
  }

  /** A new session for `token`, once the coordinator accepted it; null when refused (the answer is sent). */
  async #open(token: string, res: ServerResponse): Promise<Entry | null> {
    const o = this.#o;
    // The coordinator decides whether the token is good (and what it may see); nothing is opened otherwise.
    const probe = new Api(o.url, token, { connections: 1 });
    try {
      await probe.send("GET /v1/pools", {});
    } catch (err) {
      if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
        refuse(res, 401, "unauthorized", "the bearer token is not a berth API token the coordinator accepts");
        return null;
      }
      refuse(res, 502, "provider_unavailable", `the coordinator could not check the token: ${err instanceof Error ? err.message : String(err)}`);
      return null;
    } finally {
      await probe.close();
    }
    const client = new BerthClient({ url: o.url, token, keeperKeyFile: o.keeperKeyFile });
    const session = new McpSession({ client, defaultPool: o.defaultPool, keeperKey: o.keeperKeyFile !== null, limits: o.limits, log: o.log });
    const entry: Entry = { id: null, tokenDigest: digest(token), transport: null as unknown as StreamableHTTPServerTransport, session, client, streams: 0, idle: null, gone: null, ended: false };
    entry.transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => {
        entry.id = id;
        this.#pending.delete(entry);
        this.#byId.set(id, entry);
        o.log(`session ${id} opened`);
      },
      onsessionclosed: () => void this.end(entry, "the client closed the session"),
    });
    entry.transport.onclose = () => void this.end(entry, "transport closed");
    await buildServer(session, toolOptions(o.limits)).connect(entry.transport);
    this.#pending.add(entry);
    this.#touch(entry);
    return entry;
  }

  /** The session a request belongs to (its id and token), or a new one for an initialize; null when refused. */
  async #entryFor(req: IncomingMessage, res: ServerResponse): Promise<Entry | null> {
    const refused = (status: number, code: string, message: string) => {
      refuse(res, status, code, message);
      return null;
    };
    const path = (req.url ?? "/").split("?")[0];
    if (path !== "/mcp") return refused(404, "not_found", "the MCP endpoint is /mcp");
    const token = bearer(req);
    if (!token) return refused(401, "unauthorized", "send Authorization: Bearer <berth API token>");
    const sid = req.headers["mcp-session-id"];
    if (typeof sid === "string") {
      const e = this.#byId.get(sid);
      // Another token presenting this id learns nothing: the same answer as an unknown id.
      if (!e || !timingSafeEqual(e.tokenDigest, digest(token))) return refused(404, "not_found", "no such session; initialize a new one");
      return e;
    }
    if (req.method !== "POST") return refused(400, "invalid_request", "no mcp-session-id header; initialize a session with POST first");
    return this.#open(token, res);
  }

  /** One HTTP request: to its session's transport. */
  async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const e = await this.#entryFor(req, res);
    if (!e) return;
    this.#touch(e);
    if (req.method === "GET") {
      // The client's event stream: while one is open the client is there; its close starts the grace.
      e.streams++;
      res.once("close", () => {
        e.streams--;
        if (e.streams > 0 || e.ended) return;
        if (e.gone) clearTimeout(e.gone);
        e.gone = setTimeout(() => void this.end(e, "the client disconnected"), this.#graceMs);
        e.gone.unref();
      });
    }
    await e.transport.handleRequest(req, res);
    // An initialize that did not produce a session leaves nothing behind.
    if (e.id === null && !e.ended) await this.end(e, "not initialised");
  }
}

const SIGNALS: Record<string, number> = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 };

/** Serves until a signal (or `stop()`); resolves with the exit status after every session ended. */
export function serveHttp(o: HttpServeOptions): Promise<number> & { stop?: () => void } {
  const { host, port } = parseListen(o.listen);
  const sessions = new Sessions(o);
  let stop: () => void = () => undefined;
  const done = new Promise<number>((resolve, reject) => {
    const server = createServer((req, res) => {
      sessions.handle(req, res).catch((err: unknown) => {
        o.log(`request failed: ${(err as Error).message}`);
        if (!res.headersSent) refuse(res, 500, "internal", "the request failed");
        else res.end();
      });
    });
    stop = shutdownOnSignals(server, sessions, o.signals !== false, resolve);
    server.once("error", reject);
    server.listen(port, host, () => announce(server, host, port, o));
  });
  return Object.assign(done, { stop: () => stop() });
}

/**
 * The way out, once: stop listening, end every session (returning its
 * machines), then resolve with the exit status. On SIGINT/SIGTERM/SIGHUP when
 * `signals`; the returned function stops with status 0.
 */
function shutdownOnSignals(server: Server, sessions: Sessions, signals: boolean, resolve: (status: number) => void): () => void {
  let stopping = false;
  const shutdown = (status: number, why: string) => {
    if (stopping) return;
    stopping = true;
    for (const s of Object.keys(SIGNALS)) process.off(s, onSignal);
    server.close();
    void Promise.all(sessions.all().map((e) => sessions.end(e, why))).finally(() => {
      server.closeAllConnections();
      resolve(status);
    });
  };
  const onSignal = (sig: NodeJS.Signals) => shutdown(SIGNALS[sig] ?? 1, sig);
  if (signals) for (const s of Object.keys(SIGNALS)) process.on(s, onSignal);
  return () => shutdown(0, "server stopped");
}

/** The listening line (and a warning off loopback), then `onListening`. */
function announce(server: Server, host: string, port: number, o: HttpServeOptions): void {
  const a = server.address();
  const p = typeof a === "object" && a ? a.port : port;
  const url = `http://${host.includes(":") ? `[${host}]` : host}:${p}/mcp`;
  o.log(`listening on ${url} (clients send Authorization: Bearer <berth API token>)`);
  if (!/^(127\.|::1$|localhost$)/.test(host)) o.log("warning: not a loopback address; bearer tokens travel in clear text unless TLS is put in front");
  o.onListening?.(url);
}
