/**
 * A loopback HTTP proxy between a coordinator and an agent that holds,
 * delays, drops or reorders chosen agent calls, the way a slow or lossy
 * network does. It is a fault injector: every call it lets through reaches
 * the real agent byte for byte (method, path, headers, body), and the real
 * agent's answer goes back.
 *
 * A rule names the calls it applies to (`match` over the parsed call: method,
 * path, and for `POST /v1/agent/ops` the operation's kind and id) and what
 * happens to them:
 *   pass    forwarded at once (also every call no rule matches);
 *   hold    kept until the test releases it (`held()`), then forwarded — also
 *           when the caller has gone away meanwhile (a late call of a dead
 *           coordinator still reaches the agent); releasing held calls in any
 *           order reorders them;
 *   delay   forwarded after `ms`;
 *   drop    never forwarded; the caller's connection is cut (no answer);
 *   lose    forwarded, the agent acts, and the answer is lost (connection cut);
 *   rewrite forwarded, the agent acts, and its JSON answer is replaced by
 *           `body(answer)` (an agent of another version, a corrupting hop).
 * Rules are tried in order; a rule with `times` applies that many times.
 *
 * Point the coordinator at it by giving it the proxy's URL as the host's
 * agent address (AllocRig.routeAgentThrough).
 */
import { createServer, request as httpRequest, type IncomingHttpHeaders, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface AgentCallView {
  method: string;
  path: string;
  /** The operation kind and id of a `POST /v1/agent/ops`. */
  kind?: string;
  opId?: string;
  generation?: number;
  body: unknown;
}

export type ProxyAction = { kind: "pass" } | { kind: "hold" } | { kind: "delay"; ms: number } | { kind: "drop" } | { kind: "lose" } | { kind: "rewrite"; body: (answer: unknown) => unknown };

export interface ProxyRule {
  match: (c: AgentCallView) => boolean;
  action: ProxyAction;
  /** How many calls it applies to (default: every matching call). */
  times?: number;
}

export interface Answer {
  status: number;
  body: unknown;
}

export interface HeldCall {
  call: AgentCallView;
  /** Forwards the call now; resolves with the agent's answer (also when the caller is gone). */
  release(): Promise<Answer>;
  /** Never forwards it; the caller (if still there) sees its connection cut. */
  drop(): void;
}

export interface AgentProxy {
  url: string;
  /** Where calls go; may be set (or changed, e.g. after an agent restart) at any time. */
  target: string;
  rule(r: ProxyRule): void;
  clearRules(): void;
  /** Every call seen, in arrival order. */
  readonly seen: AgentCallView[];
  /** Waits until a held call matching `match` is there (and not yet released) and returns it. */
  held(match: (c: AgentCallView) => boolean, timeoutMs?: number): Promise<HeldCall>;
  close(): Promise<void>;
}

interface Pending extends HeldCall {
  taken: boolean;
}

export async function startAgentProxy(target = ""): Promise<AgentProxy> {
  const rules: { r: ProxyRule; left: number }[] = [];
  const seen: AgentCallView[] = [];
  const pending: Pending[] = [];
  const waiters = new Set<() => boolean>();
  const wake = () => waiters.forEach((w) => w());
  const state = { target };

  const forward = (method: string, path: string, headers: IncomingHttpHeaders, body: Buffer): Promise<{ status: number; headers: IncomingHttpHeaders; body: Buffer }> =>
    new Promise((resolve, reject) => {
      const t = new URL(state.target);
      const h = { ...headers, host: t.host };
      delete h.connection;
      const up = httpRequest({ host: t.hostname, port: Number(t.port), method, path, headers: h }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on("error", reject);
      });
      up.on("error", reject);
      up.end(body);
    });

  const answer = (res: ServerResponse, a: { status: number; headers: IncomingHttpHeaders; body: Buffer }) => {
    if (res.destroyed || res.writableEnded) return;
    const h = { ...a.headers };
    delete h.connection;
    delete h["transfer-encoding"];
    h["content-length"] = String(a.body.length);
    res.writeHead(a.status, h);
    res.end(a.body);
  };
  const cut = (res: ServerResponse) => res.socket?.destroy();
  const parsed = (b: Buffer): unknown => {
    try {
      return JSON.parse(b.toString("utf8"));
    } catch {
      return b.toString("utf8");
    }
  };

  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const method = req.method ?? "GET";
      const path = req.url ?? "/";
      const json = parsed(body) as { kind?: string; opId?: string; generation?: number } | null;
      const isOp = method === "POST" && path === "/v1/agent/ops" && json !== null && typeof json === "object";
      const view: AgentCallView = { method, path, body: json, ...(isOp ? { kind: json.kind, opId: json.opId, generation: json.generation } : {}) };
      seen.push(view);
      const hit = rules.find((x) => x.left > 0 && x.r.match(view));
      if (hit) hit.left--;
      const action = hit?.r.action ?? { kind: "pass" };
      const go = () => forward(method, path, req.headers, body);
      const relay = () => go().then((a) => answer(res, a), () => cut(res));
      switch (action.kind) {
        case "pass":
          void relay();
          return;
        case "delay":
          setTimeout(() => void relay(), action.ms);
          return;
        case "drop":
          cut(res);
          return;
        case "lose":
          void go().then(() => cut(res), () => cut(res));
          return;
        case "rewrite":
          void go().then((a) => answer(res, { ...a, body: Buffer.from(JSON.stringify(action.body(parsed(a.body)))) }), () => cut(res));
          return;
        case "hold": {
          const p: Pending = {
            call: view,
            taken: false,
            release: async () => {
              const a = await go();
              answer(res, a);
              return { status: a.status, body: parsed(a.body) };
            },
            drop: () => cut(res),
          };
          pending.push(p);
          wake();
          return;
        }
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

  return {
    url,
    get target() {
      return state.target;
    },
    set target(t: string) {
      state.target = t;
    },
    rule: (r) => rules.push({ r, left: r.times ?? Number.POSITIVE_INFINITY }),
    clearRules: () => void rules.splice(0),
    seen,
    held: (match, timeoutMs = 30_000) =>
      new Promise<HeldCall>((resolve, reject) => {
        const look = () => {
          const p = pending.find((x) => !x.taken && match(x.call));
          if (!p) return false;
          p.taken = true;
          waiters.delete(look);
          clearTimeout(timer);
          resolve(p);
          return true;
        };
        const timer = setTimeout(() => {
          waiters.delete(look);
          reject(new Error(`no held agent call matched within ${timeoutMs} ms; seen: ${seen.map((s) => s.opId ?? `${s.method} ${s.path}`).join(", ")}`));
        }, timeoutMs);
        if (!look()) waiters.add(look);
      }),
    close: () =>
      new Promise<void>((r) => {
        for (const p of pending) if (!p.taken) p.drop();
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
