/**
 * The coordinator's HTTP routes: each is authenticated (and its role checked)
 * before its body is read, validated by its zod schema, and calls one action.
 * Refusals, ids, body limits and headers are the shared HTTP layer's
 * (src/http/server.ts).
 */
import type { IncomingMessage } from "node:http";
import type { Ctx } from "../context.js";
import { Reply, type HttpServer } from "../../http/server.js";
import { authenticate, authenticateCached, requireRole, TokenCache, type Principal, type Role, type UncheckedPrincipal } from "../auth.js";
import { drainSchema, ensureSchema, registerSchema, borrowSchema, chosenKeeper, chosenPortable, returnSchema, heartbeatSchema, ackSchema, reportSchema, enrollSchema } from "./schemas.js";
import { ensurePool, getPool, listPools, resumePool } from "../actions/pools.js";
import { registerMachine } from "../actions/register.js";
import { borrowKeeper, getBorrow, heartbeatKeeper, returnKeeper } from "../actions/borrow.js";
import { reportTelemetry } from "../actions/report.js";
import { enrollHost, listHosts } from "../actions/hosts.js";
import { confirmDestroyed } from "../actions/destroyed.js";
import { drainMachine, drainPool } from "../actions/drain.js";
import { endBorrowAsOperator } from "../actions/end-borrow.js";
import { presentPool, presentBorrow, presentHost, presentMachineNetwork } from "./present.js";
import { parsePolicy } from "../../core/network-policy.js";
import { BerthError } from "../../core/errors.js";
import { hashToken, sameHash } from "../../core/tokens.js";
import type { PortableApi } from "../actions/portable-api.js";
import { registerAllocationRoutes } from "./allocation-routes.js";
import type { AllocationAgent } from "../allocation-agent.js";
import { registerHostRoutes } from "./host-routes.js";
import { registerImageRoutes } from "./image-routes.js";

export interface RouteDeps {
  ctx: Ctx;
  secret: Uint8Array;
  metricsText: () => Promise<string>;
  /** The hash of the token `/metrics` needs (`berth serve --metrics-token-file`); null: open. */
  metricsTokenHash: string | null;
  portable: PortableApi | null;
  version: string;
  /** Calls to agents about allocations (the volume routes). */
  allocationAgent?: AllocationAgent;
}

/** The coordinator's routes, by group; each group authenticates as `routeAuth` says. */
export function addRoutes(app: HttpServer, d: RouteDeps): void {
  const { ctx } = d;
  const a = routeAuth(ctx);
  addServiceRoutes(app, d);
  addPoolRoutes(app, ctx, a);
  addBorrowRoutes(app, d, a);
  app.get("/v1/hosts", a.auth(), async (req) => ({ hosts: (await listHosts(ctx, req.auth)).map(presentHost) }));
  app.post("/v1/hosts/enroll", { ...a.auth("agent"), body: enrollSchema }, async (req) => enrollHost(ctx, req.auth, req.body, d.secret));
  registerHostRoutes(app, { ctx, secret: d.secret, auth: a.auth });
  if (d.allocationAgent) registerImageRoutes(app, { ctx, auth: a.auth, agent: d.allocationAgent });
  registerAllocationRoutes(app, { ctx: { ...ctx, onRefusal: (reason) => ctx.metrics.allocationRefusals.inc({ reason }) }, auth: a.auth, ...(d.allocationAgent ? { agent: d.allocationAgent } : {}) });
}

/** How a route authenticates its caller, in the forms the HTTP layer takes. */
interface RouteAuth {
  /**
   * Authentication, then the role: both before the body is read. Every route
   * needs a member at least, except the enrollment, the one route the enroll
   * token (the `agent` role) may call (docs/api.md, roles).
   */
  auth(role?: Role): { auth: (req: IncomingMessage) => Promise<Principal> };
  /**
   * The keeper borrow, heartbeat and return, and the portable borrow: the
   * token from this process's cache when it was read before, since their
   * actions check it again in their own transaction (a portable grant's
   * authorization is read committed again by its ack). Any other use of the
   * principal (the portable ack, heartbeat and return) reads it committed
   * first (`checked`).
   */
  cachedAuth(role?: Role): { auth: (req: IncomingMessage) => Promise<UncheckedPrincipal> };
  checked(req: { auth: UncheckedPrincipal; headers: IncomingMessage["headers"] }): Promise<Principal>;
  /** Runs an action that re-checks a cached token; a token it finds revoked leaves the cache. */
  keeper<T>(u: UncheckedPrincipal, f: (p: Principal) => Promise<T>): Promise<T>;
}

function routeAuth(ctx: Ctx): RouteAuth {
  const tokens = new TokenCache();
  return {
    auth: (role = "member") => ({
      auth: async (req) => {
        const p = await authenticate(ctx.store, req.headers.authorization, ctx.now(), tokens);
        requireRole(p, role);
        return p;
      },
    }),
    cachedAuth: (role = "member") => ({
      auth: async (req) => {
        const u = await authenticateCached(ctx.store, tokens, req.headers.authorization, ctx.now());
        requireRole(u.principal, role);
        return u;
      },
    }),
    checked: async (req) => (req.auth.cachedHash === null ? req.auth.principal : authenticate(ctx.store, req.headers.authorization, ctx.now(), tokens)),
    keeper: async (u, f) => {
      try {
        return await f(u.principal);
      } catch (e) {
        if (u.cachedHash !== null && e instanceof BerthError && e.code === "unauthorized") tokens.delete(u.cachedHash);
        throw e;
      }
    },
  };
}

/** Health (unlimited) and the metrics scrape (its own token, when one is set). */
function addServiceRoutes(app: HttpServer, d: RouteDeps): void {
  const { ctx } = d;
  app.get("/v1/health", { unlimited: true }, async () => ({ status: "ok", version: d.version, store: ctx.store.dialect, portable: ctx.config.portable }));
  const metricsAuth = d.metricsTokenHash === null ? {} : { auth: (req: IncomingMessage) => checkMetricsToken(d.metricsTokenHash!, req.headers.authorization) };
  app.get("/metrics", metricsAuth, async () => new Reply(200, await d.metricsText(), "text/plain; version=0.0.4"));
}

/** Pools and their machines: reads for members, the rest for operators. */
function addPoolRoutes(app: HttpServer, ctx: Ctx, a: RouteAuth): void {
  const { auth } = a;
  app.get("/v1/pools", auth(), async (req) => ({
    pools: (await listPools(ctx, req.auth)).map((x) => ({ ...presentPool(x.pool), ready: x.ready, machines: x.total })),
  }));
  app.get("/v1/pools/:pool", auth(), async (req) => {
    const x = await getPool(ctx, req.auth, req.params.pool!);
    return { ...presentPool(x.pool), counts: x.counts, states: x.states, networks: x.machines.map(presentMachineNetwork), provisionError: x.provisionError, provisionBreaker: x.breaker, placementBreakers: x.placementBreakers, shortfall: x.shortfall };
  });
  app.post("/v1/pools/:pool/ensure", { ...auth("operator"), body: ensureSchema }, async (req) => {
    const res = await ensurePool(ctx, req.auth, { name: req.params.pool!, ...req.body, network: parsePolicy(req.body.network) });
    return { ...presentPool(res.pool), counts: res.counts, claims: res.claims, note: res.note };
  });
  app.post("/v1/pools/:pool/resume", auth("operator"), async (req) => resumePool(ctx, req.auth, req.params.pool!));
  app.post("/v1/pools/:pool/drain", { ...auth("operator"), body: drainSchema }, async (req) => drainPool(ctx, req.auth, req.params.pool!, req.body.force));
  app.post("/v1/pools/:pool/machines", { ...auth("operator"), body: registerSchema }, async (req) =>
    new Reply(201, await registerMachine(ctx, req.auth, { pool: req.params.pool!, ...req.body })),
  );
  app.post("/v1/machines/:machine/destroyed", auth("operator"), async (req) => confirmDestroyed(ctx, req.auth, req.params.machine!));
  app.post("/v1/machines/:machine/drain", auth("operator"), async (req) => drainMachine(ctx, req.auth, req.params.machine!));
}

/**
 * Borrows, keeper and portable alike: a borrow id starting `g_` is a
 * portable grant (the portable API's), any other a keeper borrow.
 */
function addBorrowRoutes(app: HttpServer, d: RouteDeps, a: RouteAuth): void {
  const { ctx } = d;
  const { auth, cachedAuth, checked, keeper } = a;
  app.post("/v1/borrows/:borrow/end", auth("operator"), async (req) => endBorrowAsOperator(ctx, req.auth, req.params.borrow!));
  app.post("/v1/pools/:pool/borrow", { ...cachedAuth("member"), body: borrowSchema }, async (req) => {
    const body = req.body;
    if (body.access === "portable") {
      if (!d.portable) throw new BerthError("portable_unsupported", "portable_unsupported: this coordinator does not offer portable access; no fallback to keeper access is made");
      const portable = d.portable;
      const r = await keeper(req.auth, (p) => portable.borrow(p, req.params.pool!, body, chosenPortable(body)));
      return new Reply(r.repeated ? 200 : 201, r);
    }
    if (body.publicKey !== undefined) throw new BerthError("invalid_request", "invalid_request: publicKey is only for --access portable borrows");
    const chosen = chosenKeeper(body);
    const r = await keeper(req.auth, (p) => borrowKeeper(ctx, p, req.params.pool!, chosen, body.durationMs ?? null));
    return new Reply(r.repeated ? 200 : 201, r);
  });
  app.get("/v1/borrows/:borrow", auth(), async (req) => {
    const id = req.params.borrow!;
    if (d.portable && id.startsWith("g_")) return d.portable.show(req.auth, id);
    return presentBorrow(await getBorrow(ctx, req.auth, id));
  });
  app.post("/v1/borrows/:borrow/heartbeat", { ...cachedAuth(), body: heartbeatSchema }, async (req) => {
    const id = req.params.borrow!;
    if (d.portable && id.startsWith("g_")) return d.portable.heartbeat(await checked(req), id, req.body);
    return keeper(req.auth, (p) => heartbeatKeeper(ctx, p, id, req.body.token));
  });
  app.post("/v1/borrows/:borrow/return", { ...cachedAuth(), body: returnSchema }, async (req) => {
    const id = req.params.borrow!;
    if (d.portable && id.startsWith("g_")) return d.portable.return(await checked(req), id, req.body);
    return keeper(req.auth, (p) => returnKeeper(ctx, p, id, req.body.token, req.body.disposition));
  });
  // The ack reads the token committed: it re-validates the borrower's authorization as it stands now.
  app.post("/v1/borrows/:borrow/ack", { ...auth(), body: ackSchema }, async (req) => {
    if (!d.portable) throw new BerthError("portable_unsupported", "portable_unsupported: this coordinator does not offer portable access");
    return d.portable.ack(req.auth, req.params.borrow!, req.body);
  });
  app.post("/v1/borrows/:borrow/report", { ...auth(), body: reportSchema }, async (req) => reportTelemetry(ctx, req.auth, req.params.borrow!, req.body));
}

/** The scrape token of `/metrics`, compared as hashes in constant time. */
function checkMetricsToken(expected: string, header: string | undefined): void {
  const m = typeof header === "string" ? /^Bearer (\S{1,512})$/.exec(header) : null;
  if (m === null || !sameHash(hashToken("api", m[1]!), expected)) {
    throw new BerthError("unauthorized", "unauthorized: /metrics needs the scrape token given to `berth serve --metrics-token-file`, as 'Authorization: Bearer <token>'");
  }
}
