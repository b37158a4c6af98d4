/**
 * The coordinator's calls to an agent about allocations: the three
 * allocation operations (with the same ambiguity rules as machine
 * operations: 4xx = refused and nothing changed, 5xx / no answer / a result
 * off contract = ambiguous, retried with the same operation id), the hold
 * observation a replacement launch actor decides on, and the volume routes
 * `berth volume …` reaches through the coordinator.
 */
import { parseOperationResult, type AllocOperationKind, type AllocOpArgs, type OperationResults } from "../protocol/operations.js";
import { AGENT_API, agentPath, agentRefusal, agentReplyMismatch, parseAgentReply, type AgentReply, type AgentRoute } from "../protocol/agent-api.js";
import type { HoldObservation } from "../core/allocation-takeover.js";
import { BerthError, isErrorCode } from "../core/errors.js";

/** What the hosts provider gives: one authenticated call to a host's agent (throws when it does not answer). */
export type AgentCall = (hostId: string, method: "GET" | "POST", path: string, body?: unknown) => Promise<{ status: number; body: unknown }>;

/**
 * The agent's view of an allocation's sandbox: `dead` is not running — `lost` when the agent no longer has the
 * machine as recorded (it restarted and found it not matching: it does not start that machine again); `absent`
 * when it has no live machine of it at all.
 */
export type SandboxObservation =
  | { kind: "running" }
  | { kind: "dead"; why: string; lost: boolean }
  | { kind: "absent"; why: string }
  | { kind: "unreadable"; why: string };

export type AllocAnswer<K extends AllocOperationKind> =
  | { kind: "done"; result: OperationResults[K] }
  | { kind: "refused"; code: string; error: string }
  | { kind: "ambiguous"; error: string };

export class AllocationAgent {
  constructor(private readonly call: AgentCall) {}

  async op<K extends AllocOperationKind>(hostId: string, kind: K, opId: string, machineId: string, generation: number, args: AllocOpArgs[K]): Promise<AllocAnswer<K>> {
    let r: { status: number; body: unknown };
    try {
      r = await this.call(hostId, "POST", "/v1/agent/ops", { opId, kind, machineId, generation, args });
    } catch (e) {
      return { kind: "ambiguous", error: `the agent did not answer: ${e instanceof Error ? e.message : String(e)}` };
    }
    if (r.status >= 200 && r.status < 300) {
      try {
        const result = parseOperationResult(kind, parseAgentReply("POST /v1/agent/ops", r.body).result);
        return result === null ? { kind: "ambiguous", error: `invalid_agent_reply: the agent's ${kind} result does not match the operation contract` } : { kind: "done", result };
      } catch (e) {
        return { kind: "ambiguous", error: e instanceof Error ? e.message : String(e) };
      }
    }
    const refusal = agentRefusal(r.body);
    const msg = refusal.message ?? `agent answered ${r.status}`;
    if (r.status >= 500) return { kind: "ambiguous", error: msg };
    return { kind: "refused", code: refusal.code ?? "refused", error: msg };
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
    if (floor !== null && r.status === 404) return { kind: "unreadable", why: "the agent cannot raise a generation floor (an agent older than this coordinator): upgrade it" };
    if (r.status === 404 && agentRefusal(r.body).code === "not_found") return { kind: "absent" };
    if (r.status !== 200) return { kind: "unreadable", why: `agent answered ${r.status}` };
    let hold: AgentReply<"GET /v1/agent/holds/{allocation}">;
    try {
      hold = parseAgentReply(floor === null ? "GET /v1/agent/holds/{allocation}" : "POST /v1/agent/holds/{allocation}/observe", r.body);
    } catch (e) {
      return { kind: "unreadable", why: e instanceof Error ? e.message : String(e) };
    }
    // A released or fenced hold holds nothing: for the takeover it is absent (and the agent refuses any hold below it).
    return hold.state === "held" ? { kind: "present", allocationId: hold.allocationId, generation: hold.generation } : { kind: "absent" };
  }

  /** Whether the allocation's sandbox runs on its host, asked of the agent's runtime now (never "stopped" unless the agent said so). */
  async sandbox(hostId: string, allocationId: string): Promise<SandboxObservation> {
    const route = "GET /v1/agent/holds/{allocation}/sandbox";
    let r: { status: number; body: unknown };
    try {
      r = await this.call(hostId, "GET", agentPath(route, { allocation: allocationId }));
    } catch (e) {
      return { kind: "unreadable", why: `the agent did not answer: ${e instanceof Error ? e.message : String(e)}` };
    }
    if (r.status !== 200) return { kind: "unreadable", why: `agent answered ${r.status}` };
    const p = AGENT_API[route].safeParse(r.body);
    if (!p.success) return { kind: "unreadable", why: agentReplyMismatch(route, p.error.issues).message };
    const body = p.data;
    if (body.sandbox === "running") return { kind: "running" };
    if (body.sandbox === "stopped" || body.sandbox === "mismatch") return { kind: "dead", why: body.why ?? body.sandbox, lost: body.sandbox === "mismatch" };
    return { kind: "absent", why: `the agent has no running machine of it (${body.why ?? body.sandbox})` };
  }

  /**
   * One agent route (volumes, images, standing), its answer parsed by the
   * contract (src/protocol/agent-api.ts): refusals keep the agent's code and
   * message; an answer off the contract is `invalid_agent_reply`.
   */
  async passthrough<R extends AgentRoute>(hostId: string, route: R, params: Record<string, string> = {}, payload?: unknown): Promise<AgentReply<R>> {
    const method = route.startsWith("GET ") ? "GET" : "POST";
    const path = agentPath(route, params);
    let r: { status: number; body: unknown };
    try {
      r = await this.call(hostId, method, path, payload);
    } catch (e) {
      throw new BerthError("provider_unavailable", `provider_unavailable: the agent of host ${hostId} did not answer: ${e instanceof Error ? e.message : String(e)}; try again`);
    }
    if (r.status >= 200 && r.status < 300) return parseAgentReply(route, r.body);
    const refusal = agentRefusal(r.body);
    const code = refusal.code !== null && isErrorCode(refusal.code) ? refusal.code : "provider_unavailable";
    throw new BerthError(code, refusal.message ?? `${code}: agent answered ${r.status}`);
  }
}
