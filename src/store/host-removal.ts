/**
 * An operator's recovery of a host (migration 9, docs/host-identity.md
 * "Recovery by an operator"): `reset_token_id` names the one-time enroll
 * token `berth host reset-identity` issued (the only token that binds the
 * awaiting host a key again), `removing_since` marks a host `berth host rm`
 * is removing (it takes no machine or allocation; its row goes once nothing
 * of it is live).
 */
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";

export const HOST_REMOVAL_MIGRATION: Migration = {
  version: 9,
  name: "host removal and identity reset",
  sql: `
ALTER TABLE hosts ADD COLUMN reset_token_id TEXT;
ALTER TABLE hosts ADD COLUMN removing_since BIGINT;
`,
};

export interface HostRemovalColumns {
  reset_token_id: string | null;
  removing_since: number | null;
}

export async function setResetToken(tx: Tx, hostId: string, tokenId: string | null): Promise<void> {
  await tx.run("UPDATE hosts SET reset_token_id = ? WHERE id = ?", [tokenId, hostId]);
}

export async function markRemoving(tx: Tx, hostId: string, now: number): Promise<void> {
  await tx.run("UPDATE hosts SET removing_since = ? WHERE id = ? AND removing_since IS NULL", [now, hostId]);
}

/** Revokes an API token by id (a reset's one-time enroll token once used or replaced). */
export async function revokeTokenById(tx: Tx, tokenId: string, now: number): Promise<void> {
  await tx.run("UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", [now, tokenId]);
}

/** What still lives on a host: machines not destroyed, allocations not released. */
export async function liveOnHost(tx: Tx, hostId: string): Promise<{ machines: number; allocations: number }> {
  const m = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE host_id = ? AND state <> 'destroyed'", [hostId]);
  const a = await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM allocations WHERE host_id = ? AND state <> 'released'", [hostId]);
  return { machines: Number(m?.n ?? 0), allocations: Number(a?.n ?? 0) };
}

/** The host's row and everything that is only about it (credentials, capacity account). */
export async function deleteHostRow(tx: Tx, hostId: string): Promise<void> {
  await tx.run("DELETE FROM host_credentials WHERE host_id = ?", [hostId]);
  await tx.run("DELETE FROM host_accounts WHERE host_id = ?", [hostId]);
  await tx.run("DELETE FROM hosts WHERE id = ?", [hostId]);
}
