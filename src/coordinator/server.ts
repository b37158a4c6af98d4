/**
 * `startCoordinator`: the store, the HTTP API, the reconciler loop and the
 * providers, wired together. Used by `berth serve`, `berth up` and tests.
 */
import { createServer, type Server } from "node:http";
import { randomBytes as nodeRandomBytes, randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import pino, { type Logger } from "pino";
import type { Store } from "../store/store.js";
import { Metrics } from "./metrics.js";
import { DEFAULT_CONFIG, type CoordinatorConfig, type Ctx } from "./context.js";
import { buildRouter } from "./http/routes.js";
import { parseJson, readBody, send, sendError } from "./http/router.js";
import { ReconcilerLoop } from "./reconciler.js";
import { providerRegistry, type Provider } from "../providers/provider.js";
import { HostsProvider } from "../providers/hosts/hosts-provider.js";
import type { HostRow } from "./actions/hosts.js";
import { createPortable } from "./actions/grants.js";

export const VERSION = "0.1.0";

export interface CoordinatorOptions {
  store: Store;
  /** The coordinator's secret (host-call tokens are derived from it). */
  secret: Uint8Array;
  host?: string;
  port?: number;
  config?: Partial<CoordinatorConfig>;
  log?: Logger;
  now?: () => number;
  randomBytes?: (n: number) => Uint8Array;
  /** Extra providers (tests); `hosts` and `external` are always present. */
  providers?: Provider[];
  /** Reconciler interval in ms (a kick runs it at once too). */
  reconcileIntervalMs?: number;
  /** Start the reconciler loop (default true). */
  reconcile?: boolean;
}

export interface Coordinator {
  url: string;
  port: number;
  ctx: Ctx;
  loop: ReconcilerLoop;
  server: Server;
  stop(): Promise<void>;
}

export async function startCoordinator(o: CoordinatorOptions): Promise<Coordinator> {
  const log = o.log ?? pino({ level: process.env.BERTH_LOG_LEVEL ?? "info" });
  const metrics = new Metrics();
  const config: CoordinatorConfig = { ...DEFAULT_CONFIG, ...o.config };
  const hosts = new HostsProvider({
    secret: o.secret,
    host: (id) => o.store.transaction((tx) => tx.get<HostRow>("SELECT * FROM hosts WHERE id = ?", [id])),
  });
  let loop: ReconcilerLoop | null = null;
  const ctx: Ctx = {
    store: o.store,
    now: o.now ?? Date.now,
    randomBytes: o.randomBytes ?? ((n) => nodeRandomBytes(n)),
    metrics,
    log,
    actor: `c-${randomUUID().slice(0, 8)}`,
    config,
    providers: providerRegistry([hosts, ...(o.providers ?? [])]),
    kick: () => loop?.kick(),
  };
  loop = new ReconcilerLoop(ctx, o.reconcileIntervalMs ?? 250);
  const metricsText = async () => {
    const rows = await ctx.store.transaction((tx) => tx.all<{ pool: string; state: string; n: number }>("SELECT pool, state, COUNT(*) AS n FROM machines GROUP BY pool, state"));
    metrics.setMachineCounts(rows.map((r) => ({ ...r, n: Number(r.n) })));
    return metrics.registry.metrics();
  };
  const router = buildRouter({ ctx, secret: o.secret, metricsText, portable: config.portable ? createPortable(ctx) : null, version: VERSION });
  const server = createServer((req, res) => {
    const url = req.url ?? "/";
    const q = url.indexOf("?");
    const path = q < 0 ? url : url.slice(0, q);
    const m = router.match(req.method ?? "GET", path);
    if ("error" in m) {
      req.resume();
      sendError(res, m.error, log);
      return;
    }
    readBody(req)
      .then(async (buf) => {
        const reply = await m.handler({ method: req.method ?? "GET", params: m.params, headers: req.headers, body: parseJson(buf), raw: req });
        send(res, reply);
      })
      .catch((e: unknown) => sendError(res, e, log));
  });
  server.keepAliveTimeout = 65_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port ?? 0, o.host ?? "127.0.0.1", () => resolve());
  });
  const addr = server.address() as AddressInfo;
  if (o.reconcile !== false) loop.start();
  const host = addr.family === "IPv6" ? `[${addr.address}]` : addr.address;
  return {
    url: `http://${host}:${addr.port}`,
    port: addr.port,
    ctx,
    loop,
    server,
    async stop() {
      await loop!.stop();
      await new Promise<void>((r) => {
        server.close(() => r());
        server.closeAllConnections();
      });
    },
  };
}
