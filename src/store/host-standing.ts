/**
 * Standing epochs (migration 10): every standing change moves the host's
 * `standing_epoch` on; `standing_acked` is the highest epoch its agent
 * acknowledged (stored durably, with every launch that began before it
 * ended: src/agent/standing.ts). A launch carries the epoch it was decided
 * under, and the agent refuses one older than its withdrawal. Until the
 * agent acknowledged a withdrawal the host is reported `withdrawing`
 * (core/host-standing.ts); the push is retried by the `host_standing` due row.
 */
import type { Migration } from "./migrate.js";
import type { Tx } from "./store.js";

export const HOST_STANDING_MIGRATION: Migration = {
  version: 10,
  name: "host standing epochs",
  sql: `
ALTER TABLE host_accounts ADD COLUMN standing_epoch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE host_accounts ADD COLUMN standing_acked BIGINT NOT NULL DEFAULT 0;
`,
};

/**
 * Migration 23: an operator's attestation that a host is gone for good
 * (`berth alloc standing H withdrawn --host-gone`) is recorded as the
 * standing epoch it was given under (`gone_epoch`; NULL: never). Only while
 * it is the current epoch may `alloc resolve --host-gone` end a cleanup
 * unproven: an acknowledged withdrawal alone is not the operator's word
 * (its agent lives, and its sandbox may still run).
 */
export const HOST_GONE_MIGRATION: Migration = {
  version: 23,
  name: "host gone attestation",
  sql: `
ALTER TABLE host_accounts ADD COLUMN gone_epoch BIGINT;
`,
};

/** Records an operator's attestation that the host is gone, under the standing epoch it came with. */
export async function attestHostGone(tx: Tx, hostId: string, epoch: number): Promise<void> {
  await tx.run("UPDATE host_accounts SET gone_epoch = ? WHERE host_id = ?", [epoch, hostId]);
}

/** Records the agent's acknowledgment of `epoch` (never moves backwards). */
export async function ackStanding(tx: Tx, hostId: string, epoch: number): Promise<void> {
  await tx.run("UPDATE host_accounts SET standing_acked = ? WHERE host_id = ? AND standing_acked < ?", [epoch, hostId, epoch]);
}
