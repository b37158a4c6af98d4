/**
 * The operation executor: carries out durable provider operations outside
 * any store transaction.
 *
 *   1. start (one transaction): the op row is `pending` (or `running` with an
 *      expired lease, i.e. its coordinator died); mark it `running`, count the
 *      attempt, and push its due row to the lease end. A crash from here on
 *      leaves a due row that another coordinator (or this one, restarted)
 *      picks up, and the retried call carries the same op id, so the agent
 *      returns its first result instead of acting twice.
 *   2. call the provider (no transaction open).
 *   3. complete (one transaction): record the outcome and apply the machine
 *      transition it proves, only if the machine is still at the operation's
 *      generation. A late completion for an older generation changes nothing.
 *
 * Ambiguous outcomes (timeouts, lost replies) are retried with the same id to
 * learn what happened; after the attempts run out, a machine whose cleanup
 * could not be proven is quarantined (then destroyed), never made ready.
 */
import type { Ctx } from "./context.js";
import type { Tx } from "../store/store.js";
import { audit, setDue, clearDue, poolRef, setDueNoLater, type MachineRow } from "../store/rows.js";
import type { OperationKind, OperationOutcome } from "../providers/provider.js";
import { applyTransition } from "./actions/transition.js";
import { registerProvisioned } from "./actions/register.js";
import { backoffMs } from "../store/store.js";
import { closeGrantsOfMachine, onCleanupFailed, onCleanupStep, onInstallConfirmed, onInstallFailed } from "./actions/grants.js";

export const OP_LEASE_MS = 30_000;
export const OP_MAX_ATTEMPTS = 6;

export interface OpRow {
  id: string;
  kind: OperationKind;
  machine_id: string;
  host_id: string | null;
  generation: number;
  state: "pending" | "running" | "done" | "failed";
  attempts: number;
  args: string;
  result: string | null;
  error: string | null;
  created_at: number;
  updated_at: number;
}

export interface StartedOp {
  op: OpRow;
  machine: MachineRow;
}

/** Step 1, inside the reconciler's transaction for the op's due row. */
export async function startOp(tx: Tx, ctx: Ctx, opId: string, now: number): Promise<StartedOp | null> {
  const op = await tx.get<OpRow>(`SELECT * FROM operations WHERE id = ?${tx.forUpdate}`, [opId]);
  if (!op || op.state === "done" || op.state === "failed") {
    await clearDue(tx, "op", opId);
    return null;
  }
  if (op.state === "running" && now < op.updated_at + OP_LEASE_MS) {
    await setDue(tx, "op", opId, op.updated_at + OP_LEASE_MS);
    return null;
  }
  let machine = await tx.get<MachineRow>(`SELECT * FROM machines WHERE id = ?${tx.forUpdate}`, [op.machine_id]);
  if (!machine) {
    await tx.run("UPDATE operations SET state = 'failed', error = ?, updated_at = ? WHERE id = ?", ["machine record is gone", now, opId]);
    await clearDue(tx, "op", opId);
    return null;
  }
  if (op.kind === "destroy" && (machine.state === "quarantined" || machine.state === "draining")) {
    machine = (await applyTransition(tx, ctx, machine, { kind: "destroy_started" }, now, { nonce: op.id })).machine;
  }
  await tx.run("UPDATE operations SET state = 'running', attempts = attempts + 1, updated_at = ? WHERE id = ?", [now, opId]);
  await setDue(tx, "op", opId, now + OP_LEASE_MS);
  return { op: { ...op, state: "running", attempts: op.attempts + 1, updated_at: now }, machine };
}

/** Step 2 + 3: call the provider, then record what it proved. */
export async function executeOp(ctx: Ctx, started: StartedOp): Promise<void> {
  const { op, machine } = started;
  const provider = ctx.providers.get(machine.provider);
  let outcome: OperationOutcome;
  if (!provider) {
    outcome = { kind: "failed", error: `provider ${machine.provider} is not configured`, retryable: true };
  } else {
    try {
      outcome = await provider.run({ opId: op.id, kind: op.kind, machine, generation: op.generation, args: JSON.parse(op.args) as Record<string, unknown> });
    } catch (e) {
      outcome = { kind: "ambiguous", error: e instanceof Error ? e.message : String(e) };
    }
  }
  ctx.metrics.operations.inc({ kind: op.kind, outcome: outcome.kind });
  const seedNonce = Buffer.from(ctx.randomBytes(8)).toString("hex");
  await ctx.store.transaction((tx) => completeOp(tx, ctx, op, outcome, ctx.now(), seedNonce), { name: "complete-op" });
  ctx.kick();
}

async function completeOp(tx: Tx, ctx: Ctx, op: OpRow, outcome: OperationOutcome, now: number, nonce: string): Promise<void> {
  const current = await tx.get<OpRow>(`SELECT * FROM operations WHERE id = ?${tx.forUpdate}`, [op.id]);
  // Another coordinator (after our lease ran out) may have completed it: its record stands.
  if (!current || current.state !== "running" || current.attempts !== op.attempts) return;
  const m = await tx.get<MachineRow>(`SELECT * FROM machines WHERE id = ?${tx.forUpdate}`, [op.machine_id]);
  if (outcome.kind !== "done") {
    // Destruction is retried for as long as it takes, even after a refusal: its
    // record is the only trace of a machine that may still exist, and a
    // machine left `destroying` with no operation would never be looked at again.
    const retryable = outcome.kind === "ambiguous" || outcome.retryable || op.kind === "destroy";
    if (retryable && (op.attempts < OP_MAX_ATTEMPTS || op.kind === "destroy")) {
      const delay = Math.round(Math.min(backoffMs(op.attempts) * 100, 60_000)); // whole ms: PostgreSQL columns are BIGINT
      await tx.run("UPDATE operations SET state = 'pending', error = ?, updated_at = ? WHERE id = ?", [outcome.error, now, op.id]);
      await setDue(tx, "op", op.id, now + delay);
      return;
    }
    await tx.run("UPDATE operations SET state = 'failed', error = ?, updated_at = ? WHERE id = ?", [outcome.error, now, op.id]);
    await clearDue(tx, "op", op.id);
    if (m) await onGiveUp(tx, ctx, op, m, outcome.error, now, nonce);
    return;
  }
  await tx.run("UPDATE operations SET state = 'done', result = ?, error = NULL, updated_at = ? WHERE id = ?", [JSON.stringify(outcome.result), now, op.id]);
  await clearDue(tx, "op", op.id);
  if (!m) return;
  await onDone(tx, ctx, op, m, outcome.result, now, nonce);
}

async function onDone(tx: Tx, ctx: Ctx, op: OpRow, m: MachineRow, result: Record<string, unknown>, now: number, nonce: string): Promise<void> {
  if (op.kind === "destroy") {
    if (m.state === "destroying") {
      await applyTransition(tx, ctx, m, { kind: "destroyed" }, now, { nonce });
      await closeGrantsOfMachine(tx, ctx, m.id, now);
      await releaseHostSlot(tx, m);
      await setDue(tx, "retention", `m:${m.id}`, now + ctx.config.retentionMs);
      await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
    }
    return;
  }
  if (op.kind === "provision") {
    const found = {
      incarnation: String(result.incarnation ?? ""),
      sshHost: String(result.sshHost ?? ""),
      sshPort: Number(result.sshPort ?? 0),
      hostKey: String(result.hostKey ?? ""),
    };
    const r = await registerProvisioned(tx, ctx, m, found, now);
    if (!r.ok && m.state === "provisioning") {
      const d = await applyTransition(tx, ctx, m, { kind: "drain", reason: `not registered: ${r.why}` }, now, { nonce });
      if (d.opIds.length === 0) await audit(tx, { at: now, machineId: m.id, subject: op.id, event: "unregistered", from: "provisioning", to: d.machine.state, generation: m.generation, actor: ctx.actor });
    }
    return;
  }
  // Everything below proves a step for exactly the op's generation. A late
  // completion for an older generation is recorded on the op and changes nothing.
  if (m.generation !== op.generation) {
    await audit(tx, { at: now, machineId: m.id, subject: op.id, event: `late_${op.kind}`, from: m.state, to: m.state, generation: m.generation, actor: ctx.actor });
    return;
  }
  if (typeof result.incarnation === "string") await tx.run("UPDATE machines SET incarnation = ? WHERE id = ?", [result.incarnation, m.id]);
  switch (op.kind) {
    case "remove_key":
      if (m.state === "revoking") {
        await applyTransition(tx, ctx, m, { kind: "revoked" }, now, { nonce });
        await onCleanupStep(tx, ctx, m.id, m.generation, "revoked", now);
      }
      return;
    case "fence":
      if (m.state === "fencing") {
        await applyTransition(tx, ctx, m, { kind: "fenced" }, now, { nonce });
        await onCleanupStep(tx, ctx, m.id, m.generation, "fenced", now);
      }
      return;
    case "scrub":
      if (m.state === "scrubbing") {
        await applyTransition(tx, ctx, m, { kind: "scrubbed" }, now, { nonce });
        await onCleanupStep(tx, ctx, m.id, m.generation, "closed", now);
        // Back in the ready queue: let the reconciler check the pool is not above its capacity.
        await setDueNoLater(tx, "fill", poolRef(m.org, m.pool), now);
      }
      return;
    case "install_key":
      // Activation is the grant code's: it revalidates the grant for exactly this generation.
      await onInstallConfirmed(tx, ctx, op, m, now, nonce);
      return;
  }
}

async function onGiveUp(tx: Tx, ctx: Ctx, op: OpRow, m: MachineRow, error: string, now: number, nonce: string): Promise<void> {
  if (op.kind === "provision") {
    if (m.state === "provisioning") await applyTransition(tx, ctx, m, { kind: "drain", reason: `provisioning failed: ${error}` }, now, { nonce });
    return;
  }
  if (m.generation !== op.generation && op.kind !== "destroy") return;
  if (op.kind === "install_key") return onInstallFailed(tx, ctx, op, m, now, nonce);
  if (m.state === "quarantined" || m.state === "draining" || m.state === "destroying" || m.state === "destroyed") return;
  ctx.metrics.quarantined.inc({ pool: m.pool, reason: `${op.kind}_failed` });
  onCleanupFailed(tx, ctx, m, op.kind);
  await applyTransition(tx, ctx, m, { kind: "quarantine", reason: `${op.kind} could not be proven: ${error}` }, now, { nonce });
}

async function releaseHostSlot(tx: Tx, m: MachineRow): Promise<void> {
  if (m.host_id) await tx.run("UPDATE hosts SET used_slots = used_slots - 1 WHERE id = ? AND used_slots > 0", [m.host_id]);
}
