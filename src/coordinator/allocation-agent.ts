/**
 * The coordinator's calls to an agent about allocations: the three
 * allocation operations (with the same ambiguity rules as machine
 * operations: 4xx = refused and nothing changed, 5xx / no answer / a result
 * off contract = ambiguous, retried with the same operation id), the hold
 * observation a replacement launch actor decides on, and the volume routes
 * `berth volume …` reaches through the coordinator.
 */
import { parseOperationResult, type AllocOperationKind, type OperationResults } from "../protocol/operations.js";
import type { HoldObservation } from "../core/allocation-takeover.js";
import { BerthError } from "../core/errors.js";

/** What the hosts provider gives: one authenticated call to a host's agent (throws when it does not answer). */
export type AgentCall = (hostId: string, method: "GET" | "POST", path: string, body?: unknown) => Promise<{ status: number; body: unknown }>;

export type SandboxObservation = { kind: "running" } | { kind: "dead"; why: string } | { kind: "unreadable"; why: string };

export type AllocAnswer<K extends AllocOperationKind> =
  | { kind: "done"; result: OperationResults[K] }
  | { kind: "refused"; code: string; error: string }
  | { kind: "ambiguous"; error: string };

interface ErrorBody {
  error?: { code?: string; message?: string };
  result?: unknown;
}

export class AllocationAgent {
  constructor(private readonly call: AgentCall) {}

  async op<K extends AllocOperationKind>(hostId: string, kind: K, opId: string, machineId: string, generation: number, args: Record<string, unknown>): Promise<AllocAnswer<K>> {
    let r: { status: number; body: unknown };
    try {
      r = await this.call(hostId, "POST", "/v1/agent/ops", { opId, kind, machineId, generation, args });
    } catch (e) {
      return { kind: "ambiguous", error: `the agent did not answer: ${e instanceof Error ? e.message : String(e)}` };
    }
    const body = (r.body ?? {}) as ErrorBody;
    if (r.status >= 200 && r.status < 300) {
      const result = parseOperationResult(kind, body.result);
      return result === null ? { kind: "ambiguous", error: `the agent's ${kind} result does not match the contract` } : { kind: "done", result };
    }
    const msg = body.error?.message ?? `agent answered ${r.status}`;
    if (r.status >= 500) return { kind: "ambiguous", error: msg };
    return { kind: "refused", code: body.error?.code ?? "refused", error: msg };
  }

  /**
   * A fresh look at the allocation's hold on its host: never "absent" unless
   * the agent said so. With `floor` (core/allocation-takeover.ts
   * `fenceFloor`) the agent, finding no hold held, raises the allocation's
   * generation floor to it durably before answering.
   */
  async observeHold(hostId: string, allocationId: string, floor: number | null = null): Promise<HoldObservation> {
    let r: { status: number; body: unknown };
    const path = `/v1/agent/holds/${encodeURIComponent(allocationId)}`;
    try {
      r = floor === null ? await this.call(hostId, "GET", path) : await this.call(hostId, "POST", `${path}/observe`, { floor });
    } catch (e) {
      return { kind: "unreadable", why: `the agent did not answer: ${e instanceof Error ? e.message : String(e)}` };
    }
    const body = r.body as { state?: string; generation?: number; allocationId?: string; error?: { code?: string } };
    if (floor !== null && r.status === 404) return { kind: "unreadable", why: "the agent cannot raise a generation floor (an agent older than this coordinator): upgrade it" };
    if (r.status === 404 && body.error?.code === "not_found") return { kind: "absent" };
    if (r.status === 200 && typeof body.generation === "number") {
      // A released or fenced hold holds nothing: for the takeover it is absent (and the agent refuses any hold below it).
      return body.state === "held" ? { kind: "present", allocationId: body.allocationId ?? allocationId, generation: body.generation } : { kind: "absent" };
    }
    return { kind: "unreadable", why: `agent answered ${r.status}` };
  }

  /** Whether the allocation's sandbox runs on its host, asked of the agent's runtime now (never "stopped" unless the agent said so). */
  async sandbox(hostId: string, allocationId: string): Promise<SandboxObservation> {
    let r: { status: number; body: unknown };
    try {
      r = await this.call(hostId, "GET", `/v1/agent/holds/${encodeURIComponent(allocationId)}/sandbox`);
    } catch (e) {
      return { kind: "unreadable", why: `the agent did not answer: ${e instanceof Error ? e.message : String(e)}` };
    }
    const body = r.body as { sandbox?: string; why?: string | null };
    if (r.status !== 200 || typeof body.sandbox !== "string") return { kind: "unreadable", why: `agent answered ${r.status}` };
    if (body.sandbox === "running") return { kind: "running" };
    if (body.sandbox === "stopped" || body.sandbox === "mismatch") return { kind: "dead", why: body.why ?? body.sandbox };
    return { kind: "unreadable", why: `the agent has no running machine of it (${body.why ?? body.sandbox})` };
  }

  /** Volume routes, passed through (their refusals keep the agent's code and message). */
  volume(hostId: string, method: "GET" | "POST", path: string): Promise<unknown> {
    return this.passthrough(hostId, method, path);
  }

  /** One agent route, passed through (volumes, images): its refusals keep the agent's code and message. */
  async passthrough(hostId: string, method: "GET" | "POST", path: string, payload?: unknown): Promise<unknown> {
    let r: { status: number; body: unknown };
    try {
      r = await this.call(hostId, method, path, payload);
    } catch (e) {
      throw new BerthError("provider_unavailable", `provider_unavailable: the agent of host ${hostId} did not answer: ${e instanceof Error ? e.message : String(e)}; try again`);
    }
    const body = r.body as ErrorBody;
    if (r.status >= 200 && r.status < 300) return r.body;
    const code = body.error?.code ?? "provider_unavailable";
    throw new BerthError(code as "conflict", body.error?.message ?? `${code}: agent answered ${r.status}`);
  }
}
