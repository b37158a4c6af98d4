/**
 * The coordinator's half of host identity (docs/host-identity.md):
 *
 *   activateHost   (host-activate.ts) an operator asks a host to switch: lent machines block
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
  verifyProof,
  type ProofPurpose,
  type StoppedReport,
} from "../../core/host-identity.js";
import { hashToken, newToken } from "../../core/tokens.js";
import { callTokenFor } from "../../providers/hosts/agent-call.js";
import { audit } from "../../store/audit.js";
import { endBorrow, lockActiveBorrowsOfMachine } from "../../store/borrows.js";
import { clearDue, poolRef, setDue, setDueNoLater } from "../../store/due.js";
import { invalidateGrantRow, lockLiveGrantsOfMachine } from "../../store/grants.js";
import {
  insertHostCredential,
  lockMachineOfHostResource,
  readHostCredential,
  setAgentReport,
  setIdentityState,
  useChallenge,
} from "../../store/host-identity.js";
import { lockHost, readHost, releaseHostSlot, updateHost, type HostDescription, type HostRow } from "../../store/hosts.js";
import { markDestroyedByKeeper, setHostAddressOfMachines, type MachineRow } from "../../store/machines.js";
import { poolNamesOfProvider } from "../../store/pools.js";
import type { Tx } from "../../store/store.js";
import type { Ctx } from "../context.js";
import { closeGrantsOfMachine } from "./grants.js";
import { accountEnrolledHost } from "./allocation-owners.js";

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

/** Ends every borrow and live grant of a machine its host retires (with the reason); the count ended. */
export async function endBorrowsOfRetired(tx: Tx, ctx: Ctx, m: MachineRow, now: number): Promise<number> {
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

/** The host row, locked; `not_found` when it is gone. */
export async function readHostForUpdate(tx: Tx, id: string): Promise<HostRow> {
  const h = await lockHost(tx, id);
  if (!h) throw new BerthError("not_found", `not_found: host ${id} is gone`);
  return h;
}
