/**
 * Row shapes as the SQL returns them, and the small shared writes every
 * transition uses (audit trail, due index). Ids read back from storage go
 * through the same `parseId` as ids from requests.
 */
import type { Tx } from "./store.js";
import type { PoolRecord } from "../core/pool.js";
import type { MachineState } from "../core/machine.js";

export interface PoolRow {
  org: string;
  name: string;
  access: string;
  provider: string;
  compatibility_key: string;
  identity: string | null;
  min_ready: number;
  max_ready: number;
  hard_ttl_ms: number;
  heartbeat_ms: number;
  keeper_key: string | null;
  created_at: number;
  updated_at: number;
}

export function poolFromRow(r: PoolRow): PoolRecord {
  return {
    org: r.org,
    name: r.name,
    access: r.access as PoolRecord["access"],
    provider: r.provider as PoolRecord["provider"],
    compatibilityKey: r.compatibility_key,
    identity: r.identity ? (JSON.parse(r.identity) as PoolRecord["identity"]) : null,
    minReady: r.min_ready,
    maxReady: r.max_ready,
    hardTtlMs: r.hard_ttl_ms,
    heartbeatMs: r.heartbeat_ms,
    keeperKey: r.keeper_key,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

export interface MachineRow {
  id: string;
  org: string;
  pool: string;
  access: string;
  provider: string;
  resource_id: string;
  host_id: string | null;
  state: MachineState;
  generation: number;
  incarnation: string | null;
  ssh_host: string | null;
  ssh_port: number | null;
  ssh_user: string | null;
  host_key: string | null;
  claim_id: string | null;
  lent_to: string | null;
  created_at: number;
  state_since: number;
  ready_since: number | null;
  hard_expires_at: number;
  reason: string | null;
}

export interface BorrowRow {
  id: string;
  org: string;
  pool: string;
  machine_id: string;
  principal: string;
  token_hash: string;
  state: "active" | "returned" | "abandoned" | "expired";
  generation: number;
  created_at: number;
  heartbeat_deadline: number;
  expires_at: number;
  ended_at: number | null;
  reason: string | null;
}

export interface ClaimRow {
  id: string;
  org: string;
  pool: string;
  token_hash: string;
  state: "open" | "consumed" | "expired";
  created_at: number;
  expires_at: number;
  machine_id: string | null;
}

export interface AuditEntry {
  at: number;
  machineId: string;
  subject: string | null;
  event: string;
  from: string | null;
  to: string;
  generation: number;
  actor: string;
}

export async function audit(tx: Tx, e: AuditEntry): Promise<void> {
  await tx.run(
    "INSERT INTO audit (at, machine_id, subject, event, from_state, to_state, generation, actor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    [e.at, e.machineId, e.subject, e.event, e.from, e.to, e.generation, e.actor],
  );
}

/** Kinds of rows in the due index; each names what its `ref` points at. */
export type DueKind = "heartbeat" | "claim" | "fill" | "ttl" | "retention" | "op" | "ack" | "grant" | "revoke";

export async function setDue(tx: Tx, kind: DueKind, ref: string, at: number): Promise<void> {
  await tx.run("INSERT INTO due (kind, ref, due_at) VALUES (?, ?, ?) ON CONFLICT (kind, ref) DO UPDATE SET due_at = excluded.due_at", [kind, ref, at]);
}

/** Sets the due time only if the row is absent or due later (never postpones an earlier wake). */
export async function setDueNoLater(tx: Tx, kind: DueKind, ref: string, at: number): Promise<void> {
  await tx.run(
    "INSERT INTO due (kind, ref, due_at) VALUES (?, ?, ?) ON CONFLICT (kind, ref) DO UPDATE SET due_at = excluded.due_at WHERE due.due_at > excluded.due_at",
    [kind, ref, at],
  );
}

export async function clearDue(tx: Tx, kind: DueKind, ref: string): Promise<void> {
  await tx.run("DELETE FROM due WHERE kind = ? AND ref = ?", [kind, ref]);
}

export function poolRef(org: string, pool: string): string {
  return `${org}:${pool}`;
}
