/**
 * The `hosts` provider: machines are sandboxes on enrolled berth agents.
 * Every operation is one authenticated call to the agent's
 * `POST /v1/agent/ops` (the contract in src/protocol/operations.ts) carrying
 * the berth operation id and the machine generation; the agent stores the
 * first result under that id, so a retry after a lost reply returns it
 * instead of acting twice, and an older generation is refused without
 * change. A timeout or connection failure is reported as ambiguous: the
 * executor retries with the same id to learn the outcome. A reply whose
 * result does not match the contract proves nothing: ambiguous too.
 */
import type { NetworkCheck, OperationOutcome, OperationRequest, Provider, ProviderCapabilities } from "../provider.js";
import type { MachineRow } from "../../store/machines.js";
import type { HostRow } from "../../store/hosts.js";
import { callAgent, type AgentReply } from "./agent-call.js";
import { parseOperationResult, type InstallKeyArgs, type OperationKind, type OperationRequest as AgentOperationRequest, type OperationResults } from "../../protocol/operations.js";
import { AGENT_API, agentRefusal, parseAgentReply } from "../../protocol/agent-api.js";

export interface HostsProviderDeps {
  /** Read a host's record (address, gateway, host key) from the store. */
  host: (hostId: string) => Promise<HostRow | undefined>;
  /** The coordinator's secret, from which the per-host call token is derived. */
  secret: Uint8Array;
  /** Per-call timeout; past it the outcome is ambiguous. */
  timeoutMs?: number;
  /** The lend-time network check's timeout (default 5 s); past it the check failed. */
  checkTimeoutMs?: number;
}

const CAPABILITIES: ProviderCapabilities = { provision: true, installKey: true, revokeKey: true, fence: true, scrub: true, destroy: true, observeIdentity: true };


/** One agent call's outcome, its result typed by the contract. */
type Answer<K extends OperationKind> = { kind: "done"; result: OperationResults[K] } | Exclude<OperationOutcome, { kind: "done" }>;

export class HostsProvider implements Provider {
  readonly name = "hosts";
  readonly capabilities = CAPABILITIES;
  constructor(private readonly deps: HostsProviderDeps) {}

  async #call<K extends OperationKind>(host: HostRow, body: AgentOperationRequest & { kind: K }): Promise<Answer<K>> {
    const r = await callAgent(this.deps.secret, host, "POST", "/v1/agent/ops", body, this.deps.timeoutMs ?? 60_000);
    return answerOf(body.kind, r);
  }

  /**
   * One authenticated call to an enrolled host's agent API, outside the
   * machine operations (allocation holds, launches, volumes:
   * coordinator/allocation-agent.ts). Throws when the agent does not answer.
   */
  async agentCall(hostId: string, method: "GET" | "POST", path: string, body?: unknown): Promise<{ status: number; body: unknown }> {
    const host = await this.deps.host(hostId);
    if (!host) return { status: 404, body: { error: { code: "not_found", message: `host ${hostId} is not enrolled` } } };
    const r = await callAgent(this.deps.secret, host, method, path, body, this.deps.timeoutMs ?? 60_000);
    return { status: r.status, body: r.body };
  }

  /** The lend-time network check on the machine's agent; an agent that does not answer is a failed check (fail closed). */
  async checkNetwork(machine: MachineRow): Promise<NetworkCheck> {
    if (!machine.host_id) return { ok: false, why: `machine ${machine.id} has no host`, diff: [] };
    const host = await this.deps.host(machine.host_id);
    if (!host) return { ok: false, why: `host ${machine.host_id} is not enrolled`, diff: [] };
    try {
      const r = await callAgent(this.deps.secret, host, "POST", `/v1/agent/machines/${machine.resource_id}/network-check`, {}, this.deps.checkTimeoutMs ?? 5_000);
      if (r.status === 200) {
        const b = parseAgentReply("POST /v1/agent/machines/{machine}/network-check", r.body);
        if (!b.ok) return { ok: false, why: b.why, diff: b.diff };
        return { ok: true, digest: b.digest, reprobed: b.reprobed, ...(b.tookMs !== undefined ? { agentMs: b.tookMs } : {}) };
      }
      return { ok: false, why: `agent ${host.name} answered the network check with ${r.status}: ${agentRefusal(r.body).message ?? "an unreadable body"}`, diff: [] };
    } catch (e) {
      return { ok: false, why: `agent ${host.name} did not answer the network check: ${e instanceof Error ? e.message : String(e)}`, diff: [] };
    }
  }

  async run(op: OperationRequest): Promise<OperationOutcome> {
    const hostId = op.machine.host_id;
    if (!hostId) return { kind: "failed", error: `machine ${op.machine.id} has no host`, retryable: false };
    const host = await this.deps.host(hostId);
    if (!host) return { kind: "failed", error: `host ${hostId} is not enrolled`, retryable: false };
    try {
      if (op.kind === "provision") return await this.#provision(host, op);
      return await this.#call(host, { opId: op.opId, kind: op.kind, machineId: op.machine.resource_id, generation: op.generation, args: op.args });
    } catch (e) {
      return { kind: "ambiguous", error: `agent ${host.name} did not answer: ${e instanceof Error ? e.message : String(e)}` };
    }
  }

  async #provision(host: HostRow, op: Extract<OperationRequest, { kind: "provision" }>): Promise<OperationOutcome> {
    // The machine's network policy, image and forwarding switch go with its provision (absent: none, the host's root and on, as before).
    const args = {
      ...(op.args.network !== undefined ? { network: op.args.network } : {}),
      ...(typeof op.args.image === "string" ? { image: op.args.image } : {}),
      ...(op.args.forwarding === "off" ? { forwarding: "off" } : {}),
      ...(op.args.files === "workspace" ? { files: "workspace" } : {}),
    };
    const created = await this.#call(host, { opId: op.opId, kind: "provision", machineId: op.machine.resource_id, generation: 0, args });
    if (created.kind !== "done") return created;
    const keeperKey = typeof op.args.keeperKey === "string" ? op.args.keeperKey : null;
    if (keeperKey) {
      const args: InstallKeyArgs = { publicKey: keeperKey, mode: "keeper", grantId: `keeper-${op.machine.pool}`, expiresAt: null };
      const installed = await this.#call(host, { opId: `${op.opId}-keeper`, kind: "install_key", machineId: op.machine.resource_id, generation: 0, args });
      if (installed.kind !== "done") return installed;
    }
    return { kind: "done", result: { ...created.result, sshHost: host.ssh_host, sshPort: host.ssh_port, hostKey: host.host_key } };
  }
}

function answerOf<K extends OperationKind>(kind: K, reply: AgentReply): Answer<K> {
  if (reply.status >= 200 && reply.status < 300) {
    const envelope = AGENT_API["POST /v1/agent/ops"].safeParse(reply.body);
    const result = envelope.success ? parseOperationResult(kind, envelope.data.result) : null;
    if (result === null) return { kind: "ambiguous", error: `invalid_agent_reply: the agent's ${kind} result does not match the operation contract` };
    return { kind: "done", result };
  }
  const r = agentRefusal(reply.body);
  const e = r.code !== null && r.message !== null ? { code: r.code, message: r.message } : undefined;
  // Messages start with their code already (core/errors.ts); say it once.
  const err = e ? (e.message.startsWith(`${e.code}: `) ? e.message : `${e.code}: ${e.message}`) : `agent answered ${reply.status}`;
  if (reply.status >= 500) return { kind: "ambiguous", error: err };
  // 4xx: the agent refused and changed nothing (stale generation, bad request).
  return { kind: "failed", error: err, retryable: reply.status === 429 || reply.status === 423 };
}
