/**
 * Prometheus metrics. Labels are bounded: pool names (operator-chosen, few),
 * machine states (closed set), outcomes (closed set). Never a token, key,
 * borrow id or repository label.
 */
import client from "prom-client";

export class Metrics {
  readonly registry = new client.Registry();
  readonly borrowRequests = new client.Counter({ name: "berth_borrow_requests_total", help: "Borrow requests by pool, access and outcome", labelNames: ["pool", "access", "outcome"], registers: [this.registry] });
  readonly warm = new client.Counter({ name: "berth_borrow_warm_total", help: "Borrows served from a ready machine (hit) or refused for lack of one (miss)", labelNames: ["pool", "result"], registers: [this.registry] });
  readonly claims = new client.Counter({ name: "berth_fill_claims_total", help: "Fill claims by event: created, completed, expired", labelNames: ["pool", "event"], registers: [this.registry] });
  readonly heartbeats = new client.Counter({ name: "berth_heartbeats_total", help: "Borrow heartbeats by outcome", labelNames: ["outcome"], registers: [this.registry] });
  readonly quarantined = new client.Counter({ name: "berth_machines_quarantined_total", help: "Machines quarantined, by reason class", labelNames: ["pool", "reason"], registers: [this.registry] });
  readonly pruned = new client.Counter({ name: "berth_records_pruned_total", help: "Terminal records pruned after retention", labelNames: ["kind"], registers: [this.registry] });
  readonly grants = new client.Counter({ name: "berth_grants_total", help: "Portable grant events: issued, acked, active, expired, revoked, fence_failed, revoke_failed", labelNames: ["pool", "event"], registers: [this.registry] });
  readonly ttlRotations = new client.Counter({ name: "berth_ttl_rotations_total", help: "Ready machines rotated out before their hard TTL", labelNames: ["pool"], registers: [this.registry] });
  readonly operations = new client.Counter({ name: "berth_operations_total", help: "Provider operations by kind and outcome", labelNames: ["kind", "outcome"], registers: [this.registry] });
  readonly reconcileVisits = new client.Counter({ name: "berth_reconcile_due_rows_total", help: "Due-index rows visited by the reconciler", registers: [this.registry] });
  readonly borrowLatency = new client.Histogram({ name: "berth_borrow_latency_seconds", help: "Server-side borrow latency", labelNames: ["access"], buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1], registers: [this.registry] });
  readonly readyAge = new client.Histogram({ name: "berth_ready_queue_age_seconds", help: "How long the borrowed machine waited in the ready queue", buckets: [0.1, 1, 10, 60, 300, 1800, 3600, 14400], registers: [this.registry] });
  readonly clientReports = new client.Histogram({ name: "berth_client_report_seconds", help: "Client-reported timings (telemetry only, never proof): first_command, scrub", labelNames: ["kind"], buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5], registers: [this.registry] });
  readonly machines = new client.Gauge({ name: "berth_machines", help: "Machines by pool and state", labelNames: ["pool", "state"], registers: [this.registry] });

  readonly hostIdentitySteps = new client.Counter({ name: "berth_host_identity_steps_total", help: "Host identity switch steps recorded: preparing, prepared, committed, active, enrolled_active", labelNames: ["step"], registers: [this.registry] });
  readonly hostIdentityRefusals = new client.Counter({ name: "berth_host_identity_refusals_total", help: "Host identity refusals by code: host_activated, host_busy, proof_invalid, agent_unavailable", labelNames: ["code"], registers: [this.registry] });
  readonly stoppedReports = new client.Counter({ name: "berth_host_stopped_reports_total", help: "Stopped reports from switching hosts by outcome: taken, moot, ignored", labelNames: ["outcome"], registers: [this.registry] });
  readonly allocationRefusals = new client.Counter({ name: "berth_allocation_refusals_total", help: "Allocation creates refused, by reason: budget_exhausted, no_capacity, not_admitted", labelNames: ["reason"], registers: [this.registry] });
  readonly allocations = new client.Gauge({ name: "berth_allocations", help: "Allocations by state", labelNames: ["state"], registers: [this.registry] });
  readonly ownerUse = new client.Gauge({ name: "berth_allocation_budget_used_ratio", help: "Share of each owner's budget in use, by dimension (owner is an API token id, never a secret)", labelNames: ["owner", "dimension"], registers: [this.registry] });

  /** Set before each scrape from the store (collect hook). */
  setMachineCounts(rows: { pool: string; state: string; n: number }[]): void {
    this.machines.reset();
    for (const r of rows) this.machines.set({ pool: r.pool, state: r.state }, r.n);
  }

  setAllocationCounts(states: { state: string; n: number }[], owners: { owner: string; vcpu: number; memory: number; count: number }[]): void {
    this.allocations.reset();
    for (const r of states) this.allocations.set({ state: r.state }, r.n);
    this.ownerUse.reset();
    for (const o of owners) for (const dim of ["vcpu", "memory", "count"] as const) this.ownerUse.set({ owner: o.owner, dimension: dim }, o[dim]);
  }
}
