/**
 * Network policy columns (migration 5): the pool's policy, and on each
 * machine the fingerprint of the policy it was provisioned for and its last
 * readiness evidence (bound to the generation it was probed at). Named
 * statements that compose inside the caller's transaction.
 */
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";
import type { ReadinessEvidence } from "../core/network-evidence.js";

export const NETWORK_MIGRATION: Migration = {
  version: 5,
  name: "network policy",
  sql: `
ALTER TABLE pools ADD COLUMN network TEXT;
ALTER TABLE machines ADD COLUMN network_fingerprint TEXT;
ALTER TABLE machines ADD COLUMN network_evidence TEXT;
`,
};

/** The policy a provisioning machine is made for (set with its row, before the provision operation runs). */
export async function setMachineFingerprint(tx: Tx, machineId: string, fingerprint: string): Promise<void> {
  await tx.run("UPDATE machines SET network_fingerprint = ? WHERE id = ?", [fingerprint, machineId]);
}

export async function setMachineEvidence(tx: Tx, machineId: string, evidence: ReadinessEvidence): Promise<void> {
  await tx.run("UPDATE machines SET network_evidence = ? WHERE id = ?", [JSON.stringify(evidence), machineId]);
}

export interface MachineNetworkRow {
  id: string;
  state: string;
  generation: number;
  network_fingerprint: string | null;
  network_evidence: string | null;
}

/** A pool's live machines with their policy fingerprint and evidence (pool show). */
export async function poolMachineNetworks(tx: Tx, org: string, pool: string): Promise<MachineNetworkRow[]> {
  return tx.all<MachineNetworkRow>(
    "SELECT id, state, generation, network_fingerprint, network_evidence FROM machines WHERE org = ? AND pool = ? AND state <> 'destroyed' ORDER BY id",
    [org, pool],
  );
}

/** Ready machines of a pool provisioned for another policy than `fingerprint` (rotated out by ensure). */
export async function staleReadyMachineIds(tx: Tx, org: string, pool: string, fingerprint: string): Promise<string[]> {
  const rows = await tx.all<{ id: string }>(
    "SELECT id FROM machines WHERE org = ? AND pool = ? AND state = 'ready' AND COALESCE(network_fingerprint, 'none') <> ?",
    [org, pool, fingerprint],
  );
  return rows.map((r) => r.id);
}
