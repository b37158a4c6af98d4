/**
 * Allocation routes, kept apart from routes.ts so they can move with the
 * HTTP layer as one registration:
 *
 *   GET  /v1/sizes                              the size catalog
 *   GET  /v1/allocations[?all=true]             live allocations (a member's own; an operator's org)
 *   POST /v1/allocations                        create (idempotent by id; `volume`: on a kept volume)
 *   POST /v1/allocations/plan                   placement dry run
 *   GET  /v1/allocations/{allocation}
 *   POST /v1/allocations/{allocation}/release
 *   GET  /v1/owners                             owners and budgets (operator)
 *   POST /v1/owners/{owner}/admit               admit with a budget (operator)
 *   POST /v1/owners/{owner}/budget              change an admitted owner's budget (operator)
 *   GET  /v1/host-accounts                      hosts' standing and capacity use
 *   POST /v1/hosts/{host}/standing              ready | draining | withdrawn | not_ready (operator); pushed to
 *                                               the agent: `withdrawing` until it acknowledged
 *
 * Every `{param}` and every body id goes through the one id constructor.
 */
import type { IncomingMessage } from "node:http";
import { Reply, type HttpServer } from "../../http/server.js";
import { allows, requireRole, type Principal, type Role } from "../auth.js";
import { budgetSchema, createAllocationSchema, planSchema, releaseAllocationSchema, resolveAllocationSchema, standingSchema } from "./schemas.js";
import { newId } from "../../core/ids.js";
import { createAllocation } from "../actions/allocation-create.js";
import type { AllocCtx } from "../actions/allocation-context.js";
import { precheckVolume } from "../actions/allocation-volume.js";
import { releaseAllocation, resolveAllocation, type Requester } from "../actions/allocation-release.js";
import { restartAllocation } from "../actions/allocation-watch.js";
import { allocationDetail, listAllocationsFor, planAllocation, showAllocation } from "../actions/allocation-read.js";
import { parsePublicKey } from "../../core/ssh-public-key.js";
import { registerVolumeRoutes } from "./volume-routes.js";
import type { AllocationAgent } from "../allocation-agent.js";
import { reportedStanding } from "../../core/host-standing.js";
import { pushStanding } from "../actions/host-standing.js";
import { changeHostStanding, ownersOf, setOwnerBudget, listHostAccounts } from "../actions/allocation-owners.js";
import type { AllocationRecord } from "../../store/allocations.js";
import type { OwnerRecord } from "../../store/allocation-owners.js";

export function presentAllocation(a: AllocationRecord) {
  return {
    id: a.id,
    owner: a.owner,
    size: a.size,
    vcpu: a.vcpu,
    memoryMib: a.memoryMib,
    diskMib: a.diskMib,
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
  /** Authentication and the role, both checked before the body is read. */
  auth: (role?: Role) => { auth: (req: IncomingMessage) => Promise<Principal> };
  /** Calls to the hosts' agents (volume routes); absent: no volume routes. */
  agent?: AllocationAgent;
}

function requester(p: Principal): Requester {
  return { org: p.org, principal: p.tokenId, operator: allows(p, "operator") };
}

function queryFlag(raw: IncomingMessage, name: string): boolean {
  const url = raw.url ?? "";
  const q = url.indexOf("?");
  return q >= 0 && new URLSearchParams(url.slice(q + 1)).get(name) === "true";
}

export function registerAllocationRoutes(app: HttpServer, d: AllocationRouteDeps): void {
  const { ctx, auth } = d;
  app.get("/v1/sizes", auth(), async () => ({ sizes: ctx.config.allocationSizes, maxDurationMs: ctx.config.maxAllocationMs }));
  app.get("/v1/allocations", auth("member"), async (req) => ({
    allocations: (await listAllocationsFor(ctx, requester(req.auth), queryFlag(req.raw, "all"))).map(presentAllocation),
  }));
  app.post("/v1/allocations", { ...auth("member"), body: createAllocationSchema }, async (req) => {
    const p = req.auth;
    const body = req.body;
    if (body.owner !== undefined && body.owner !== p.tokenId) requireRole(p, "operator");
    // Without a client id the create cannot be retried safely; the CLI always sends one.
    const id = body.id ?? newId("al", ctx.randomBytes);
    const key = body.publicKey !== undefined ? parsePublicKey(body.publicKey) : null;
    const publicKey = key ? { line: key.line, fingerprint: key.fingerprint } : null;
    const owner = body.owner ?? p.tokenId;
    // A kept volume is verified by its agent first: a damaged or removed one is refused with nothing created.
    if (body.volume !== undefined && d.agent) await precheckVolume(ctx, d.agent, p.org, owner, id, body.size, body.volume);
    const res = await createAllocation(ctx, p.org, owner, { id, size: body.size, durationMs: body.durationMs ?? null, strategy: body.strategy, publicKey, volume: body.volume ?? null });
    return new Reply(res.created ? 201 : 200, { ...presentAllocation(res.allocation), created: res.created });
  });
  app.post("/v1/allocations/plan", { ...auth("member"), body: planSchema }, async (req) => planAllocation(ctx, requester(req.auth), req.body.size, req.body.strategy));
  app.get("/v1/allocations/:allocation", auth("member"), async (req) => {
    const a = await showAllocation(ctx, requester(req.auth), req.params.allocation!);
    return { ...presentAllocation(a), ...(await allocationDetail(ctx, a)) };
  });
  app.post("/v1/allocations/:allocation/release", { ...auth("member"), body: releaseAllocationSchema }, async (req) =>
    presentAllocation(await releaseAllocation(ctx, requester(req.auth), req.params.allocation!, req.body.keepVolume)),
  );
  // An operator ends a quarantine (allocation-release.ts): the agent destroys what is left, then the reservation comes back.
  app.post("/v1/allocations/:allocation/resolve", { ...auth("operator"), body: resolveAllocationSchema }, async (req) =>
    presentAllocation(await resolveAllocation(ctx, requester(req.auth), req.params.allocation!, req.body.volume)),
  );
  // A failed allocation's sandbox started again on its host with its volume (allocation-watch.ts).
  app.post("/v1/allocations/:allocation/restart", auth("member"), async (req) => presentAllocation(await restartAllocation(ctx, requester(req.auth), req.params.allocation!, d.agent ? (h, a) => d.agent!.sandbox(h, a) : undefined)));
  if (d.agent) registerVolumeRoutes(app, { ctx, auth, agent: d.agent, requester });
  app.get("/v1/owners", auth("operator"), async (req) => ({ owners: (await ownersOf(ctx, req.auth.org)).map(presentOwner) }));
  for (const [path, mustExist] of [["/v1/owners/:owner/admit", false], ["/v1/owners/:owner/budget", true]] as const) {
    app.post(path, { ...auth("operator"), body: budgetSchema }, async (req) => presentOwner(await setOwnerBudget(ctx, req.auth.org, req.params.owner!, req.body, mustExist)));
  }
  app.get("/v1/host-accounts", auth("member"), async (req) => ({
    hosts: (await ctx.store.transaction((tx) => listHostAccounts(tx, req.auth.org))).map((h) => ({ ...h, reported: reportedStanding(h.standing, h.standingEpoch, h.standingAcked) })),
  }));
  // The change is recorded, then pushed to the agent; `standing` is what is true now: `withdrawing` until the agent acknowledged.
  app.post("/v1/hosts/:host/standing", { ...auth("operator"), body: standingSchema }, async (req) => {
    const { hostId, epoch } = await changeHostStanding(ctx, req.auth.org, req.params.host!, req.body.standing, req.body.hostGone ? req.auth.tokenId : null);
    const reported = d.agent && !req.body.hostGone ? await pushStanding({ ctx, agent: d.agent }, hostId) : req.body.hostGone ? "withdrawn" : null;
    return { hostId, requested: req.body.standing, standing: reported ?? reportedStanding(req.body.standing, epoch, 0), epoch };
  });
}
