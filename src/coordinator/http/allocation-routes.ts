/**
 * Allocation routes, kept apart from routes.ts so they can move with the
 * HTTP layer as one registration:
 *
 *   GET  /v1/sizes                              the size catalog
 *   GET  /v1/allocations[?all=true]             live allocations (a member's own; an operator's org)
 *   POST /v1/allocations                        create (idempotent by id)
 *   POST /v1/allocations/plan                   placement dry run
 *   GET  /v1/allocations/{allocation}
 *   POST /v1/allocations/{allocation}/release
 *   GET  /v1/owners                             owners and budgets (operator)
 *   POST /v1/owners/{owner}/admit               admit with a budget (operator)
 *   POST /v1/owners/{owner}/budget              change an admitted owner's budget (operator)
 *   GET  /v1/host-accounts                      hosts' standing and capacity use
 *   POST /v1/hosts/{host}/standing              ready | draining | withdrawn | not_ready (operator)
 *
 * Every `{param}` and every body id goes through the one id constructor.
 */
import { z } from "zod";
import { ok, validate, type Request, type Router } from "./router.js";
import { allows, requireRole, type Principal } from "../auth.js";
import { idSchema } from "./schemas.js";
import { HOST_STANDINGS } from "../../core/allocation-placement.js";
import { newId } from "../../core/ids.js";
import { createAllocation, type AllocCtx } from "../actions/allocation-create.js";
import { releaseAllocation, type Requester } from "../actions/allocation-release.js";
import { listAllocationsFor, planAllocation, showAllocation } from "../actions/allocation-read.js";
import { changeHostStanding, ownersOf, setOwnerBudget, listHostAccounts } from "../actions/alloc-owners.js";
import type { AllocationRecord } from "../../store/allocations.js";
import type { OwnerRecord } from "../../store/alloc-owners.js";

const int = (min: number, max: number) => z.number().int().min(min).max(max);

export const createAllocationSchema = z.strictObject({
  id: idSchema.optional(),
  size: z.string().min(1).max(64),
  durationMs: z.number().int().optional(),
  strategy: z.enum(["binpack", "spread"]).default("binpack"),
  /** Operators may create for another admitted owner. */
  owner: idSchema.optional(),
});

export const planSchema = z.strictObject({ size: z.string().min(1).max(64), strategy: z.enum(["binpack", "spread"]).default("binpack") });
export const releaseAllocationSchema = z.strictObject({ keepVolume: z.boolean().default(false) });
// Non-positive budgets reach checkBudget, which refuses them with one message for every dimension.
export const budgetSchema = z.strictObject({ vcpu: int(-1_000_000, 1_000_000), memoryMib: int(-1_000_000_000, 1_000_000_000), count: int(-1_000_000, 1_000_000) });
export const standingSchema = z.strictObject({ standing: z.enum(HOST_STANDINGS as [string, ...string[]]) });

export function presentAllocation(a: AllocationRecord) {
  return {
    id: a.id,
    owner: a.owner,
    size: a.size,
    vcpu: a.vcpu,
    memoryMib: a.memoryMib,
    state: a.state,
    hostId: a.hostId,
    plan: a.plan,
    createdAt: a.createdAt,
    expiresAt: a.expiresAt,
    stateSince: a.stateSince,
    reason: a.reason,
  };
}

export function presentOwner(o: OwnerRecord) {
  return { owner: o.owner, budget: o.budget, used: o.used, admittedAt: o.admittedAt, updatedAt: o.updatedAt };
}

export interface AllocationRouteDeps {
  ctx: AllocCtx & { randomBytes: (n: number) => Uint8Array };
  auth: (req: Request) => Promise<Principal>;
}

function requester(p: Principal): Requester {
  return { org: p.org, principal: p.tokenId, operator: allows(p, "operator") };
}

function queryFlag(req: Request, name: string): boolean {
  const url = req.raw.url ?? "";
  const q = url.indexOf("?");
  return q >= 0 && new URLSearchParams(url.slice(q + 1)).get(name) === "true";
}

export function registerAllocationRoutes(r: Router, d: AllocationRouteDeps): void {
  const { ctx, auth } = d;
  r.add("GET", "/v1/sizes", async (req) => {
    await auth(req);
    return ok({ sizes: ctx.config.allocationSizes, maxDurationMs: ctx.config.maxAllocationMs });
  });
  r.add("GET", "/v1/allocations", async (req) => {
    const p = await auth(req);
    requireRole(p, "member");
    return ok({ allocations: (await listAllocationsFor(ctx, requester(p), queryFlag(req, "all"))).map(presentAllocation) });
  });
  r.add("POST", "/v1/allocations", async (req) => {
    const p = await auth(req);
    requireRole(p, "member");
    const body = validate(createAllocationSchema, req.body);
    if (body.owner !== undefined && body.owner !== p.tokenId) requireRole(p, "operator");
    // Without a client id the create cannot be retried safely; the CLI always sends one.
    const id = body.id ?? newId("al", ctx.randomBytes);
    const res = await createAllocation(ctx, p.org, body.owner ?? p.tokenId, { id, size: body.size, durationMs: body.durationMs ?? null, strategy: body.strategy });
    return ok({ ...presentAllocation(res.allocation), created: res.created }, res.created ? 201 : 200);
  });
  r.add("POST", "/v1/allocations/plan", async (req) => {
    const p = await auth(req);
    requireRole(p, "member");
    const body = validate(planSchema, req.body);
    return ok(await planAllocation(ctx, requester(p), body.size, body.strategy));
  });
  r.add("GET", "/v1/allocations/{allocation}", async (req) => {
    const p = await auth(req);
    requireRole(p, "member");
    return ok(presentAllocation(await showAllocation(ctx, requester(p), req.params.allocation!)));
  });
  r.add("POST", "/v1/allocations/{allocation}/release", async (req) => {
    const p = await auth(req);
    requireRole(p, "member");
    const body = validate(releaseAllocationSchema, req.body);
    return ok(presentAllocation(await releaseAllocation(ctx, requester(p), req.params.allocation!, body.keepVolume)));
  });
  r.add("GET", "/v1/owners", async (req) => {
    const p = await auth(req);
    requireRole(p, "operator");
    return ok({ owners: (await ownersOf(ctx, p.org)).map(presentOwner) });
  });
  for (const [path, mustExist] of [["/v1/owners/{owner}/admit", false], ["/v1/owners/{owner}/budget", true]] as const) {
    r.add("POST", path, async (req) => {
      const p = await auth(req);
      requireRole(p, "operator");
      const body = validate(budgetSchema, req.body);
      return ok(presentOwner(await setOwnerBudget(ctx, p.org, req.params.owner!, body, mustExist)));
    });
  }
  r.add("GET", "/v1/host-accounts", async (req) => {
    const p = await auth(req);
    requireRole(p, "member");
    return ok({ hosts: await ctx.store.transaction((tx) => listHostAccounts(tx, p.org)) });
  });
  r.add("POST", "/v1/hosts/{host}/standing", async (req) => {
    const p = await auth(req);
    requireRole(p, "operator");
    const body = validate(standingSchema, req.body);
    await changeHostStanding(ctx, p.org, req.params.host!, body.standing as (typeof HOST_STANDINGS)[number]);
    return ok({ hostId: req.params.host, standing: body.standing });
  });
}
