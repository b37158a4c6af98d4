/**
 * `startCoordinator`: the store, the HTTP API, the reconciler loop and the
 * providers, wired together. Used by `berth serve`, `berth up` and tests.
 */
import type { Server } from "node:http";
import { randomBytes as nodeRandomBytes, randomUUID } from "node:crypto";
import pino, { type Logger } from "pino";
import type { Store } from "../store/store.js";
import { Metrics } from "./metrics.js";
import { HISTORY_BUCKET_MS } from "../store/history.js";
import { DEFAULT_CONFIG, type CoordinatorConfig, type Ctx } from "./context.js";
import { addRoutes } from "./http/routes.js";
import { createHttpServer } from "../http/server.js";
import type { HttpLimits } from "../http/admission.js";
import { Reconciler } from "./reconciler.js";
import { ReconcilerLoop } from "./reconciler-loop.js";
import { OperationExecutor } from "./executor.js";
import { providerRegistry, type Provider } from "../providers/provider.js";
import { HostsProvider } from "../providers/hosts/hosts-provider.js";
import { readHostCommitted } from "../store/hosts.js";
import { machineCounts } from "../store/machines.js";
import { liveAllocationCounts } from "../store/allocations.js";
import { allOwners } from "../store/allocation-owners.js";
import { grantHooks } from "./actions/grants.js";
import { createPortable } from "./actions/grant-calls.js";
import { registerProvisioned } from "./actions/register.js";
import type { PortableApi } from "./actions/portable-api.js";
import { VERSION } from "../core/version.js";
import { addUiRoutes, type UiOptions } from "./ui/routes.js";
import { AllocationAgent } from "./allocation-agent.js";
import { AllocationWorker, pauseForTestAt } from "./allocation-worker.js";
import { startReadyCheck } from "./ready-check.js";

export { VERSION };

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
  /** The dashboard at /ui (sessions, live stream). */
  ui?: UiOptions;
  /** When set, `GET /metrics` needs `Authorization: Bearer <token>` with the token whose `hashToken("api", …)` this is. */
  metricsTokenHash?: string | null;
  /** HTTP timeouts, connection caps and the unauthenticated rate (docs/operations.md); unset fields take the defaults. */
  httpLimits?: Partial<HttpLimits>;
}

export interface Coordinator {
  url: string;
  port: number;
  ctx: Ctx;
  /** Carries out durable provider operations (tests drive it step by step). */
  executor: OperationExecutor;
  /** Visits due rows (tests drive it step by step; `loop` runs it in the background). */
  reconciler: Reconciler;
  /** Allocation launches and cleanups. */
  allocations: AllocationWorker;
  /** Calls to agents about allocations (volumes, holds). */
  allocationAgent: AllocationAgent;
  /** The portable access surface, when enabled. */
  portable: PortableApi | null;
  loop: ReconcilerLoop;
  server: Server;
  /** Every HTTP route this coordinator serves (method and `/path/:param`). */
  routes(): Array<{ method: string; path: string }>;
  stop(): Promise<void>;
}

/**
 * Its steps, in the order of the dependency graph: the context (store, clock,
 * log, metrics, config, providers), the workers (executor, portable API,
 * allocation calls and worker, reconciler), the HTTP API and dashboard, then
 * listening, the reconciler loop, the history writer and the ready check.
 */
export async function startCoordinator(o: CoordinatorOptions): Promise<Coordinator> {
  const hosts = new HostsProvider({
    secret: o.secret,
    host: (id) => readHostCommitted(o.store, id),
  });
  let loop: ReconcilerLoop | null = null;
  const ctx = coordinatorContext(o, hosts, () => loop?.kick());
  const { executor, portable, allocationAgent, allocations, reconciler } = coordinatorWorkers(ctx, hosts);
  loop = new ReconcilerLoop(reconciler, o.reconcileIntervalMs ?? 250);
  const { app, ui } = coordinatorApi(o, ctx, portable, allocationAgent);
  const { url, port } = await app.listen(o.host ?? "127.0.0.1", o.port ?? 0);
  if (o.reconcile !== false) loop.start();
  const history = startHistory(ctx);
  const checked = (o.providers ?? []).filter((p) => p.checkMachines).map((p) => p.name);
  const readyCheck = o.reconcile !== false && checked.length > 0 && ctx.config.readyCheckMs > 0 ? startReadyCheck(ctx, checked, ctx.config.readyCheckMs) : null;
  return {
    url,
    port,
    ctx,
    executor,
    reconciler,
    allocations,
    allocationAgent,
    portable,
    loop,
    server: app.server,
    routes: () => app.routes(),
    async stop() {
      await readyCheck?.stop();
      await loop!.stop();
      await history.stop();
      ui.stop();
      await allocations.idle();
      await app.close();
    },
  };
}

/** Step 1: what every part is given (store, clock, randomness, metrics, log, this process's actor id, config, providers, a kick of the reconciler). */
function coordinatorContext(o: CoordinatorOptions, hosts: HostsProvider, kick: () => void): Ctx {
  return {
    store: o.store,
    now: o.now ?? Date.now,
    randomBytes: o.randomBytes ?? pooledRandomBytes(),
    metrics: new Metrics(),
    log: o.log ?? pino({ level: process.env.BERTH_LOG_LEVEL ?? "info" }),
    actor: `c-${randomUUID().slice(0, 8)}`,
    config: { ...DEFAULT_CONFIG, ...o.config },
    providers: providerRegistry([hosts, ...(o.providers ?? [])]),
    kick,
  };
}

/**
 * Step 2. The order of construction is the dependency graph: the executor is given
 * the grant and registration steps its proofs drive; the portable API (the
 * ack runs the install it leased) and the reconciler are given the executor.
 */
function coordinatorWorkers(ctx: Ctx, hosts: HostsProvider) {
  const executor = new OperationExecutor({
    ctx,
    grants: grantHooks(ctx),
    registerProvisioned: (tx, m, found, now) => registerProvisioned(tx, ctx, m, found, now),
  });
  const portable = ctx.config.portable ? createPortable(ctx, { runLeased: (s, read) => executor.execute(s, read) }) : null;
  const allocationAgent = new AllocationAgent((hostId, method, path, body) => hosts.agentCall(hostId, method, path, body));
  const allocations = new AllocationWorker({ ctx, agent: allocationAgent, pauseAt: pauseForTestAt });
  const reconciler = new Reconciler({ ctx, executor, allocations });
  return { executor, portable, allocationAgent, allocations, reconciler };
}

/** Step 3: the HTTP API (refusals counted, `/metrics` text) and the dashboard, not yet listening. */
function coordinatorApi(o: CoordinatorOptions, ctx: Ctx, portable: PortableApi | null, allocationAgent: AllocationAgent) {
  const { metrics, log } = ctx;
  let openConnections = () => 0;
  const metricsText = async () => {
    metrics.httpConnections.set(openConnections());
    metrics.setMachineCounts(await ctx.store.transaction((tx) => machineCounts(tx)));
    const alloc = await ctx.store.transaction(async (tx) => ({ states: await liveAllocationCounts(tx), owners: await allOwners(tx) }));
    metrics.setAllocationCounts(alloc.states, alloc.owners);
    return metrics.registry.metrics();
  };
  const app = createHttpServer({
    log,
    internalMessage: "internal: the coordinator failed to handle this request; see its log",
    ...(o.httpLimits ? { limits: o.httpLimits } : {}),
    onRefused: (reason) => metrics.httpRefusals.inc({ reason }),
  });
  openConnections = () => app.connections();
  addRoutes(app, { ctx, secret: o.secret, metricsText, metricsTokenHash: o.metricsTokenHash ?? null, portable, version: VERSION, allocationAgent });
  const ui = addUiRoutes(app, ctx, { ...o.ui, sandboxProbe: (h, a) => allocationAgent.sandbox(h, a) });
  return { app, ui };
}

/** Step 4: the dashboard's history: closed 10-second buckets are written every 10 s (the open one at the stop). */
function startHistory(ctx: Ctx): { stop(): Promise<void> } {
  const writeHistory = (all: boolean) =>
    ctx.metrics.history.flush(ctx.store, ctx.actor, ctx.now(), all).catch((e: unknown) => ctx.log.warn({ err: e }, "history: buckets not written; kept in memory for the next try"));
  const historyTimer = setInterval(() => void writeHistory(false), HISTORY_BUCKET_MS);
  historyTimer.unref();
  return {
    async stop() {
      clearInterval(historyTimer);
      await writeHistory(true);
    },
  };
}

/**
 * Bytes of the CSPRNG drawn 4 KiB at a time: a keeper borrow needs 52 (its id
 * and token), and one call into OpenSSL per borrow cost more than the rest of
 * its id and token making. Each answer is a view of a buffer that is never
 * written again (a refill is a new buffer).
 */
function pooledRandomBytes(): (n: number) => Uint8Array {
  let pool = Buffer.alloc(0);
  let at = 0;
  return (n) => {
    if (n > 1024) return nodeRandomBytes(n);
    if (at + n > pool.length) {
      pool = nodeRandomBytes(4096);
      at = 0;
    }
    at += n;
    return pool.subarray(at - n, at);
  };
}
