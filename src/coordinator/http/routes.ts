/** The coordinator's HTTP routes: each validates its input and calls one action. */
import type { Ctx } from "../context.js";
import { Router, ok, validate, type Request } from "./router.js";
import { authenticate, requireRole, type Principal } from "../auth.js";
import { drainSchema, ensureSchema, registerSchema, borrowSchema, returnSchema, heartbeatSchema, ackSchema, reportSchema, enrollSchema } from "./schemas.js";
import { ensurePool, getPool, listPools } from "../actions/pools.js";
import { registerMachine } from "../actions/register.js";
import { borrowKeeper, getBorrow, heartbeatKeeper, returnKeeper } from "../actions/borrow.js";
import { enrollHost, listHosts } from "../actions/hosts.js";
import { confirmDestroyed } from "../actions/destroyed.js";
import { drainPool } from "../actions/drain.js";
import { presentPool, presentBorrow, presentHost } from "./present.js";
import { BerthError } from "../../core/errors.js";
import type { PortableApi } from "../actions/portable-api.js";
import { registerAllocationRoutes } from "./allocation-routes.js";

export interface RouteDeps {
  ctx: Ctx;
  secret: Uint8Array;
  metricsText: () => Promise<string>;
  portable: PortableApi | null;
  version: string;
}

export function buildRouter(d: RouteDeps): Router {
  const { ctx } = d;
  const auth = (req: Request): Promise<Principal> => authenticate(ctx.store, req.headers.authorization, ctx.now());
  const r = new Router();

  r.add("GET", "/v1/health", async () => ok({ status: "ok", version: d.version, store: ctx.store.dialect, portable: ctx.config.portable }));
  r.add("GET", "/metrics", async () => ({ status: 200, text: await d.metricsText(), contentType: "text/plain; version=0.0.4" }));

  r.add("GET", "/v1/pools", async (req) => {
    const p = await auth(req);
    return ok({ pools: (await listPools(ctx, p)).map((x) => ({ ...presentPool(x.pool), ready: x.ready, machines: x.total })) });
  });
  r.add("GET", "/v1/pools/{pool}", async (req) => {
    const p = await auth(req);
    const x = await getPool(ctx, p, req.params.pool!);
    return ok({ ...presentPool(x.pool), counts: x.counts, states: x.states });
  });
  r.add("POST", "/v1/pools/{pool}/ensure", async (req) => {
    const p = await auth(req);
    requireRole(p, "operator");
    const body = validate(ensureSchema, req.body);
    const res = await ensurePool(ctx, p, { name: req.params.pool!, ...body });
    return ok({ ...presentPool(res.pool), counts: res.counts, claims: res.claims, note: res.note });
  });
  r.add("POST", "/v1/pools/{pool}/drain", async (req) => {
    const p = await auth(req);
    requireRole(p, "operator");
    const body = validate(drainSchema, req.body);
    return ok(await drainPool(ctx, p, req.params.pool!, body.force));
  });
  r.add("POST", "/v1/pools/{pool}/machines", async (req) => {
    const p = await auth(req);
    requireRole(p, "operator");
    const body = validate(registerSchema, req.body);
    return ok(await registerMachine(ctx, p, { pool: req.params.pool!, ...body }), 201);
  });
  r.add("POST", "/v1/machines/{machine}/destroyed", async (req) => {
    const p = await auth(req);
    requireRole(p, "operator");
    return ok(await confirmDestroyed(ctx, p, req.params.machine!));
  });
  r.add("POST", "/v1/pools/{pool}/borrow", async (req) => {
    const p = await auth(req);
    requireRole(p, "member");
    const body = validate(borrowSchema, req.body);
    if (body.access === "portable") {
      if (!d.portable) throw new BerthError("portable_unsupported", "portable_unsupported: this coordinator does not offer portable access; no fallback to keeper access is made");
      return ok(await d.portable.borrow(p, req.params.pool!, body), 201);
    }
    if (body.publicKey !== undefined || body.durationMs !== undefined) {
      throw new BerthError("invalid_request", "invalid_request: publicKey and durationMs are only for --access portable borrows");
    }
    return ok(await borrowKeeper(ctx, p, req.params.pool!), 201);
  });
  r.add("GET", "/v1/borrows/{borrow}", async (req) => {
    const p = await auth(req);
    if (d.portable && req.params.borrow!.startsWith("g_")) return ok(await d.portable.show(p, req.params.borrow!));
    return ok(presentBorrow(await getBorrow(ctx, p, req.params.borrow!)));
  });
  r.add("POST", "/v1/borrows/{borrow}/heartbeat", async (req) => {
    const p = await auth(req);
    const body = validate(heartbeatSchema, req.body);
    if (d.portable && req.params.borrow!.startsWith("g_")) return ok(await d.portable.heartbeat(p, req.params.borrow!, body));
    return ok(await heartbeatKeeper(ctx, p, req.params.borrow!, body.token));
  });
  r.add("POST", "/v1/borrows/{borrow}/return", async (req) => {
    const p = await auth(req);
    const body = validate(returnSchema, req.body);
    if (d.portable && req.params.borrow!.startsWith("g_")) return ok(await d.portable.return(p, req.params.borrow!, body));
    return ok(await returnKeeper(ctx, p, req.params.borrow!, body.token, body.disposition));
  });
  r.add("POST", "/v1/borrows/{borrow}/ack", async (req) => {
    const p = await auth(req);
    const body = validate(ackSchema, req.body);
    if (!d.portable) throw new BerthError("portable_unsupported", "portable_unsupported: this coordinator does not offer portable access");
    return ok(await d.portable.ack(p, req.params.borrow!, body));
  });
  r.add("POST", "/v1/borrows/{borrow}/report", async (req) => {
    await auth(req);
    const body = validate(reportSchema, req.body);
    // Telemetry only: recorded as observed, never used as proof of anything.
    if (body.firstCommandMs !== undefined) ctx.metrics.clientReports.observe({ kind: "first_command" }, body.firstCommandMs / 1000);
    if (body.scrubMs !== undefined) ctx.metrics.clientReports.observe({ kind: "scrub" }, body.scrubMs / 1000);
    return ok({ recorded: true });
  });
  r.add("GET", "/v1/hosts", async (req) => {
    const p = await auth(req);
    return ok({ hosts: (await listHosts(ctx, p)).map(presentHost) });
  });
  r.add("POST", "/v1/hosts/enroll", async (req) => {
    const p = await auth(req);
    const body = validate(enrollSchema, req.body);
    return ok(await enrollHost(ctx, p, body, d.secret));
  });
  registerAllocationRoutes(r, { ctx: { ...ctx, onRefusal: (reason) => ctx.metrics.allocationRefusals.inc({ reason }) }, auth });
  return r;
}
