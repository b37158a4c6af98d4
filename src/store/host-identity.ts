/**
 * Host identity in the coordinator's store (migration 4,
 * docs/host-identity.md): each host's identity state and keys on its
 * `hosts` row, the short-lived host credentials (hashes only), and the
 * challenges already used (a proof is taken once).
 */
import type { Migration } from "./migrate.js";
import type { Store, Tx } from "./store.js";
import type { HostIdentityState } from "../core/host-identity.js";

export const HOST_IDENTITY_MIGRATION: Migration = {
  version: 4,
  name: "host identity",
  sql: `
ALTER TABLE hosts ADD COLUMN identity_state TEXT NOT NULL DEFAULT 'legacy';
ALTER TABLE hosts ADD COLUMN identity_key TEXT;
ALTER TABLE hosts ADD COLUMN pending_identity_key TEXT;
ALTER TABLE hosts ADD COLUMN identity_since BIGINT;
ALTER TABLE hosts ADD COLUMN agent_version TEXT;
ALTER TABLE hosts ADD COLUMN agent_step TEXT;
ALTER TABLE hosts ADD COLUMN owed_reports INTEGER NOT NULL DEFAULT 0;
CREATE TABLE host_credentials (
  hash TEXT PRIMARY KEY,
  host_id TEXT NOT NULL,
  issued_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL
);
CREATE INDEX host_credentials_host ON host_credentials (host_id, expires_at);
CREATE TABLE host_challenges_used (
  digest TEXT PRIMARY KEY,
  expires_at BIGINT NOT NULL
);
`,
};

/** The identity columns of a `hosts` row. */
export interface HostIdentityColumns {
  identity_state: HostIdentityState;
  identity_key: string | null;
  pending_identity_key: string | null;
  identity_since: number | null;
  agent_version: string | null;
  agent_step: string | null;
  owed_reports: number;
}

export async function setIdentityState(
  tx: Tx,
  hostId: string,
  s: { state: HostIdentityState; key?: string | null; pendingKey?: string | null },
  now: number,
): Promise<void> {
  const sets = ["identity_state = ?", "identity_since = ?"];
  const params: Array<string | number | null> = [s.state, now];
  if (s.key !== undefined) {
    sets.push("identity_key = ?");
    params.push(s.key);
  }
  if (s.pendingKey !== undefined) {
    sets.push("pending_identity_key = ?");
    params.push(s.pendingKey);
  }
  await tx.run(`UPDATE hosts SET ${sets.join(", ")} WHERE id = ?`, [...params, hostId]);
}

export async function setAgentReport(tx: Tx, hostId: string, r: { version?: string; step?: string; owed?: number }): Promise<void> {
  await tx.run("UPDATE hosts SET agent_version = COALESCE(?, agent_version), agent_step = COALESCE(?, agent_step), owed_reports = COALESCE(?, owed_reports) WHERE id = ?", [
    r.version ?? null,
    r.step ?? null,
    r.owed ?? null,
    hostId,
  ]);
}

/** Records a challenge as used; resolves false when it already was (a replayed proof). */
export async function useChallenge(tx: Tx, digest: string, expiresAt: number, now: number): Promise<boolean> {
  await tx.run("DELETE FROM host_challenges_used WHERE expires_at <= ?", [now]);
  if (await tx.get("SELECT 1 AS one FROM host_challenges_used WHERE digest = ?", [digest])) return false;
  await tx.run("INSERT INTO host_challenges_used (digest, expires_at) VALUES (?, ?)", [digest, expiresAt]);
  return true;
}

export async function insertHostCredential(tx: Tx, hash: string, hostId: string, now: number, expiresAt: number): Promise<void> {
  // Expired credentials of the host go as new ones come: the table stays small.
  await tx.run("DELETE FROM host_credentials WHERE host_id = ? AND expires_at <= ?", [hostId, now]);
  await tx.run("INSERT INTO host_credentials (hash, host_id, issued_at, expires_at) VALUES (?, ?, ?, ?)", [hash, hostId, now, expiresAt]);
}

/** A committed read per request, as API tokens are checked. */
export async function readHostCredential(store: Store, hash: string): Promise<{ host_id: string; expires_at: number } | undefined> {
  return store.readCommitted<{ host_id: string; expires_at: number }>("SELECT host_id, expires_at FROM host_credentials WHERE hash = ?", [hash]);
}

export async function deleteHostCredentials(tx: Tx, hostId: string): Promise<void> {
  await tx.run("DELETE FROM host_credentials WHERE host_id = ?", [hostId]);
}

/** The machine a host's agent calls `machineId` (its resource id there), newest first. */
export async function lockMachineOfHostResource<T>(tx: Tx, hostId: string, resourceId: string): Promise<T | undefined> {
  return tx.get<T>(`SELECT * FROM machines WHERE host_id = ? AND resource_id = ? ORDER BY created_at DESC LIMIT 1${tx.forUpdate}`, [hostId, resourceId]);
}

/** Machines of a host that are not destroyed: what the switch retires. */
export async function liveMachinesOfHost<T>(tx: Tx, hostId: string): Promise<T[]> {
  return tx.all<T>(`SELECT * FROM machines WHERE host_id = ? AND state <> 'destroyed' ORDER BY id${tx.forUpdate}`, [hostId]);
}
