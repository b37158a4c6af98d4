/**
 * The allocation ledger: an append-only record of every change to an owner's
 * or a host's account. Each entry is appended while the rows it concerns are
 * locked, so for any one owner or host the sequence order is the commit
 * order, and an audit can replay it (test/store/allocations-contract).
 */
import type { Tx } from "./store.js";

export type LedgerEvent = "reserve" | "refund" | "budget" | "host_account";

export interface LedgerEntry {
  seq: number;
  at: number;
  event: LedgerEvent;
  org: string;
  allocation_id: string | null;
  owner: string | null;
  host_id: string | null;
  vcpu: number;
  memory_mib: number;
  /** 0 where the entry predates the disk dimension. */
  disk_mib: number;
  detail: string | null;
  actor: string;
}

export async function appendLedger(tx: Tx, e: Omit<LedgerEntry, "seq">): Promise<void> {
  await tx.run("INSERT INTO allocation_ledger (at, event, org, allocation_id, owner, host_id, vcpu, memory_mib, disk_mib, detail, actor) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
    e.at, e.event, e.org, e.allocation_id, e.owner, e.host_id, e.vcpu, e.memory_mib, e.disk_mib, e.detail, e.actor,
  ]);
}

export async function readLedger(tx: Tx, org: string): Promise<LedgerEntry[]> {
  return tx.all<LedgerEntry>("SELECT * FROM allocation_ledger WHERE org = ? ORDER BY seq", [org]);
}
