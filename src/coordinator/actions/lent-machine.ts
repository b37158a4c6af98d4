/**
 * The machine in every borrow reply, keeper and portable alike (the first
 * answer, a resent borrow's answer, a grant's view): its id, the generation
 * it was lent at, and how to reach it over SSH. One shape, built here only.
 */
import { BerthError } from "../../core/errors.js";
import type { Tx } from "../../store/store.js";
import { readMachine, type MachineRow } from "../../store/machines.js";
import { readPool } from "../../store/pools.js";

export function lentMachine(m: MachineRow, generation: number) {
  return { id: m.id, generation, ssh: { host: m.ssh_host, port: m.ssh_port, user: m.ssh_user, hostKey: m.host_key } };
}

/**
 * What the answer to a resent borrow needs besides the borrow record (keeper
 * and portable): its machine and its pool, or `borrow_not_active` when the
 * machine is gone.
 */
export async function resentBorrowMachine(tx: Tx, borrowId: string, machineId: string, org: string, poolName: string) {
  const m = await readMachine(tx, machineId);
  const pool = await readPool(tx, org, poolName);
  if (!m || !pool) throw new BerthError("borrow_not_active", `borrow_not_active: borrow ${borrowId}'s machine is gone; borrow again`);
  return { m, pool };
}
