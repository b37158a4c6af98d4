/**
 * The agent's HTTP API, called by the coordinator (node:http, JSON).
 *
 *   GET  /v1/agent/health           -> {hostId, name, runtime, machines, slots, version, mismatched, unrecorded}
 *   GET  /v1/agent/machines         -> {machines: [MachineView], unrecorded: [id]}
 *   GET  /v1/agent/machines/{id}    -> MachineView
 *   POST /v1/agent/ops              {opId, kind, machineId, generation, args}
 *                                   -> {opId, kind, machineId, generation, status: "done", result}
 *   GET  /v1/agent/ops/{opId}       -> {opId, kind, machineId, generation, status, result|null, error|null}
 *
 * Every route needs `Authorization: Bearer <host-call token>`. The agent holds
 * only `hashToken("host-call", token)` and compares hashes in constant time;
 * before enrollment there is no hash and every call is refused. The token is
 * never logged, echoed or put in an error.
 *
 * Errors are `{"error": {"code", "message"}}` with the code's status. Bodies
 * above `bodyLimit` bytes are refused with 413 without being read further.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { BerthError, isBerthError } from "../core/errors.js";
import { parseId } from "../core/ids.js";
import { hashToken, sameHash } from "../core/tokens.js";
import type { SessionRegistry } from "./contracts.js";
import type { AgentKeys } from "./keys.js";
import { errorMessage, type AgentLog } from "./log.js";
import type { AgentOps } from "./ops.js";
import { operationRequestSchema as opEnvelope } from "../protocol/operations.js";
import type { AgentStore, MachineRecord } from "./store.js";

export const DEFAULT_BODY_LIMIT = 64 * 1024;

export interface AgentIdentity {
  hostId: string | null;
  name: string;
  runtime: string;
  slots: number;
  version: string;
}

export interface AgentHttpDeps {
  /** Runs the coordinator's operations. */
  ops: AgentOps;
  /** Machine records, operation records. */
  store: AgentStore;
  /** Installed keys per machine (fingerprints only leave the agent). */
  keys: AgentKeys;
  /** Live sessions per machine; null while no gateway runs. */
  sessions: SessionRegistry | null;
  /** Who this agent is, as health reports it. */
  identity: () => AgentIdentity;
  /** The stored hash of the host-call token; null before enrollment (every call refused). */
  tokenHash: () => string | null;
  /** Runtime machines recovery found without a record (reported, never touched). */
  unrecorded: () => string[];
  log: AgentLog;
  bodyLimit?: number;
}

export interface MachineView {
  machineId: string;
  state: string;
  generation: number;
  incarnation: string | null;
  /** Why recovery refused to adopt it, when state is "mismatch". */
  mismatch: string | null;
  keys: Array<{ fingerprint: string; mode: string; grantId: string; generation: number; expiresAt: number | null }>;
  sessions: number;
}

export interface AgentHttp {
  url: string;
  port: number;
  close(): Promise<void>;
}


export async function startHttp(deps: AgentHttpDeps, listen: { host: string; port: number }): Promise<AgentHttp> {
  const server = createServer((req, res) => {
    handle(deps, req, res).catch((e: unknown) => {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      if (!isBerthError(e)) deps.log.error({ error: errorMessage(e) }, "agent API handler failed");
      const err = asBerthError(e);
      if (err.code === "body_too_large") drainBounded(req);
      sendError(res, err, err.code === "body_too_large");
    });
  });
  server.headersTimeout = 30_000;
  server.requestTimeout = 0; // operations (a gVisor fence) may take a while; body reads are bounded by size
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(listen.port, listen.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const host = listen.host.includes(":") ? `[${listen.host}]` : listen.host;
  return { url: `http://${host}:${port}`, port, close: () => closeServer(server) };
}

function closeServer(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

async function handle(deps: AgentHttpDeps, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const url = new URL(req.url ?? "/", "http://agent");
  const segments = url.pathname.split("/").filter((s) => s.length > 0).map(safeDecode);
  if (segments[0] !== "v1" || segments[1] !== "agent") {
    return sendError(res, new BerthError("not_found", `not_found: no route ${req.method ?? ""} ${url.pathname.slice(0, 100)}`), true);
  }
  // Authentication before anything is read or looked up.
  if (!authorized(deps, req)) {
    return sendError(
      res,
      new BerthError("unauthorized", "unauthorized: send the host-call token this agent received at enrollment as `Authorization: Bearer <token>`"),
      true,
    );
  }
  const route = segments.slice(2);
  const method = req.method ?? "GET";
  const [resource, id, ...rest] = route;
  if (rest.length > 0) return sendError(res, new BerthError("not_found", `not_found: no route ${method} ${url.pathname.slice(0, 100)}`), true);

  if (resource === "health" && id === undefined) {
    if (method !== "GET") return methodNotAllowed(res, "GET");
    const ident = deps.identity();
    const machines = deps.store.listMachines();
    return send(res, 200, {
      hostId: ident.hostId,
      name: ident.name,
      runtime: ident.runtime,
      machines: machines.length,
      slots: ident.slots,
      version: ident.version,
      mismatched: machines.filter((m) => m.state === "mismatch").length,
      unrecorded: deps.unrecorded().length,
    });
  }
  if (resource === "machines") {
    if (method !== "GET") return methodNotAllowed(res, "GET");
    if (id === undefined) {
      return send(res, 200, { machines: deps.store.listMachines().map((m) => view(deps, m)), unrecorded: deps.unrecorded() });
    }
    const machineId = parseId(id, "machine id");
    const m = deps.store.getMachine(machineId);
    if (m === null) throw new BerthError("not_found", `not_found: machine ${machineId} is not on this host`);
    return send(res, 200, view(deps, m));
  }
  if (resource === "ops") {
    if (id !== undefined) {
      if (method !== "GET") return methodNotAllowed(res, "GET");
      const opId = parseId(id, "operation id");
      const op = deps.store.getOp(opId);
      if (op === null) throw new BerthError("not_found", `not_found: operation ${opId} was never started on this host`);
      return send(res, 200, {
        opId: op.opId, kind: op.kind, machineId: op.machineId, generation: op.generation,
        status: op.status, result: op.status === "done" ? op.result : null, error: op.error,
      });
    }
    if (method !== "POST") return methodNotAllowed(res, "POST");
    const body = await readJson(req, deps.bodyLimit ?? DEFAULT_BODY_LIMIT);
    const parsed = opEnvelope.safeParse(body);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      const where = issue && issue.path.length > 0 ? issue.path.join(".") : "body";
      throw new BerthError(
        "invalid_request",
        `invalid_request: ${where}: ${issue?.message ?? "invalid"}; send {opId, kind, machineId, generation, args}`,
      );
    }
    const response = await deps.ops.run(parsed.data);
    return send(res, 200, response);
  }
  return sendError(res, new BerthError("not_found", `not_found: no route ${method} ${url.pathname.slice(0, 100)}`));
}

function view(deps: AgentHttpDeps, m: MachineRecord): MachineView {
  return {
    machineId: m.id,
    state: m.state,
    generation: m.generation,
    incarnation: m.incarnation,
    mismatch: m.mismatch,
    keys: deps.keys.list(m.id).map((k) => ({
      fingerprint: k.fingerprint, mode: k.mode, grantId: k.grantId, generation: k.generation, expiresAt: k.expiresAt,
    })),
    sessions: deps.sessions?.count(m.id) ?? 0,
  };
}

function authorized(deps: AgentHttpDeps, req: IncomingMessage): boolean {
  const expected = deps.tokenHash();
  if (expected === null) return false;
  const header = req.headers.authorization;
  if (typeof header !== "string") return false;
  const m = /^Bearer ([^\s]{1,512})$/.exec(header);
  if (m === null || m[1] === undefined) return false;
  return sameHash(hashToken("host-call", m[1]), expected);
}

function readJson(req: IncomingMessage, limit: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers["content-length"]);
    if (Number.isFinite(declared) && declared > limit) {
      reject(tooLarge(limit));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    req.on("data", (chunk: Buffer) => {
      if (done) return;
      size += chunk.length;
      if (size > limit) {
        done = true;
        req.pause();
        reject(tooLarge(limit));
        return;
      }
      chunks.push(chunk);
    });
    req.on("end", () => {
      if (done) return;
      done = true;
      const text = Buffer.concat(chunks).toString("utf8");
      if (text.trim() === "") {
        reject(new BerthError("invalid_request", "invalid_request: the request has no JSON body"));
        return;
      }
      try {
        resolve(JSON.parse(text) as unknown);
      } catch {
        reject(new BerthError("invalid_request", "invalid_request: the body is not valid JSON"));
      }
    });
    req.on("error", (e) => {
      if (done) return;
      done = true;
      reject(e);
    });
  });
}

/** Reads and discards what the client still sends after a 413 (so it can read the answer), up to a bound. */
function drainBounded(req: IncomingMessage): void {
  let drained = 0;
  req.removeAllListeners("data");
  req.on("data", (chunk: Buffer) => {
    drained += chunk.length;
    if (drained > 16 * 1024 * 1024) req.socket.destroy();
  });
  req.resume();
}

function tooLarge(limit: number): BerthError {
  return new BerthError("body_too_large", `body_too_large: request bodies are limited to ${limit} bytes`);
}

function methodNotAllowed(res: ServerResponse, allow: string): void {
  res.setHeader("allow", allow);
  sendError(res, new BerthError("method_not_allowed", `method_not_allowed: use ${allow} on this route`));
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json; charset=utf-8",
    "content-length": Buffer.byteLength(text),
    "cache-control": "no-store",
  });
  res.end(text);
}

/** `close`: the request body was not read; the connection cannot be reused. */
function sendError(res: ServerResponse, e: BerthError, close = false): void {
  if (close) res.setHeader("connection", "close");
  send(res, e.status, { error: { code: e.code, message: e.message } });
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/** Any thrown value as the API answers it: refusals as they are, the rest as `internal`. */
export function asBerthError(e: unknown): BerthError {
  if (isBerthError(e)) return e;
  return new BerthError("internal", "internal: the agent failed to answer; see its log");
}
