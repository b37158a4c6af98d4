/**
 * Owner budget rows (`alloc_owners`): one per admitted owner, holding the
 * budget and what is in use. A reservation or refund locks exactly this row
 * of the owner concerned (and the chosen host's account row), so unrelated
 * owners never conflict.
 */
import type { Tx } from "./store.js";
import type { Budget, Usage } from "../core/allocation-budget.js";

export interface OwnerRow {
  org: string;
  owner: string;
  budget_vcpu: number;
  budget_memory_mib: number;
  budget_count: number;
  budget_disk_mib: number;
  used_vcpu: number;
  used_memory_mib: number;
  used_disk_mib: number;
  used_count: number;
  admitted_at: number;
  updated_at: number;
}

export interface OwnerRecord {
  org: string;
  owner: string;
  budget: Budget;
  used: Usage;
  admittedAt: number;
  updatedAt: number;
}

export function ownerFromRow(r: OwnerRow): OwnerRecord {
  return {
    org: r.org,
    owner: r.owner,
    budget: { vcpu: r.budget_vcpu, memoryMib: r.budget_memory_mib, diskMib: Number(r.budget_disk_mib), count: r.budget_count },
    used: { vcpu: r.used_vcpu, memoryMib: r.used_memory_mib, diskMib: Number(r.used_disk_mib), count: r.used_count },
    admittedAt: r.admitted_at,
    updatedAt: r.updated_at,
  };
}

/** Reads and locks one owner's row (FOR UPDATE on PostgreSQL). */
export async function lockOwner(tx: Tx, org: string, owner: string): Promise<OwnerRecord | null> {
  const r = await tx.get<OwnerRow>(`SELECT * FROM alloc_owners WHERE org = ? AND owner = ?${tx.forUpdate}`, [org, owner]);
  return r ? ownerFromRow(r) : null;
}

export async function getOwner(tx: Tx, org: string, owner: string): Promise<OwnerRecord | null> {
  const r = await tx.get<OwnerRow>("SELECT * FROM alloc_owners WHERE org = ? AND owner = ?", [org, owner]);
  return r ? ownerFromRow(r) : null;
}

export async function listOwners(tx: Tx, org: string): Promise<OwnerRecord[]> {
  return (await tx.all<OwnerRow>("SELECT * FROM alloc_owners WHERE org = ? ORDER BY owner", [org])).map(ownerFromRow);
}

/** Admits an owner with a budget, or sets the budget of one already admitted (usage is kept). */
export async function upsertOwnerBudget(tx: Tx, org: string, owner: string, b: Budget, now: number): Promise<void> {
  await tx.run(
    `INSERT INTO alloc_owners (org, owner, budget_vcpu, budget_memory_mib, budget_disk_mib, budget_count, used_vcpu, used_memory_mib, used_disk_mib, used_count, admitted_at, updated_at)
     VALUES (?, ?, ?, ?, ?, ?, 0, 0, 0, 0, ?, ?)
     ON CONFLICT (org, owner) DO UPDATE SET budget_vcpu = excluded.budget_vcpu, budget_memory_mib = excluded.budget_memory_mib, budget_disk_mib = excluded.budget_disk_mib, budget_count = excluded.budget_count, updated_at = excluded.updated_at`,
    [org, owner, b.vcpu, b.memoryMib, b.diskMib, b.count, now, now],
  );
}

/** Writes the owner's usage; the caller holds the row lock and computed `used` from the locked row. */
export async function setOwnerUsage(tx: Tx, org: string, owner: string, used: Usage, now: number): Promise<void> {
  await tx.run("UPDATE alloc_owners SET used_vcpu = ?, used_memory_mib = ?, used_disk_mib = ?, used_count = ?, updated_at = ? WHERE org = ? AND owner = ?", [
    used.vcpu, used.memoryMib, used.diskMib, used.count, now, org, owner,
  ]);
}

/** Whether `id` is an API token (principal) of `org`: owners are principals. */
export async function isPrincipalOf(tx: Tx, id: string, org: string): Promise<boolean> {
  return (await tx.get<{ id: string }>("SELECT id FROM api_tokens WHERE id = ? AND org = ?", [id, org])) !== undefined;
}

/** Every owner of every organisation with its token's label (metrics: they name owners by label, never by token id). */
export async function allOwners(tx: Tx): Promise<Array<OwnerRecord & { label: string | null }>> {
  const rows = await tx.all<OwnerRow & { label: string | null }>("SELECT o.*, t.label AS label FROM alloc_owners o LEFT JOIN api_tokens t ON t.id = o.owner ORDER BY o.org, o.owner");
  return rows.map((r) => ({ ...ownerFromRow(r), label: r.label }));
}
