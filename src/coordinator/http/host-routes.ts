/**
 * Host identity routes (docs/host-identity.md, docs/api.md):
 *
 *   POST /v1/hosts/challenge          (no auth) -> {challenge, expiresAt}
 *   POST /v1/hosts/session            (no auth; a signed challenge) -> {credential, expiresAt}
 *   POST /v1/hosts/self/commit        (host credential) -> {hostCallToken}
 *   POST /v1/hosts/self/active        (host credential) -> {state}
 *   POST /v1/hosts/self/describe      (host credential) -> {hostId, hostCallToken}
 *   POST /v1/hosts/self/stopped       (host credential) -> {moot}
 *   POST /v1/hosts/{host}/activate    (operator) {force} -> {host, hostId, state, machines, endedBorrows}
 *   POST /v1/hosts/{host}/reset-identity (admin) {} -> {host, hostId, state: "awaiting", enrollToken}
 *   POST /v1/hosts/{host}/remove (admin) {force?} -> {host, hostId, state: "removing"|"removed", machines, allocations}
 *
 * The host credential is checked before the body is read, like API tokens.
 */
import type { IncomingMessage } from "node:http";
import type { HttpServer } from "../../http/server.js";
import type { Principal, Role } from "../auth.js";
import type { Ctx } from "../context.js";
import { authenticateHost, commitHost, describeHost, hostActive, issueChallenge, openSession, takeStoppedReports } from "../actions/host-identity.js";
import { activateHost } from "../actions/host-activate.js";
import { activateSchema, emptySchema, removeHostSchema, hostActiveSchema, hostDescribeSchema, hostSessionSchema, stoppedReportsSchema } from "./schemas.js";
import { resetHostIdentity } from "../actions/host-reset.js";
import { removeHost } from "../actions/host-remove.js";

export function registerHostRoutes(
  app: HttpServer,
  d: { ctx: Ctx; secret: Uint8Array; auth: (role?: Role) => { auth: (req: IncomingMessage) => Promise<Principal> } },
): void {
  const { ctx, secret } = d;
  const host = { auth: (req: IncomingMessage) => authenticateHost(ctx, req.headers.authorization) };
  app.post("/v1/hosts/challenge", { body: emptySchema }, async () => issueChallenge(ctx, secret));
  app.post("/v1/hosts/session", { body: hostSessionSchema }, async (req) => openSession(ctx, secret, req.body));
  app.post("/v1/hosts/self/commit", { ...host, body: emptySchema }, async (req) => commitHost(ctx, req.auth, secret));
  app.post("/v1/hosts/self/active", { ...host, body: hostActiveSchema }, async (req) => hostActive(ctx, req.auth, req.body.version));
  app.post("/v1/hosts/self/describe", { ...host, body: hostDescribeSchema }, async (req) => describeHost(ctx, req.auth, secret, req.body));
  app.post("/v1/hosts/self/stopped", { ...host, body: stoppedReportsSchema }, async (req) => takeStoppedReports(ctx, req.auth, req.body.reports));
  app.post("/v1/hosts/:host/reset-identity", { ...d.auth("admin"), body: emptySchema }, async (req) => resetHostIdentity(ctx, req.auth, req.params.host!));
  app.post("/v1/hosts/:host/remove", { ...d.auth("admin"), body: removeHostSchema }, async (req) => removeHost(ctx, req.auth, req.params.host!, req.body.force));
  app.post("/v1/hosts/:host/activate", { ...d.auth("operator"), body: activateSchema }, async (req) => activateHost(ctx, req.auth, req.params.host!, req.body.force, secret));
}
