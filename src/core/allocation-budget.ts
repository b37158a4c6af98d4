/**
 * Owner budgets. An owner (an API principal an operator admitted) has a
 * budget in four dimensions: vCPU, memory, disk and the number of live
 * allocations. Admission of a new allocation is a pure decision over the
 * budget, what is in use, and the size; a refusal names the first exhausted
 * dimension with the figures, so the owner knows what to release.
 */
import { BerthError } from "./errors.js";
import { diskFigures, gib, type Size } from "./allocation-sizes.js";

export interface Budget {
  vcpu: number;
  memoryMib: number;
  diskMib: number;
  count: number;
}

/** The disk budget of an owner admitted without one (and of owners admitted before disk was counted): 40 GiB (a `large`) per allocation. */
export const DEFAULT_DISK_PER_ALLOCATION_MIB = 40 * 1024;

export type Usage = Budget;

export const ZERO_USAGE: Usage = { vcpu: 0, memoryMib: 0, diskMib: 0, count: 0 };

export type Dimension = "vcpu" | "memory" | "disk" | "count";

export type Admission = { kind: "admit"; after: Usage } | { kind: "refuse"; dimension: Dimension; message: string };

/** Refuses a budget that is not whole and positive in every dimension. */
export function checkBudget(b: Budget): Budget {
  const bad = (what: string, v: number) => !Number.isInteger(v) || v < 1 ? what : null;
  const which = bad("vcpu", b.vcpu) ?? bad("memory", b.memoryMib) ?? bad("disk", b.diskMib) ?? bad("count", b.count);
  if (which) throw new BerthError("invalid_request", `invalid_request: budget ${which} must be a whole number of at least 1`);
  return b;
}

export function admit(budget: Budget, used: Usage, size: Size): Admission {
  if (used.vcpu + size.vcpu > budget.vcpu) {
    return { kind: "refuse", dimension: "vcpu", message: `budget_exhausted: vcpu ${used.vcpu}/${budget.vcpu} used, ${size.name} needs ${size.vcpu}` };
  }
  if (used.memoryMib + size.memoryMib > budget.memoryMib) {
    return {
      kind: "refuse",
      dimension: "memory",
      message: `budget_exhausted: memory ${gib(used.memoryMib)}/${gib(budget.memoryMib)} GiB used, ${size.name} needs ${gib(size.memoryMib)}`,
    };
  }
  if (used.diskMib + size.diskMib > budget.diskMib) {
    const f = diskFigures(used.diskMib, budget.diskMib, size.diskMib);
    return { kind: "refuse", dimension: "disk", message: `budget_exhausted: disk ${f.used}/${f.limit} ${f.unit} used, ${size.name} needs ${f.need}` };
  }
  if (used.count + 1 > budget.count) {
    return { kind: "refuse", dimension: "count", message: `budget_exhausted: allocations ${used.count}/${budget.count} live, ${size.name} needs 1` };
  }
  return { kind: "admit", after: charge(used, size) };
}

export function charge(used: Usage, size: Size): Usage {
  return { vcpu: used.vcpu + size.vcpu, memoryMib: used.memoryMib + size.memoryMib, diskMib: used.diskMib + size.diskMib, count: used.count + 1 };
}

/** Returns a size to the budget; never below zero (a refund of something not charged is a defect the caller sees). */
export function refund(used: Usage, size: Size): Usage {
  const r = { vcpu: used.vcpu - size.vcpu, memoryMib: used.memoryMib - size.memoryMib, diskMib: used.diskMib - size.diskMib, count: used.count - 1 };
  if (r.vcpu < 0 || r.memoryMib < 0 || r.diskMib < 0 || r.count < 0) throw new Error(`refund below zero: ${JSON.stringify({ used, size })}`);
  return r;
}
