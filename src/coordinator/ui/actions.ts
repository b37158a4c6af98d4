/**
 * The dashboard's actions, each a confirmed form POST: the session is checked
 * before the body is read, then the form's CSRF token, then the role, then
 * the same action code the API runs (org-scoped by the session's principal).
 * The answer is a redirect back to the page the form was on, with
 * `?done=KIND&id=ID` so that page shows what was done (routes.ts: a fixed
 * sentence per kind, the id escaped), or a refusal page naming what happened.
 */
import type { IncomingMessage } from "node:http";
import { z } from "zod";
import { BerthError } from "../../core/errors.js";
import type { HttpServer } from "../../http/server.js";
import type { Id } from "../../core/ids.js";
import type { Ctx } from "../context.js";
import { allows, requireRole, type Principal, type Role } from "../auth.js";
import { drainMachine, drainPool } from "../actions/drain.js";
import { endBorrowAsOperator } from "../actions/end-borrow.js";
import { releaseAllocation } from "../actions/allocation-release.js";
import { restartAllocation, type SandboxProbe } from "../actions/allocation-watch.js";
import { listApiTokensOfOrg, revokeTokenWithGrants } from "../../store/api-tokens.js";
import { checkCsrf, type Session } from "./session.js";
import type { LiveChanges } from "./sse.js";
import { backTo, redirect, sendRefusal } from "./respond.js";

/** What an action did, as the page it returns to says it (`?done=`). */
export const DONE = {
  "machine-drained": (id: string) => `Machine ${id} is draining: it is destroyed, and leaves the pool's ready machines.`,
  "pool-drained": (id: string) => `Pool ${id} is draining: its capacity is zero and its ready machines are being destroyed.`,
  "borrow-ended": (id: string) => `Borrow ${id} was ended: its borrower has lost access; its machine is cleaned up.`,
  "allocation-released": (id: string) => `Allocation ${id} was released.`,
  "allocation-restarting": (id: string) => `Allocation ${id} is being restarted.`,
  "token-revoked": (id: string) => `Token ${id} was revoked, with its live grants.`,
} as const;
export type DoneKind = keyof typeof DONE;

const form = z.object({ csrf: z.string().optional(), force: z.string().optional(), back: z.string().optional() });

interface ActionDeps {
  withSession: { auth: (req: IncomingMessage) => Promise<Session> };
  live: LiveChanges;
  sandboxProbe?: SandboxProbe;
}

export function addUiActions(app: HttpServer, ctx: Ctx, d: ActionDeps): void {
  /** `run` answers where to go next (a dashboard path). */
  const act = (path: string, role: Role, done: DoneKind, run: (p: Principal, params: Record<string, Id>, body: z.output<typeof form>, s: Session) => Promise<string>) =>
    app.post(path, { ...d.withSession, bodyType: "form", body: form }, async (req) => {
      try {
        checkCsrf(req.auth, req.body.csrf);
        requireRole(req.auth.principal, role);
        const next = await run(req.auth.principal, req.params, req.body, req.auth);
        const to = backTo(req.body.back, next);
        const id = Object.values(req.params)[0] ?? "";
        return redirect(req.res, to.startsWith("/ui/sign-in") ? to : `${to}?done=${done}&id=${encodeURIComponent(id)}`);
      } catch (e) {
        return sendRefusal(req.res, e, { principal: req.auth.principal, csrf: req.auth.csrf, now: ctx.now(), here: backTo(req.body.back, "/ui"), tokenLabel: req.auth.label });
      }
    });

  act("/ui/machines/:machine/drain", "operator", "machine-drained", async (p, params) => {
    const r = await drainMachine(ctx, p, params.machine!);
    return `/ui/machines/${r.machineId}`;
  });
  act("/ui/pools/:pool/drain", "operator", "pool-drained", async (p, params, body) => {
    await drainPool(ctx, p, params.pool!, body.force === "true");
    return `/ui/pools/${params.pool}`;
  });
  act("/ui/borrows/:borrow/end", "operator", "borrow-ended", async (p, params) => {
    await endBorrowAsOperator(ctx, p, params.borrow!);
    return "/ui/borrows";
  });
  act("/ui/allocations/:allocation/release", "member", "allocation-released", async (p, params) => {
    await releaseAllocation(ctx, { org: p.org, principal: p.tokenId, operator: allows(p, "operator") }, params.allocation!, false);
    return "/ui/allocations";
  });
  act("/ui/allocations/:allocation/restart", "member", "allocation-restarting", async (p, params) => {
    await restartAllocation(ctx, { org: p.org, principal: p.tokenId, operator: allows(p, "operator") }, params.allocation!, d.sandboxProbe);
    return "/ui/allocations";
  });
  act("/ui/tokens/:token/revoke", "admin", "token-revoked", async (p, params, _body, s) => {
    const id = params.token!;
    // Only a token of the admin's own organisation; another's is as unknown as a missing one.
    if (!(await listApiTokensOfOrg(ctx.store, p.org)).some((t) => t.id === id)) throw new BerthError("not_found", `not_found: no token ${id} in this organisation`);
    await revokeTokenWithGrants(ctx.store, id, ctx.now());
    ctx.kick();
    if (id === p.tokenId) d.live.endSession(s.hash);
    return id === p.tokenId ? "/ui/sign-in" : "/ui/tokens";
  });
}
