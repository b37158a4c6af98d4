/**
 * The agent's HTTP API, called by the coordinator (the shared HTTP layer,
 * src/http/server.ts: same refusals, ids, body limit and headers as the
 * coordinator's API).
 *
 *   GET  /v1/agent/health           -> {hostId, name, runtime, machines, slots, version, mismatched, unrecorded}
 *   GET  /v1/agent/machines         -> {machines: [MachineView], unrecorded: [id]}
 *   GET  /v1/agent/machines/{id}    -> MachineView
 *   POST /v1/agent/ops              {opId, kind, machineId, generation, args}
 *                                   -> {opId, kind, machineId, generation, status: "done", result}
 *   GET  /v1/agent/ops/{opId}       -> {opId, kind, machineId, generation, status, result|null, error|null}
 *   POST /v1/agent/identity/prepare {challenge, force, generations}
 *                                   -> {publicKey, signature, step}   (docs/host-identity.md)
 *   GET  /v1/agent/metrics          -> Prometheus text (the identity switch's steps and refusals)
 *   POST /v1/agent/machines/{id}/network-check
 *                                   -> {ok: true, digest, evidenceAt, reprobed} | {ok: false, why, diff}
 *                                      (the lend-time check, network/guard.ts; a mismatch retires the machine)
 *
 * Every route needs `Authorization: Bearer <host-call token>`, checked before
 * the body is read. The agent holds only `hashToken("host-call", token)` and
 * compares hashes in constant time; before enrollment there is no hash and
 * every call is refused. The token is never logged, echoed or put in an error.
 */
import type { IncomingMessage } from "node:http";
import { BerthError } from "../core/errors.js";
import { hashToken, sameHash } from "../core/tokens.js";
import { createHttpServer, DEFAULT_BODY_LIMIT, type HttpServer } from "../http/server.js";
import type { HttpLimits } from "../http/admission.js";
import { zodRefusal } from "../core/refusal.js";
import type { SessionRegistry } from "./contracts.js";
import type { AgentKeys } from "./keys.js";
import type { AgentLog } from "./log.js";
import type { AgentOperations } from "./operations/dispatch.js";
import type { LendCheck } from "./network/guard.js";
import { operationRequestSchema as opEnvelope } from "../protocol/operations.js";
import type { AgentStore, MachineRecord } from "./store/store.js";
import type { HostSwitch } from "./identity/host-switch.js";
import { z } from "zod";
import { Reply } from "../http/server.js";

export { DEFAULT_BODY_LIMIT };

export interface AgentIdentity {
  hostId: string | null;
  name: string;
  runtime: string;
  slots: number;
  version: string;
}

export interface AgentHttpDeps {
  /** Runs the coordinator's operations (gated while the host switches its identity). */
  ops: Pick<AgentOperations, "run">;
  /** The host identity switch; null for an agent without a coordinator. */
  identitySwitch?: HostSwitch | null;
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
  /** The lend-time network check (network/guard.ts); absent: no machine networks on this agent. */
  lendCheck?: (machineId: string) => Promise<LendCheck>;
  /** Timeouts, connection caps and the unauthenticated rate (src/http/admission.ts). */
  limits?: Partial<HttpLimits>;
  /** More routes under the same authentication (the allocation routes, alloc-http.ts). */
  extraRoutes?: (app: HttpServer, auth: { auth: (req: IncomingMessage) => void }) => void;
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

export async function startHttp(deps: AgentHttpDeps, listen_: { host: string; port: number }): Promise<AgentHttp> {
  const app = createHttpServer({
    log: deps.log,
    internalMessage: "internal: the agent failed to answer; see its log",
    bodyLimit: deps.bodyLimit ?? DEFAULT_BODY_LIMIT,
    ...(deps.limits ? { limits: deps.limits } : {}),
    onRefused: (reason) => deps.log.info({ reason }, "http connection or request refused by a limit"),
  });
  const auth = {
    auth: (req: IncomingMessage): void => {
      if (!authorized(deps, req.headers.authorization)) {
        throw new BerthError("unauthorized", "unauthorized: send the host-call token this agent received at enrollment as `Authorization: Bearer <token>`");
      }
    },
  };

  app.get("/v1/agent/health", auth, async () => {
    const ident = deps.identity();
    const machines = deps.store.machines.list();
    return {
      hostId: ident.hostId,
      name: ident.name,
      runtime: ident.runtime,
      machines: machines.length,
      slots: ident.slots,
      version: ident.version,
      mismatched: machines.filter((m) => m.state === "mismatch").length,
      unrecorded: deps.unrecorded().length,
      identity: deps.identitySwitch?.status() ?? null,
    };
  });
  app.post("/v1/agent/identity/prepare", auth, async (req) => {
    const sw = deps.identitySwitch;
    if (!sw) throw new BerthError("conflict", "conflict: this agent runs without a coordinator; it has no identity switch");
    const parsed = prepareSchema.safeParse(req.body ?? {});
    if (!parsed.success) throw zodRefusal(parsed.error, { hint: "send {challenge, force, generations}" });
    return sw.authority.prepare(parsed.data);
  });
  app.get("/v1/agent/metrics", auth, async () => new Reply(200, (await deps.identitySwitch?.metrics.metrics()) ?? "", "text/plain; version=0.0.4"));
  app.get("/v1/agent/machines", auth, async () => ({ machines: deps.store.machines.list().map((m) => view(deps, m)), unrecorded: deps.unrecorded() }));
  app.get("/v1/agent/machines/:machineId", auth, async (req) => {
    const m = deps.store.machines.get(req.params.machineId!);
    if (m === null) throw new BerthError("not_found", `not_found: machine ${req.params.machineId!} is not on this host`);
    return view(deps, m);
  });
  app.post("/v1/agent/machines/:machineId/network-check", auth, async (req) => {
    const id = req.params.machineId!;
    if (!deps.lendCheck) {
      const m = deps.store.machines.get(id);
      if (m === null) throw new BerthError("not_found", `not_found: machine ${id} is not on this host`);
      return m.state === "running" ? { ok: true, machineId: id, digest: "none", evidenceAt: null, reprobed: false } : { ok: false, machineId: id, why: `machine ${id} is ${m.state}`, diff: [] };
    }
    // The agent's own time (lock wait, kernel identities, table read, compare), for the coordinator's berth_lend_check_seconds.
    const t0 = performance.now();
    const r = await deps.lendCheck(id);
    return { ...r, tookMs: Math.round((performance.now() - t0) * 1000) / 1000 };
  });
  app.get("/v1/agent/ops/:opId", auth, async (req) => {
    const op = deps.store.operations.get(req.params.opId!);
    if (op === null) throw new BerthError("not_found", `not_found: operation ${req.params.opId!} was never started on this host`);
    return {
      opId: op.opId, kind: op.kind, machineId: op.machineId, generation: op.generation,
      status: op.status, result: op.status === "done" ? op.result : null, error: op.error,
    };
  });
  // The envelope is checked here (its refusal says what to send); the dispatcher checks the arguments.
  app.post("/v1/agent/ops", auth, async (req) => {
    const parsed = opEnvelope.safeParse(req.body ?? {});
    if (!parsed.success) throw zodRefusal(parsed.error, { hint: "send {opId, kind, machineId, generation, args}" });
    return deps.ops.run(parsed.data);
  });

  deps.extraRoutes?.(app, auth);

  const { url, port } = await app.listen(listen_.host, listen_.port);
  return { url, port, close: () => app.close() };
}

const prepareSchema = z.strictObject({
  challenge: z.string().min(1).max(256),
  force: z.boolean(),
  generations: z.record(z.string().max(128), z.number().int().min(0)),
});

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

function authorized(deps: AgentHttpDeps, header: string | undefined): boolean {
  const expected = deps.tokenHash();
  if (expected === null) return false;
  if (typeof header !== "string") return false;
  const m = /^Bearer ([^\s]{1,512})$/.exec(header);
  if (m === null || m[1] === undefined) return false;
  return sameHash(hashToken("host-call", m[1]), expected);
}
