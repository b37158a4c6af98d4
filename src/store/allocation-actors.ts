/**
 * Launch actor records (`allocation_actors`): at most one per allocation,
 * written before the actor asks the agent for the slot hold. Replacement is
 * compare-and-set from the exact record read, so two replacements racing on
 * one generation admit exactly one.
 */
import type { Tx } from "./store.js";
import type { ActorRecord } from "../core/allocation-takeover.js";

interface ActorRow {
  allocation_id: string;
  generation: number;
  actor: string;
  kind: "actor" | "tombstone";
  recorded_at: number;
}

export async function getActor(tx: Tx, allocationId: string): Promise<ActorRecord | null> {
  const r = await tx.get<ActorRow>("SELECT * FROM allocation_actors WHERE allocation_id = ?", [allocationId]);
  return r ? { allocationId: r.allocation_id, generation: r.generation, actor: r.actor, kind: r.kind } : null;
}

/**
 * Writes `next` only if the stored record is exactly `expected` (or absent
 * when `expected` is null). Returns whether this call won.
 */
export async function casActor(tx: Tx, expected: ActorRecord | null, next: ActorRecord, now: number): Promise<boolean> {
  if (expected === null) {
    const n = await tx.run("INSERT INTO allocation_actors (allocation_id, generation, actor, kind, recorded_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (allocation_id) DO NOTHING", [
      next.allocationId, next.generation, next.actor, next.kind, now,
    ]);
    return n === 1;
  }
  const n = await tx.run(
    "UPDATE allocation_actors SET generation = ?, actor = ?, kind = ?, recorded_at = ? WHERE allocation_id = ? AND generation = ? AND actor = ? AND kind = ?",
    [next.generation, next.actor, next.kind, now, expected.allocationId, expected.generation, expected.actor, expected.kind],
  );
  return n === 1;
}

/** The record with the time it was written or last renewed (the actor's lease starts there). */
export async function readActor(tx: Tx, allocationId: string): Promise<{ record: ActorRecord; recordedAt: number } | null> {
  const r = await tx.get<ActorRow>("SELECT * FROM allocation_actors WHERE allocation_id = ?", [allocationId]);
  return r ? { record: { allocationId: r.allocation_id, generation: r.generation, actor: r.actor, kind: r.kind }, recordedAt: Number(r.recorded_at) } : null;
}

/** Renews the actor's lease only while the stored record is still exactly `record`; false: it was replaced (stop acting). */
export async function renewActor(tx: Tx, record: ActorRecord, now: number): Promise<boolean> {
  return casActor(tx, record, record, now);
}
