/**
 * `berth host activate NAME`, the operator's step of host identity
 * (docs/host-identity.md; the host's own steps are host-identity.ts): lent
 * machines block unless forced (then their borrows end, with the reason);
 * the host is `preparing` (it takes no new machine); the agent prepares and
 * answers with its key's proof and a proof of the host's current host-call
 * token (the key is never recorded without both); the key is recorded
 * `prepared`: from here the coordinator honours the host's commit, whatever
 * happens later.
 */
import { BerthError } from "../../core/errors.js";
import { floorRecorded, verifyCallProof } from "../../core/host-identity.js";
import { callAgent, callTokenFor, type AgentReply } from "../../providers/hosts/agent-call.js";
import { AGENT_API, agentRefusal, agentReplyMismatch, type AgentReply as AgentReplyOf } from "../../protocol/agent-api.js";
import { liveMachinesOfHost, setAgentReport, setIdentityState } from "../../store/host-identity.js";
import { lockHostByName } from "../../store/hosts.js";
import type { MachineRow } from "../../store/machines.js";
import type { Principal } from "../auth.js";
import { requireRole } from "../auth.js";
import type { Ctx } from "../context.js";
import { endBorrowsOfRetired, issueChallenge, readHostForUpdate, takeProof } from "./host-identity.js";

const LENT = new Set(["reserved", "installing", "busy"]);

export interface ActivateResult {
  host: string;
  hostId: string;
  state: string;
  /** Machines the agent retires (their reports come later). */
  machines: number;
  /** Borrows ended by --force. */
  endedBorrows: number;
}

/**
 * An operator's `berth host activate NAME`: see the header. The agent is
 * called outside any transaction; a refusal or an unreachable agent puts
 * the host back on the shared token, changed in nothing.
 */
export async function activateHost(ctx: Ctx, p: Principal, name: string, force: boolean, secret: Uint8Array): Promise<ActivateResult> {
  requireRole(p, "operator");
  const now = ctx.now();
  const before = await ctx.store.transaction(async (tx) => {
    const h = await lockHostByName(tx, p.org, name);
    if (!h) throw new BerthError("not_found", `not_found: no host named ${name} in this organisation (see \`berth host ls\`)`);
    if (h.removing_since !== null) throw new BerthError("conflict", `conflict: host ${name} is being removed; nothing to switch`);
    if (h.identity_state === "awaiting") {
      throw new BerthError("conflict", `conflict: host ${name} awaits its agent after an identity reset; start the agent with the one-time enroll token \`berth host reset-identity\` printed (it binds its key itself)`);
    }
    if (floorRecorded(h.identity_state)) return { h, machines: [] as MachineRow[], ended: 0, done: true };
    const machines = await liveMachinesOfHost<MachineRow>(tx, h.id);
    const lent = machines.filter((m) => LENT.has(m.state));
    if (lent.length > 0 && !force) {
      ctx.metrics.hostIdentityRefusals.inc({ code: "host_busy" });
      throw new BerthError(
        "host_busy",
        `host_busy: host ${name} lends ${lent.map((m) => `${m.id} (${m.state}, pool ${m.pool})`).join(", ")}; wait until they are returned, or use --force to end those borrows and retire them`,
      );
    }
    let ended = 0;
    for (const m of lent) ended += await endBorrowsOfRetired(tx, ctx, m, now);
    if (h.identity_state === "legacy") {
      await setIdentityState(tx, h.id, { state: "preparing" }, now);
      tx.afterCommit(() => ctx.metrics.hostIdentitySteps.inc({ step: "preparing" }));
    }
    return { h, machines, ended, done: false };
  });
  const { h } = before;
  if (before.done) return { host: name, hostId: h.id, state: h.identity_state, machines: 0, endedBorrows: 0 };

  const { challenge } = issueChallenge(ctx, secret);
  const generations = Object.fromEntries(before.machines.map((m) => [m.resource_id, m.generation]));
  let reply;
  try {
    reply = await callAgent(secret, h, "POST", "/v1/agent/identity/prepare", { challenge, force, generations }, 60_000);
  } catch (e) {
    await backToLegacy(ctx, h.id);
    ctx.metrics.hostIdentityRefusals.inc({ code: "agent_unavailable" });
    throw new BerthError("provider_unavailable", `provider_unavailable: the agent of host ${name} did not answer (${e instanceof Error ? e.message : String(e)}); nothing changed, try again`);
  }
  const { publicKey, signature, callProof } = await preparedKey(ctx, h.id, name, reply);
  await ctx.store.transaction(async (tx) => {
    const cur = await readHostForUpdate(tx, h.id);
    if (floorRecorded(cur.identity_state)) return;
    if (cur.identity_state !== "preparing" && cur.identity_state !== "prepared") {
      throw new BerthError("conflict", `conflict: host ${name} became ${cur.identity_state} while it prepared; nothing was recorded (see \`berth host ls\`)`);
    }
    // The key is the host's only if the answer proves the host's current credential (its host-call token) too.
    if (!verifyCallProof(callTokenFor(secret, cur), callProof, "prepare", cur.id, challenge, publicKey)) {
      ctx.metrics.hostIdentityRefusals.inc({ code: "proof_invalid" });
      throw new BerthError(
        "unauthorized",
        `unauthorized: the agent of host ${name} answered the prepare without a proof of the host's current host-call token; no key was recorded. ` +
          "An agent built before this proof cannot switch: upgrade it and activate again",
      );
    }
    await takeProof(tx, ctx, secret, { key: publicKey, purpose: "prepare", host: cur.id, challenge, signature });
    await setIdentityState(tx, cur.id, { state: "prepared", pendingKey: publicKey }, now);
    await setAgentReport(tx, cur.id, { step: "prepared" });
    tx.afterCommit(() => ctx.metrics.hostIdentitySteps.inc({ step: "prepared" }));
  }).catch(async (e: unknown) => {
    await backToLegacy(ctx, h.id);
    throw e;
  });
  ctx.log.info({ host: name, hostId: h.id, machines: before.machines.length, force }, "host identity: prepared; the agent commits and retires its machines");
  return { host: name, hostId: h.id, state: "prepared", machines: before.machines.length, endedBorrows: before.ended };
}

/** The agent's answer to the prepare, read by the contract; a refusal or an answer off it puts the host back to legacy first. */
async function preparedKey(ctx: Ctx, hostId: string, name: string, reply: AgentReply): Promise<AgentReplyOf<"POST /v1/agent/identity/prepare">> {
  if (reply.status !== 200) {
    await backToLegacy(ctx, hostId);
    const refusal = agentRefusal(reply.body);
    const code = refusal.code ?? `http_${reply.status}`;
    ctx.metrics.hostIdentityRefusals.inc({ code });
    if (code === "host_busy") throw new BerthError("host_busy", `host_busy: the agent of host ${name} refused: ${refusal.message ?? ""}`);
    throw new BerthError("operation_failed", `operation_failed: the agent of host ${name} refused to prepare (${code}: ${refusal.message ?? ""}); nothing changed`);
  }
  const prepared = AGENT_API["POST /v1/agent/identity/prepare"].safeParse(reply.body);
  if (!prepared.success) {
    await backToLegacy(ctx, hostId);
    ctx.metrics.hostIdentityRefusals.inc({ code: "invalid_agent_reply" });
    throw agentReplyMismatch("POST /v1/agent/identity/prepare", prepared.error.issues);
  }
  return prepared.data;
}

async function backToLegacy(ctx: Ctx, hostId: string): Promise<void> {
  await ctx.store.transaction(async (tx) => {
    const cur = await readHostForUpdate(tx, hostId);
    if (cur.identity_state === "preparing") await setIdentityState(tx, hostId, { state: "legacy" }, ctx.now());
  });
}
