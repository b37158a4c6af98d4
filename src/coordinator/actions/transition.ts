/**
 * Applying a machine transition inside a transaction: run the pure
 * `machineTransition`, write the new row only if the state and generation
 * are still the ones observed, turn its effects into durable operation rows
 * (executed after commit, outside any transaction), and append the audit
 * trail. One call = one compound write; callers never write machines by hand.
 */
import { BerthError } from "../../core/errors.js";
import { machineTransition, type Effect, type MachineEvent } from "../../core/machine.js";
import type { Tx } from "../../store/store.js";
import { audit } from "../../store/audit.js";
import { writeTransition, type MachineRow } from "../../store/machines.js";
import { insertOp } from "../../store/operations.js";
import type { Ctx } from "../context.js";
import { createHash } from "node:crypto";

export interface Applied {
  machine: MachineRow;
  effects: Effect[];
  opIds: string[];
}

/** Operation ids are derived from machine, generation, kind and a per-step nonce, so a retried transaction writes the same ids. */
export function opIdFor(machineId: string, generation: number, kind: string, nonce: string): string {
  return "op_" + createHash("sha256").update(`${machineId}:${generation}:${kind}:${nonce}`).digest("hex").slice(0, 24);
}

export async function applyTransition(
  tx: Tx,
  ctx: Ctx,
  m: MachineRow,
  event: MachineEvent,
  now: number,
  opts: { subject?: string | null; lentTo?: string | null; nonce: string; opArgs?: Record<string, unknown> },
): Promise<Applied> {
  const t = machineTransition(
    { state: m.state, generation: m.generation, stateSince: m.state_since, readySince: m.ready_since, reason: m.reason },
    event,
    now,
  );
  if (!t.ok) throw new BerthError("conflict", `conflict: machine ${m.id}: ${t.why}`);
  const lentTo = opts.lentTo !== undefined ? opts.lentTo : t.machine.state === "ready" || t.machine.state === "destroyed" ? null : m.lent_to;
  const next: MachineRow = { ...m, state: t.machine.state, generation: t.machine.generation, state_since: t.machine.stateSince, ready_since: t.machine.readySince, reason: t.machine.reason, lent_to: lentTo };
  await writeTransition(tx, m, next);
  await audit(tx, { at: now, machineId: m.id, subject: opts.subject ?? null, event: event.kind, from: m.state, to: next.state, generation: next.generation, actor: ctx.actor, detail: "reason" in event ? event.reason : null });
  const opIds: string[] = [];
  const provider = ctx.providers.get(m.provider);
  for (const e of t.effects) {
    const capable =
      e.kind === "destroy" ? provider?.capabilities.destroy : e.kind === "fence" ? provider?.capabilities.fence : e.kind === "scrub" ? provider?.capabilities.scrub : e.kind === "remove_key" ? provider?.capabilities.revokeKey : provider?.capabilities.installKey;
    if (!capable) continue;
    const opId = opIdFor(m.id, next.generation, e.kind, opts.nonce);
    await insertOp(tx, { id: opId, kind: e.kind, machineId: m.id, hostId: m.host_id, generation: next.generation, args: opts.opArgs ?? {}, now });
    opIds.push(opId);
  }
  return { machine: next, effects: t.effects, opIds };
}
