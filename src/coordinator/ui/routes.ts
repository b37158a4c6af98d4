/**
 * The dashboard at `/ui`, on the coordinator's own HTTP server:
 *
 *   GET  /ui/sign-in, POST /ui/sign-in      the token form → session cookie
 *   POST /ui/sign-out                        ends the session server-side
 *   GET  /ui, /ui/pools/{pool}, /ui/borrows, /ui/allocations,
 *        /ui/machines/{machine}, /ui/tokens, /ui/audit  pages (`?part=live`: the live region only)
 *   GET  /ui/events                          the live stream (sse.ts)
 *   GET  /ui/assets/*                        htmx, uPlot, the dashboard's script and styles
 *   POST /ui/...                             actions (actions.ts)
 *
 * Pages run the same org-scoped reads and role checks as the API; a page
 * without a session redirects to the sign-in form.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { z } from "zod";
import { BerthError } from "../../core/errors.js";
import type { HttpServer } from "../../http/server.js";
import { TAKEN } from "../../http/server.js";
import type { Ctx } from "../context.js";
import type { Id } from "../../core/ids.js";
import { type Html } from "./html.js";
import { page, type View } from "./layout.js";
import { assetRoutes, serveAsset } from "./assets.js";
import { closeSession, checkCsrf, checkOrigin, DEFAULT_SESSION_MS, openSession, overTls, sessionOf, sessionStillValid, setCookieHeader, type Session, type SessionDeps } from "./session.js";
import { LiveChanges } from "./sse.js";
import { redirect, sendHtml, sendRefusal } from "./respond.js";
import { renderSignIn } from "./pages/plain.js";
import { loadOverview, renderOverview } from "./pages/overview.js";
import { loadPool, renderPool } from "./pages/pool.js";
import { windowOf } from "./pages/history.js";
import { loadBorrows, renderBorrows } from "./pages/borrows.js";
import { loadAllocations, renderAllocations } from "./pages/allocations.js";
import { loadMachine, renderMachine } from "./pages/machine.js";
import { loadTokens, renderTokens } from "./pages/tokens.js";
import { auditFilterOf, loadAudit, renderAudit } from "./pages/audit.js";
import { addUiActions, DONE, type DoneKind } from "./actions.js";
import type { SandboxProbe } from "../actions/allocation-watch.js";

export interface UiOptions {
  /** Session lifetime (default one hour; never past the token's expiry). */
  sessionMs?: number;
  /** How often the live stream looks for changes (default 500 ms). */
  liveIntervalMs?: number;
  /** How often a live stream re-checks its session (default 5 s). */
  liveRecheckMs?: number;
  /** Asks an agent about an allocation's sandbox before a restart is armed (allocation-watch.ts). */
  sandboxProbe?: SandboxProbe;
}

export interface Ui {
  live: LiveChanges;
  stop(): void;
}

interface PageOut {
  title: string;
  current: string;
  body: Html;
}

function query(req: IncomingMessage): URLSearchParams {
  const url = req.url ?? "";
  const q = url.indexOf("?");
  return new URLSearchParams(q < 0 ? "" : url.slice(q + 1));
}

/** How the dashboard's routes learn a request's session (sessions.ts), in the forms the HTTP layer takes. */
interface UiAuth {
  /** A request's session, read once (the rate exemption and the page share it). */
  sessionFor(req: IncomingMessage): Promise<Session>;
  /**
   * Requests of a signed-in session are not counted against the token-free
   * rate of their address (an operator clicking fast is not a flood); those
   * without a cookie, or with one that is no session, are.
   */
  signedIn: { exempt: (req: IncomingMessage) => Promise<boolean> };
  /** Session check before the body is read (the HTTP layer's order); refusals are the layer's JSON. */
  withSession: { auth: (req: IncomingMessage) => Promise<Session> };
}

/** The dashboard's steps: sessions, assets, sign-in and out, the live stream, the pages, the actions. */
export function addUiRoutes(app: HttpServer, ctx: Ctx, o: UiOptions = {}): Ui {
  const sd: SessionDeps = { store: ctx.store, now: ctx.now, randomBytes: ctx.randomBytes, sessionMs: o.sessionMs ?? DEFAULT_SESSION_MS };
  const live = new LiveChanges({
    store: ctx.store,
    sessionValid: (hash) => sessionStillValid(sd, hash),
    log: ctx.log,
    intervalMs: o.liveIntervalMs ?? 500,
    recheckMs: o.liveRecheckMs ?? 5000,
  });
  const a = uiAuth(sd);
  for (const asset of assetRoutes()) {
    app.get(asset.url, a.signedIn, async (req) => {
      serveAsset(asset.path, asset.immutable, req.raw, req.res);
      return TAKEN;
    });
  }
  addSignInRoutes(app, ctx, sd, live, a);
  app.get("/ui/events", a.signedIn, async (req) => {
    const s = await a.sessionFor(req.raw);
    live.open(req.res, s.principal.org, s.hash, query(req.raw).get("since") ?? "");
    return TAKEN;
  });
  addPages(app, ctx, live, a);
  addUiActions(app, ctx, { withSession: a.withSession, live, ...(o.sandboxProbe ? { sandboxProbe: o.sandboxProbe } : {}) });
  return { live, stop: () => live.stop() };
}

function uiAuth(sd: SessionDeps): UiAuth {
  const sessions = new WeakMap<IncomingMessage, Promise<Session>>();
  const sessionFor = (req: IncomingMessage): Promise<Session> => {
    let s = sessions.get(req);
    if (!s) {
      s = sessionOf(sd, req);
      s.catch(() => undefined);
      sessions.set(req, s);
    }
    return s;
  };
  return {
    sessionFor,
    signedIn: { exempt: (req) => (/(?:^|;\s*)berth_session=/.test(req.headers.cookie ?? "") ? sessionFor(req).then(() => true, () => false) : Promise.resolve(false)) },
    withSession: {
      auth: async (req) => {
        checkOrigin(req);
        return sessionOf(sd, req);
      },
    },
  };
}

/** The token form, the session cookie it gives, and the sign-out that ends the session server-side. */
function addSignInRoutes(app: HttpServer, ctx: Ctx, sd: SessionDeps, live: LiveChanges, a: UiAuth): void {
  app.get("/ui/sign-in", a.signedIn, async (req) => {
    const isIn = await a.sessionFor(req.raw).then(() => true, () => false);
    return isIn ? redirect(req.res, "/ui") : sendHtml(req.res, 200, renderSignIn());
  });
  app.post("/ui/sign-in", { bodyType: "form", body: z.object({ token: z.string().max(500).default("") }) }, async (req) => {
    checkOrigin(req.raw);
    try {
      const s = await openSession(sd, req.body.token.trim());
      return redirect(req.res, "/ui", { "set-cookie": setCookieHeader(s.cookie, s.expiresAt - ctx.now(), overTls(req.raw)) });
    } catch (e) {
      if (e instanceof BerthError && (e.code === "unauthorized" || e.code === "forbidden")) {
        const why = e.code === "forbidden" ? "This token's role (agent) cannot use the dashboard; sign in with a member, operator or admin token." : e.message.replace(/^unauthorized: /, "");
        return sendHtml(req.res, e.status, renderSignIn({ error: `Not signed in: ${why}` }));
      }
      throw e;
    }
  });
  app.post("/ui/sign-out", { ...a.withSession, bodyType: "form", body: z.object({ csrf: z.string().optional() }) }, async (req) => {
    checkCsrf(req.auth, req.body.csrf);
    await closeSession(sd, req.auth.hash);
    live.endSession(req.auth.hash);
    return redirect(req.res, "/ui/sign-in", { "set-cookie": setCookieHeader("", 0, overTls(req.raw)) });
  });
}

type PageBuild = (v: View, params: Record<string, Id>, q: URLSearchParams) => Promise<PageOut>;

/** The pages: each loads its data with the viewer's org-scoped reads and renders it. */
function addPages(app: HttpServer, ctx: Ctx, live: LiveChanges, a: UiAuth): void {
  const pages: Array<[string, PageBuild]> = [
    ["/ui", async (v) => ({ title: "Overview", current: "/ui", body: renderOverview(v, await loadOverview(ctx.store, v.principal)) })],
    ["/ui/pools/:pool", async (v, p, q) => ({ title: `Pool ${p.pool}`, current: "", body: renderPool(v, await loadPool(ctx.store, ctx.metrics, v.principal, p.pool!, windowOf(q.get("window")), v.now)) })],
    ["/ui/borrows", async (v) => ({ title: "Borrows and grants", current: "/ui/borrows", body: renderBorrows(v, await loadBorrows(ctx.store, v.principal)) })],
    ["/ui/allocations", async (v, _p, q) => ({ title: "Allocations", current: "/ui/allocations", body: renderAllocations(v, await loadAllocations(ctx, v.principal, { metrics: ctx.metrics, window: windowOf(q.get("window")), now: v.now })) })],
    ["/ui/machines/:machine", async (v, p) => ({ title: `Machine ${p.machine}`, current: "", body: renderMachine(v, await loadMachine(ctx.store, v.principal, p.machine!)) })],
    ["/ui/audit", async (v, _p, q) => ({ title: "Audit trail", current: "/ui/audit", body: renderAudit(v, await loadAudit(ctx.store, v.principal, auditFilterOf(q))) })],
    ["/ui/tokens", async (v) => ({ title: "API tokens", current: "/ui/tokens", body: renderTokens(v, await loadTokens(ctx.store, v.principal)) })],
  ];
  for (const [path, build] of pages) app.get(path, a.signedIn, (req) => answerPage({ ctx, live, a }, path, build, req));
}

/** A page: no session → the sign-in form; `?part=live` → the live region alone; a refusal → an error page. */
async function answerPage(d: { ctx: Ctx; live: LiveChanges; a: UiAuth }, path: string, build: PageBuild, req: { raw: IncomingMessage; res: ServerResponse; params: Record<string, Id> }) {
  const { ctx, live, a } = d;
  const { raw, res, params } = req;
  const started = process.hrtime.bigint();
  const part = query(raw).get("part") === "live";
  let s: Session;
  try {
    s = await a.sessionFor(raw);
  } catch (e) {
    if (part) return sendHtml(res, 401, renderSignIn(), { "hx-redirect": "/ui/sign-in" });
    if (e instanceof BerthError && e.code === "unauthorized") return redirect(res, "/ui/sign-in");
    throw e;
  }
  const self = (raw.url ?? path).split("?")[0]!;
  const q = query(raw);
  // The live region is re-fetched with the page's own choices (a window, filters), not its notice.
  const keep = new URLSearchParams([...q].filter(([k]) => k !== "part" && k !== "done" && k !== "id"));
  const liveUrl = keep.size ? `${self}?${keep.toString()}` : self;
  const v: View = { principal: s.principal, csrf: s.csrf, now: ctx.now(), here: self, tokenLabel: s.label };
  try {
    // The mark is read before the data, so a change after it is always reported.
    const mark = part ? "" : await live.digest(s.principal.org);
    const out = await build(v, params, q);
    const done = q.get("done");
    const notice = done !== null && Object.hasOwn(DONE, done) ? DONE[done as DoneKind](q.get("id") ?? "") : undefined;
    const html = part ? out.body : page(v, { title: out.title, current: out.current, live: liveUrl, mark, body: out.body, ...(notice ? { notice } : {}) });
    const bytes = Buffer.from(html.text, "utf8");
    // The server's share of the answer (session, change mark, reads, rendering, encoding), for operators and the bench.
    return sendHtml(res, 200, bytes, { "server-timing": `page;dur=${(Number(process.hrtime.bigint() - started) / 1e6).toFixed(2)}` });
  } catch (e) {
    return sendRefusal(res, e, v);
  }
}
