/**
 * Workspace volume routes: `berth volume ls|show|verify|reset` through the
 * coordinator, which asks the allocation's host agent (alloc-http.ts on the
 * agent). Nobody needs to know or touch the agent's storage layout.
 *
 *   GET  /v1/volumes                          volumes of the caller's allocations (an operator: the org's)
 *   GET  /v1/volumes/{allocation}             one volume, with a structural check
 *   POST /v1/volumes/{allocation}/verify      the structural check: record, directory identity, marker
 *   POST /v1/volumes/{allocation}/reset       empty it (owner or operator); refused on a damaged volume; audited
 *   POST /v1/volumes/{allocation}/remove      remove a kept volume (owner or operator): only once the allocation is released
 *   GET  /v1/volume-quarantine                directories an agent moved aside (never adopted), per host (operators)
 *   POST /v1/volume-quarantine/{host}/{name}/remove   remove one of them (operators)
 *
 * Access follows the allocation's: another owner's is not found for a member.
 */
import type { IncomingMessage } from "node:http";
import type { HttpServer } from "../../http/server.js";
import type { Principal, Role } from "../auth.js";
import type { AllocationAgent } from "../allocation-agent.js";
import type { AllocCtx } from "../actions/allocation-context.js";
import type { Requester } from "../actions/allocation-release.js";
import { listAllocationsFor, showAllocation } from "../actions/allocation-read.js";
import { BerthError } from "../../core/errors.js";
import { parseId } from "../../core/ids.js";
import { allocationMachineId } from "../../core/allocation-access.js";
import { audit } from "../../store/audit.js";
import { listHostAccounts } from "../../store/host-accounts.js";

export interface VolumeRouteDeps {
  ctx: AllocCtx;
  auth: (role?: Role) => { auth: (req: IncomingMessage) => Promise<Principal> };
  agent: AllocationAgent;
  requester: (p: Principal) => Requester;
}

export function registerVolumeRoutes(app: HttpServer, d: VolumeRouteDeps): void {
  const { ctx, auth, agent, requester } = d;
  app.get("/v1/volumes", auth("member"), async (req) => {
    const mine = await listAllocationsFor(ctx, requester(req.auth), true);
    const byHost = new Map<string, Map<string, (typeof mine)[number]>>();
    for (const a of mine) {
      if (!byHost.has(a.hostId)) byHost.set(a.hostId, new Map());
      byHost.get(a.hostId)!.set(a.id, a);
    }
    const volumes: unknown[] = [];
    const unreachable: string[] = [];
    for (const [hostId, allocs] of byHost) {
      try {
        const r = await agent.passthrough(hostId, "GET /v1/agent/volumes");
        for (const v of r.volumes) {
          const a = allocs.get(v.allocationId);
          // A moved record's volume is listed under the allocation it was attached to.
          if (a && v.state !== "clean" && v.state !== "moved") volumes.push({ ...v, hostId, hostName: a.plan.hostName, allocationState: a.state, owner: a.owner });
        }
      } catch {
        unreachable.push(hostId);
      }
    }
    return { volumes, unreachableHosts: unreachable };
  });
  const one = async (p: Principal, raw: string) => showAllocation(ctx, requester(p), raw);
  app.get("/v1/volumes/:allocation", auth("member"), async (req) => {
    const a = await one(req.auth, req.params.allocation!);
    return { ...(await agent.passthrough(a.hostId, "GET /v1/agent/volumes/{allocation}", { allocation: a.id })), hostId: a.hostId, hostName: a.plan.hostName, allocationState: a.state };
  });
  app.post("/v1/volumes/:allocation/verify", auth("member"), async (req) => {
    const a = await one(req.auth, req.params.allocation!);
    return agent.passthrough(a.hostId, "POST /v1/agent/volumes/{allocation}/verify", { allocation: a.id });
  });
  app.post("/v1/volumes/:allocation/reset", auth("member"), async (req) => {
    const a = await one(req.auth, req.params.allocation!);
    const r = await agent.passthrough(a.hostId, "POST /v1/agent/volumes/{allocation}/reset", { allocation: a.id });
    await ctx.store.transaction((tx) => audit(tx, { at: ctx.now(), machineId: allocationMachineId(a.id), subject: req.auth.tokenId, event: "volume_reset", from: a.state, to: "reset", generation: 0, actor: ctx.actor, detail: `host ${a.hostId}; ${r.removed} entries removed` }));
    return { allocationId: a.id, ...r };
  });
  // A kept volume (release --keep-volume) ends here: by its owner or an operator, once the allocation is released.
  app.post("/v1/volumes/:allocation/remove", auth("member"), async (req) => {
    const a = await one(req.auth, req.params.allocation!);
    if (a.state !== "released") throw new BerthError("conflict", `conflict: allocation ${a.id} is ${a.state}; only a released allocation's kept volume is removed (berth alloc release ${a.id} wipes it unless --keep-volume)`);
    const r = await agent.passthrough(a.hostId, "POST /v1/agent/volumes/{allocation}/remove", { allocation: a.id });
    await ctx.store.transaction((tx) => audit(tx, { at: ctx.now(), machineId: allocationMachineId(a.id), subject: req.auth.tokenId, event: "volume_removed", from: "kept", to: r.state, generation: 0, actor: ctx.actor, detail: `host ${a.hostId}` }));
    return { allocationId: a.id, state: r.state };
  });
  const hostsOf = async (p: Principal) => ctx.store.transaction((tx) => listHostAccounts(tx, p.org));
  app.get("/v1/volume-quarantine", auth("operator"), async (req) => {
    const hosts: Array<{ hostId: string; hostName: string; quarantined: string[] }> = [];
    const unreachable: string[] = [];
    for (const h of await hostsOf(req.auth)) {
      try {
        const r = await agent.passthrough(h.hostId, "GET /v1/agent/volumes");
        hosts.push({ hostId: h.hostId, hostName: h.name, quarantined: r.quarantined });
      } catch {
        unreachable.push(h.hostId);
      }
    }
    return { hosts, unreachableHosts: unreachable };
  });
  app.post("/v1/volume-quarantine/:host/:name/remove", auth("operator"), async (req) => {
    const hostId = parseId(req.params.host!, "host id");
    const name = parseId(req.params.name!, "directory name");
    const h = (await hostsOf(req.auth)).find((x) => x.hostId === hostId);
    if (!h) throw new BerthError("not_found", `not_found: no host ${hostId} in this organisation`);
    const r = await agent.passthrough(hostId, "POST /v1/agent/volume-quarantine/{name}/remove", { name });
    await ctx.store.transaction((tx) => audit(tx, { at: ctx.now(), machineId: hostId, subject: req.auth.tokenId, event: "volume_quarantine_removed", from: "moved_aside", to: "removed", generation: 0, actor: ctx.actor, detail: name }));
    return { hostId, removed: r.removed };
  });
}
