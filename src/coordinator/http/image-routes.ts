/**
 * Image cache routes: `berth image ls|rm` through the coordinator, which asks
 * each gvisor host's agent (src/agent/images/http.ts). Nobody needs to know or
 * touch an agent's storage layout.
 *
 *   GET  /v1/images                   every gvisor host's cached images (member)
 *   POST /v1/images/{image}/remove    {host?} remove an image (id or unique prefix) from
 *                                     one host or from every host holding it (operator);
 *                                     refused on a host where a machine uses it
 */
import type { IncomingMessage } from "node:http";
import { BerthError, type ErrorCode } from "../../core/errors.js";
import type { HttpServer } from "../../http/server.js";
import type { Principal, Role } from "../auth.js";
import type { Ctx } from "../context.js";
import type { AllocationAgent } from "../allocation-agent.js";
import { listHosts } from "../actions/hosts.js";
import type { HostRow } from "../../store/hosts.js";
import { removeImageSchema } from "./schemas.js";

export interface ImageRouteDeps {
  ctx: Ctx;
  auth: (role?: Role) => { auth: (req: IncomingMessage) => Promise<Principal> };
  agent: AllocationAgent;
}

export function registerImageRoutes(app: HttpServer, d: ImageRouteDeps): void {
  const { ctx, auth, agent } = d;
  const gvisorHosts = async (p: Principal, name?: string): Promise<HostRow[]> => {
    const all = (await listHosts(ctx, p)).filter((h) => h.runtime === "gvisor");
    if (name === undefined) return all;
    const one = all.filter((h) => h.name === name || h.id === name);
    if (one.length === 0) throw new BerthError("not_found", `not_found: no gvisor host named ${name} in this organisation (see berth host ls)`);
    return one;
  };
  app.get("/v1/images", auth("member"), async (req) => {
    const hosts: unknown[] = [];
    const unreachableHosts: string[] = [];
    for (const h of await gvisorHosts(req.auth)) {
      try {
        const r = await agent.passthrough(h.id, "GET /v1/agent/images");
        hosts.push({ host: h.name, hostId: h.id, maxBytes: r.maxBytes, usedBytes: r.usedBytes, images: r.images });
      } catch {
        unreachableHosts.push(h.name);
      }
    }
    return { hosts, unreachableHosts };
  });
  app.post("/v1/images/:image/remove", { ...auth("operator"), body: removeImageSchema }, async (req) => {
    const removed: Array<{ host: string; id: string; size: number }> = [];
    const refused: Array<{ host: string; code: ErrorCode; message: string }> = [];
    for (const h of await gvisorHosts(req.auth, req.body.host)) {
      try {
        const r = await agent.passthrough(h.id, "POST /v1/agent/images/{image}/remove", { image: req.params.image! });
        removed.push({ host: h.name, id: r.id, size: r.size });
      } catch (e) {
        if (e instanceof BerthError && e.code === "not_found") continue;
        refused.push({ host: h.name, code: e instanceof BerthError ? e.code : "provider_unavailable", message: (e as Error).message });
      }
    }
    if (removed.length === 0 && refused.length === 0) throw new BerthError("not_found", `not_found: no host has image ${req.params.image!} cached (see berth image ls)`);
    if (removed.length === 0 && refused.length === 1) throw new BerthError(refused[0]!.code, refused[0]!.message);
    return { removed, refused };
  });
}
