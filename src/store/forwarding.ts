/**
 * The forwarding switch (migration 13): whether a pool's machines accept
 * `ssh -L`/`-W` to their own ports (`pools.forwarding`, part of the pool's
 * compatibility: a change rotates its machines) and what each machine was
 * provisioned with (`machines.forwarding`, set with its row before the
 * provision operation runs). NULL is "on" in both, so rows written before
 * this migration read as they behaved. Named statements that compose inside
 * the caller's transaction.
 */
import type { Forwarding } from "../core/pool.js";
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";
import { forwardingColumn } from "./pools.js";

export const FORWARDING_MIGRATION: Migration = {
  version: 13,
  name: "pool forwarding switch",
  sql: `
ALTER TABLE pools ADD COLUMN forwarding TEXT;
ALTER TABLE machines ADD COLUMN forwarding TEXT;
`,
};

/** The switch a provisioning machine is made with. */
export async function setMachineForwarding(tx: Tx, machineId: string, f: Forwarding): Promise<void> {
  await tx.run("UPDATE machines SET forwarding = ? WHERE id = ?", [forwardingColumn(f), machineId]);
}

/** The switch a machine (its row) was provisioned with. */
export function forwardingOf(m: { forwarding?: string | null }): Forwarding {
  return m.forwarding === "off" ? "off" : "on";
}

/** Ready machines of a pool made with another switch than `f` (rotated out, never changed live). */
export async function staleForwardingReadyMachineIds(tx: Tx, org: string, pool: string, f: Forwarding): Promise<string[]> {
  const rows = await tx.all<{ id: string }>("SELECT id FROM machines WHERE org = ? AND pool = ? AND state = 'ready' AND COALESCE(forwarding, 'on') <> ? ORDER BY id", [org, pool, f]);
  return rows.map((r) => r.id);
}
