/**
 * Prometheus metrics. Labels are bounded: pool names (operator-chosen, few),
 * machine states (closed set), outcomes (closed set). Never a token, key,
 * borrow id or repository label.
 */
import client from "prom-client";
import { HistoryRecorder } from "./history.js";

export const LATENCY_BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1];
export const READY_AGE_BUCKETS = [0.1, 1, 10, 60, 300, 1800, 3600, 14400];

/** One histogram's figures: per-bucket counts (not cumulative; the last is above every bound), sum and count. */
export interface HistogramFigures {
  bounds: readonly number[];
  counts: number[];
  sum: number;
  count: number;
}

/** Histograms keyed by (org, pool), in this process's memory, with fixed bounds (those of the exported histogram). */
export class PoolHistograms {
  readonly #byPool = new Map<string, HistogramFigures>();
  constructor(readonly bounds: readonly number[]) {}

  observe(org: string, pool: string, v: number): void {
    const key = `${org}\0${pool}`;
    let h = this.#byPool.get(key);
    if (!h) this.#byPool.set(key, (h = { bounds: this.bounds, counts: new Array<number>(this.bounds.length + 1).fill(0), sum: 0, count: 0 }));
    let i = this.bounds.findIndex((b) => v <= b);
    if (i < 0) i = this.bounds.length;
    h.counts[i]!++;
    h.sum += v;
    h.count++;
  }

  figures(org: string, pool: string): HistogramFigures {
    const h = this.#byPool.get(`${org}\0${pool}`);
    return h ? { ...h, counts: [...h.counts] } : { bounds: this.bounds, counts: new Array<number>(this.bounds.length + 1).fill(0), sum: 0, count: 0 };
  }
}

/** One owner's use and budget, named by its token's label (metrics never carry token ids). */
export interface OwnerUse {
  org: string;
  label: string | null;
  used: { vcpu: number; memoryMib: number; count: number };
  budget: { vcpu: number; memoryMib: number; count: number };
}

export class Metrics {
  readonly registry = new client.Registry();
  readonly borrowRequests = new client.Counter({ name: "berth_borrow_requests_total", help: "Borrow requests by pool, access and outcome", labelNames: ["pool", "access", "outcome"], registers: [this.registry] });
  readonly warm = new client.Counter({ name: "berth_borrow_warm_total", help: "Borrows served from a ready machine (hit) or refused for lack of one (miss)", labelNames: ["pool", "result"], registers: [this.registry] });
  readonly claims = new client.Counter({ name: "berth_fill_claims_total", help: "Fill claims by event: created, completed, expired", labelNames: ["pool", "event"], registers: [this.registry] });
  readonly heartbeats = new client.Counter({ name: "berth_heartbeats_total", help: "Borrow heartbeats by outcome", labelNames: ["outcome"], registers: [this.registry] });
  readonly quarantined = new client.Counter({ name: "berth_machines_quarantined_total", help: "Machines quarantined, by reason class", labelNames: ["pool", "reason"], registers: [this.registry] });
  readonly provisionBreakerTrips = new client.Counter({ name: "berth_provision_breaker_trips_total", help: "Times a pool's provisioning circuit breaker opened (N provisions given up in a row)", labelNames: ["pool"], registers: [this.registry] });
  readonly placementBreakerTrips = new client.Counter({
    name: "berth_provision_placement_breaker_trips_total",
    help: "Times a pool's breaker for one placement opened (N provisions launched there given up in a row; for aws the placement is region/instance type/subnet)",
    labelNames: ["pool", "placement"],
    registers: [this.registry],
  });
  readonly machinesLost = new client.Counter({ name: "berth_machines_lost_total", help: "Ready or lent machines retired because the ready check found their resource gone (terminated or stopped outside berth) or impaired", labelNames: ["pool", "verdict"], registers: [this.registry] });
  readonly pruned = new client.Counter({ name: "berth_records_pruned_total", help: "Terminal records pruned after retention", labelNames: ["kind"], registers: [this.registry] });
  readonly grants = new client.Counter({ name: "berth_grants_total", help: "Portable grant events: issued, acked, active, expired, revoked, fence_failed, revoke_failed", labelNames: ["pool", "event"], registers: [this.registry] });
  readonly ttlRotations = new client.Counter({ name: "berth_ttl_rotations_total", help: "Ready machines rotated out before their hard TTL", labelNames: ["pool"], registers: [this.registry] });
  readonly operations = new client.Counter({ name: "berth_operations_total", help: "Provider operations by kind and outcome", labelNames: ["kind", "outcome"], registers: [this.registry] });
  readonly reconcileVisits = new client.Counter({ name: "berth_reconcile_due_rows_total", help: "Due-index rows visited by the reconciler", registers: [this.registry] });
  readonly borrowLatency = new client.Histogram({ name: "berth_borrow_latency_seconds", help: "Server-side borrow latency", labelNames: ["access"], buckets: LATENCY_BUCKETS, registers: [this.registry] });
  readonly lendCheck = new client.Histogram({
    name: "berth_lend_check_seconds",
    help: "Passed lend-time network checks of keeper borrows, by part: total (the coordinator's request to the agent, answer read), agent (the agent's own time, as it reported it)",
    labelNames: ["part"],
    buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5],
    registers: [this.registry],
  });
  readonly readyAge = new client.Histogram({ name: "berth_ready_queue_age_seconds", help: "How long the borrowed machine waited in the ready queue", buckets: READY_AGE_BUCKETS, registers: [this.registry] });
  /** The same two histograms per (org, pool), for the dashboard's pool charts; never exported (an org's figures are shown to it alone). */
  readonly poolLatency = new PoolHistograms(LATENCY_BUCKETS);
  readonly poolReadyAge = new PoolHistograms(READY_AGE_BUCKETS);
  /** Borrows served and returned per pool and 10-second bucket, for the dashboard's history (written to the store every 10 s). */
  readonly history = new HistoryRecorder(LATENCY_BUCKETS);
  readonly clientReports = new client.Histogram({ name: "berth_client_report_seconds", help: "Client-reported timings (telemetry only, never proof): first_command, scrub", labelNames: ["kind"], buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5], registers: [this.registry] });
  readonly networkProbes = new client.Counter({ name: "berth_network_probes_total", help: "Network readiness probes reported by agents, by outcome: pass, fail, missing", labelNames: ["pool", "outcome"], registers: [this.registry] });
  readonly machines = new client.Gauge({ name: "berth_machines", help: "Machines by pool and state", labelNames: ["pool", "state"], registers: [this.registry] });

  readonly hostIdentitySteps = new client.Counter({ name: "berth_host_identity_steps_total", help: "Host identity switch steps recorded: preparing, prepared, committed, active, enrolled_active", labelNames: ["step"], registers: [this.registry] });
  readonly hostIdentityRefusals = new client.Counter({ name: "berth_host_identity_refusals_total", help: "Host identity refusals by code: host_activated, host_busy, proof_invalid, agent_unavailable", labelNames: ["code"], registers: [this.registry] });
  readonly stoppedReports = new client.Counter({ name: "berth_host_stopped_reports_total", help: "Stopped reports from switching hosts by outcome: taken, moot, ignored", labelNames: ["outcome"], registers: [this.registry] });
  readonly httpRefusals = new client.Counter({ name: "berth_http_refusals_total", help: "Connections and requests refused before any token was looked at, by reason: connections (the total cap), connections_per_address, rate (unauthenticated routes)", labelNames: ["reason"], registers: [this.registry] });
  readonly httpConnections = new client.Gauge({ name: "berth_http_connections", help: "Open HTTP connections of the API (at the scrape)", registers: [this.registry] });
  readonly allocationRefusals = new client.Counter({ name: "berth_allocation_refusals_total", help: "Allocation creates refused, by reason: budget_exhausted, no_capacity, not_admitted", labelNames: ["reason"], registers: [this.registry] });
  readonly allocations = new client.Gauge({ name: "berth_allocations", help: "Allocations by state", labelNames: ["state"], registers: [this.registry] });
  readonly ownerUse = new client.Gauge({
    name: "berth_allocation_budget_used_ratio",
    help: "Share of the budgets in use of the owners whose API tokens carry one label, per organisation and dimension (owner is the token's label, or 'unlabelled'; never a token id)",
    labelNames: ["org", "owner", "dimension"],
    registers: [this.registry],
  });

  /** A machine quarantined: the exported counter (by reason class) and the pool's history. */
  machineQuarantined(o: { org: string; pool: string }, reason: string, at: number): void {
    this.quarantined.inc({ pool: o.pool, reason });
    this.history.quarantined(o.org, o.pool, at, reason);
  }

  /** One served borrow: the exported histograms and the pool's own. */
  observeBorrow(o: { org: string; pool: string; access: "keeper" | "portable"; latencySeconds: number; readyAgeSeconds: number | null; at: number }): void {
    this.borrowLatency.observe({ access: o.access }, o.latencySeconds);
    this.poolLatency.observe(o.org, o.pool, o.latencySeconds);
    this.history.borrowed(o.org, o.pool, o.at, o.latencySeconds);
    if (o.readyAgeSeconds !== null) {
      this.readyAge.observe(o.readyAgeSeconds);
      this.poolReadyAge.observe(o.org, o.pool, o.readyAgeSeconds);
    }
  }
  readonly allocationSandboxDeaths = new client.Counter({ name: "berth_allocation_sandbox_deaths_total", help: "Ready allocations whose sandbox was found dead (moved to failed)", registers: [this.registry] });
  readonly allocationRestarts = new client.Counter({ name: "berth_allocation_restarts_total", help: "Restarts of failed allocations by outcome", labelNames: ["outcome"], registers: [this.registry] });
  readonly allocationReady = new client.Histogram({ name: "berth_allocation_create_to_ready_seconds", help: "From an allocation's create to its sandbox running with its key installed (ready)", buckets: [0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300], registers: [this.registry] });

  /** Set before each scrape from the store (collect hook). */
  setMachineCounts(rows: { pool: string; state: string; n: number }[]): void {
    this.machines.reset();
    for (const r of rows) this.machines.set({ pool: r.pool, state: r.state }, r.n);
  }

  /** Allocation counts, and owners' use grouped by (org, token label): the ratio is the group's use over its budgets. */
  setAllocationCounts(states: { state: string; n: number }[], owners: OwnerUse[]): void {
    this.allocations.reset();
    for (const r of states) this.allocations.set({ state: r.state }, r.n);
    this.ownerUse.reset();
    const groups = new Map<string, { org: string; owner: string; used: [number, number, number]; budget: [number, number, number] }>();
    for (const o of owners) {
      const owner = o.label ?? "unlabelled";
      const key = `${o.org}\0${owner}`;
      let g = groups.get(key);
      if (!g) groups.set(key, (g = { org: o.org, owner, used: [0, 0, 0], budget: [0, 0, 0] }));
      g.used[0] += o.used.vcpu;
      g.used[1] += o.used.memoryMib;
      g.used[2] += o.used.count;
      g.budget[0] += o.budget.vcpu;
      g.budget[1] += o.budget.memoryMib;
      g.budget[2] += o.budget.count;
    }
    for (const g of groups.values()) {
      (["vcpu", "memory", "count"] as const).forEach((dimension, i) => this.ownerUse.set({ org: g.org, owner: g.owner, dimension }, g.budget[i]! > 0 ? g.used[i]! / g.budget[i]! : 0));
    }
  }

}
