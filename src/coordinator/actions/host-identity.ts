/**
 * The coordinator's half of host identity (docs/host-identity.md):
 *
 *   activateHost   an operator asks a host to switch: lent machines block
 *                  unless forced (then their borrows end, with the reason);
 *                  the host is `preparing` (it takes no new machine); the
 *                  agent prepares and answers with its key's proof and a
 *                  proof of the host's current host-call token (the key is
 *                  never recorded without both); the key is recorded
 *                  `prepared`: from here the coordinator honours the host's
 *                  commit, whatever happens later (nothing the enroll token
 *                  can do changes an existing host).
 *   openSession    a signed challenge -> a short-lived host credential
 *                  (hash stored, `host_credentials`), for a `prepared`
 *                  host's pending key or a committed host's key.
 *   commitHost     the floor: `committed`; the enroll token is refused for
 *                  this host from now on (`host_activated`, hosts.ts).
 *   hostActive     the agent purged its token and advertises: `active`, and
 *                  its pools may be filled again.
 *   describeHost   an identity host's re-enrollment (new URL, ports).
 *   takeStoppedReports  each owed report at the current generation destroys
 *                  the machine row once; any other is ignored; the answer
 *                  names the moot ones (taken, newer, gone).
 */
import { BerthError } from "../../core/errors.js";
import {
  challengeDigest,
  challengeProblem,
  floorRecorded,
  newChallenge,
  stoppedReportVerdict,
  verifyCallProof,
  verifyProof,
  type ProofPurpose,
  type StoppedReport,
} from "../../core/host-identity.js";
import { hashToken, newToken } from "../../core/tokens.js";
import { callAgent, callTokenFor, type AgentReply } from "../../providers/hosts/agent-call.js";
import { AGENT_API, agentRefusal, agentReplyMismatch, type AgentReply as AgentReplyOf } from "../../protocol/agent-api.js";
import { audit } from "../../store/audit.js";
import { endBorrow, lockActiveBorrowsOfMachine } from "../../store/borrows.js";
import { clearDue, poolRef, setDue, setDueNoLater } from "../../store/due.js";
import { invalidateGrantRow, lockLiveGrantsOfMachine } from "../../store/grants.js";
import {
  insertHostCredential,
  liveMachinesOfHost,
  lockMachineOfHostResource,
  readHostCredential,
  setAgentReport,
  setIdentityState,
  useChallenge,
} from "../../store/host-identity.js";
import { lockHost, lockHostByName, readHost, releaseHostSlot, updateHost, type HostDescription, type HostRow } from "../../store/hosts.js";
import { markDestroyedByKeeper, setHostAddressOfMachines, type MachineRow } from "../../store/machines.js";
import { poolNamesOfProvider } from "../../store/pools.js";
import type { Tx } from "../../store/store.js";
import type { Principal } from "../auth.js";
import { requireRole } from "../auth.js";
import type { Ctx } from "../context.js";
import { closeGrantsOfMachine } from "./grants.js";
import { accountEnrolledHost } from "./alloc-owners.js";

const LENT = new Set(["reserved", "installing", "busy"]);

export function issueChallenge(ctx: Ctx, secret: Uint8Array): { challenge: string; expiresAt: number } {
  return newChallenge(secret, ctx.now(), ctx.randomBytes);
}

/** Checks a proof and takes its challenge (once); throws `unauthorized` naming what is wrong, never echoing it. */
export async function takeProof(
  tx: Tx,
  ctx: Ctx,
  secret: Uint8Array,
  p: { key: string; purpose: ProofPurpose; host: string; challenge: string; signature: string },
): Promise<void> {
  const now = ctx.now();
  const problem = challengeProblem(secret, p.challenge, now);
  if (problem !== null) {
    ctx.metrics.hostIdentityRefusals.inc({ code: "proof_invalid" });
    throw new BerthError("unauthorized", `unauthorized: the identity proof's challenge is not acceptable: ${problem}`);
  }
  if (!verifyProof(p.key, p.purpose, p.host, p.challenge, p.signature)) {
    ctx.metrics.hostIdentityRefusals.inc({ code: "proof_invalid" });
    throw new BerthError("unauthorized", "unauthorized: the identity proof does not verify against the host's identity key");
  }
  if (!(await useChallenge(tx, challengeDigest(p.challenge), now + 120_000, now))) {
    throw new BerthError("unauthorized", "unauthorized: this challenge was already used; ask for a new one");
  }
}

/** The key a session is proven against: the recorded one once committed, the pending one while prepared. */
function sessionKey(h: HostRow): string | null {
  if (floorRecorded(h.identity_state)) return h.identity_key;
  if (h.identity_state === "prepared") return h.pending_identity_key;
  return null;
}

export async function openSession(
  ctx: Ctx,
  secret: Uint8Array,
  input: { hostId: string; challenge: string; signature: string },
): Promise<{ credential: string; expiresAt: number }> {
  const credential = newToken("host-credential", ctx.randomBytes);
  const now = ctx.now();
  const expiresAt = now + ctx.config.hostCredentialTtlMs;
  await ctx.store.transaction(async (tx) => {
    const h = await readHost(tx, input.hostId);
    if (h?.identity_state === "awaiting") {
      throw new BerthError(
        "host_awaiting",
        `host_awaiting: an operator reset the identity of host ${h.name}; no key is recorded for it until its agent enrolls again with the one-time enroll token \`berth host reset-identity\` printed`,
      );
    }
    const key = h ? sessionKey(h) : null;
    if (!h || key === null) {
      throw new BerthError("unauthorized", `unauthorized: host ${input.hostId} has no identity key recorded here; an operator switches it with \`berth host activate\``);
    }
    await takeProof(tx, ctx, secret, { key, purpose: "session", host: h.id, challenge: input.challenge, signature: input.signature });
    await insertHostCredential(tx, hashToken("host-credential", credential), h.id, now, expiresAt);
  });
  return { credential, expiresAt };
}

/** The host a credential speaks for; `unauthorized` when it is unknown or expired. */
export async function authenticateHost(ctx: Ctx, header: string | undefined): Promise<HostRow> {
  const m = typeof header === "string" ? /^Bearer (\S{1,512})$/.exec(header) : null;
  if (m === null) throw new BerthError("unauthorized", "unauthorized: send the host credential as 'Authorization: Bearer <credential>' (POST /v1/hosts/session issues one against a signed challenge)");
  const row = await readHostCredential(ctx.store, hashToken("host-credential", m[1]!));
  if (!row) throw new BerthError("unauthorized", "unauthorized: the host credential is not known to this coordinator");
  if (ctx.now() >= row.expires_at) throw new BerthError("unauthorized", "unauthorized: the host credential expired; prove the identity key again for a new one");
  const h = await ctx.store.transaction((tx) => readHost(tx, row.host_id));
  if (!h) throw new BerthError("unauthorized", "unauthorized: the host of this credential is gone");
  return h;
}

export async function commitHost(ctx: Ctx, host: HostRow, secret: Uint8Array): Promise<{ hostCallToken: string }> {
  const now = ctx.now();
  const h = await ctx.store.transaction(async (tx) => {
    const cur = await readHostForUpdate(tx, host.id);
    if (floorRecorded(cur.identity_state)) return cur;
    if (cur.identity_state !== "prepared" || cur.pending_identity_key === null) {
      throw new BerthError("conflict", `conflict: host ${cur.name} is ${cur.identity_state}; only a prepared host commits its identity switch`);
    }
    await setIdentityState(tx, cur.id, { state: "committed", key: cur.pending_identity_key, pendingKey: null }, now);
    await setAgentReport(tx, cur.id, { step: "cloud" });
    tx.afterCommit(() => {
      ctx.metrics.hostIdentitySteps.inc({ step: "committed" });
      ctx.log.info({ host: cur.name, hostId: cur.id }, "host identity: floor recorded; the enroll token is refused for this host from now on");
    });
    return { ...cur, identity_state: "committed" as const, identity_key: cur.pending_identity_key };
  });
  return { hostCallToken: callTokenFor(secret, h) };
}

export async function hostActive(ctx: Ctx, host: HostRow, version: string): Promise<{ state: string }> {
  const now = ctx.now();
  const r = await ctx.store.transaction(async (tx) => {
    const cur = await readHostForUpdate(tx, host.id);
    if (!floorRecorded(cur.identity_state)) throw new BerthError("conflict", `conflict: host ${cur.name} is ${cur.identity_state}; it becomes active after its commit`);
    await setAgentReport(tx, cur.id, { version, step: "active" });
    if (cur.identity_state === "committed") {
      await setIdentityState(tx, cur.id, { state: "active" }, now);
      for (const pool of await poolNamesOfProvider(tx, cur.org, "hosts")) await setDue(tx, "fill", poolRef(cur.org, pool), now);
      tx.afterCommit(() => ctx.metrics.hostIdentitySteps.inc({ step: "active" }));
    }
    return { state: "active" };
  });
  ctx.kick();
  return r;
}

export async function describeHost(
  ctx: Ctx,
  host: HostRow,
  secret: Uint8Array,
  input: { description: HostDescription; step: string; owed: number; version: string },
): Promise<{ hostId: string; hostCallToken: string }> {
  const now = ctx.now();
  const h = await ctx.store.transaction(async (tx) => {
    const cur = await readHostForUpdate(tx, host.id);
    if (!floorRecorded(cur.identity_state)) throw new BerthError("conflict", `conflict: host ${cur.name} is ${cur.identity_state}; it describes itself with its key once committed`);
    await updateHost(tx, cur.id, input.description, now);
    await setHostAddressOfMachines(tx, cur.id, input.description.ssh);
    await accountEnrolledHost(tx, ctx.actor, { id: cur.id, org: cur.org, name: cur.name, ...input.description.capacity }, now);
    await setAgentReport(tx, cur.id, { version: input.version, step: input.step, owed: input.owed });
    return cur;
  });
  return { hostId: h.id, hostCallToken: callTokenFor(secret, h) };
}

export async function takeStoppedReports(ctx: Ctx, host: HostRow, reports: StoppedReport[]): Promise<{ moot: StoppedReport[] }> {
  const now = ctx.now();
  const r = await ctx.store.transaction(async (tx) => {
    const moot: StoppedReport[] = [];
    const outcomes: string[] = [];
    for (const report of reports) {
      const m = await lockMachineOfHostResource<MachineRow>(tx, host.id, report.machineId);
      const v = stoppedReportVerdict(m, report);
      outcomes.push(v.kind === "take" ? "taken" : v.kind === "moot" ? "moot" : "ignored");
      if (v.kind === "ignore") continue;
      moot.push(report);
      if (v.kind !== "take" || !m) continue;
      await retireMachineRow(tx, ctx, m, now);
    }
    await setAgentReport(tx, host.id, { owed: reports.length - moot.length });
    tx.afterCommit(() => {
      for (const o of outcomes) ctx.metrics.stoppedReports.inc({ outcome: o });
    });
    return { moot };
  });
  ctx.kick();
  return r;
}

/** A machine the agent retired at its current generation: destroyed, its slot freed, its borrow or grant ended, its pool refilled. */
async function retireMachineRow(tx: Tx, ctx: Ctx, m: MachineRow, now: number): Promise<void> {
  await endBorrowsOfRetired(tx, ctx, m, now);
  await markDestroyedByKeeper(tx, m.id, m.generation, now);
  await audit(tx, { at: now, machineId: m.id, subject: m.host_id, event: "host_retired", from: m.state, to: "destroyed", generation: m.generation, actor: ctx.actor });
  await closeGrantsOfMachine(tx, ctx, m.id, now);
  if (m.host_id) await releaseHostSlot(tx, m.host_id);
  await setDue(tx, "retention", `m:${m.id}`, now + ctx.config.retentionMs);
  await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
}

const RETIRED_REASON = "host_activated: the host switched to its identity key and its machines were retired (berth host activate --force)";

async function endBorrowsOfRetired(tx: Tx, ctx: Ctx, m: MachineRow, now: number): Promise<number> {
  let ended = 0;
  for (const b of await lockActiveBorrowsOfMachine(tx, m.id)) {
    await endBorrow(tx, b.id, "returned", RETIRED_REASON, now);
    await clearDue(tx, "heartbeat", b.id);
    await setDue(tx, "retention", `b:${b.id}`, now + ctx.config.retentionMs);
    ended++;
  }
  for (const g of await lockLiveGrantsOfMachine(tx, m.id)) {
    await invalidateGrantRow(tx, g.id, RETIRED_REASON, now);
    await clearDue(tx, "ack", g.id);
    await clearDue(tx, "grant", g.id);
    ended++;
  }
  return ended;
}

async function readHostForUpdate(tx: Tx, id: string): Promise<HostRow> {
  const h = await lockHost(tx, id);
  if (!h) throw new BerthError("not_found", `not_found: host ${id} is gone`);
  return h;
}

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
