/**
 * Admission of owners and host standing, by operators.
 *
 * An owner is an API principal (token id) of the organisation; an operator
 * admits it with a budget, or changes the budget later (usage is kept; a
 * budget lowered below what is in use refuses new allocations until enough
 * are released). Host standing (ready, draining, withdrawn, not_ready) decides
 * whether placement may choose the host and whether a placed allocation may
 * still launch there. Both changes are written to the allocation ledger while
 * their row is locked, so an audit sees them in order with reservations.
 */
import { BerthError } from "../../core/errors.js";
import { parseId } from "../../core/ids.js";
import { checkBudget, DEFAULT_DISK_PER_ALLOCATION_MIB, type Budget } from "../../core/allocation-budget.js";
import type { HostStanding } from "../../core/allocation-placement.js";
import { clearDue, setDue } from "../../store/due.js";
import { ackStanding, attestHostGone } from "../../store/host-standing.js";
import { STANDING_RETRY_MS } from "./host-standing.js";
import { isPrincipalOf, listOwners, lockOwner, upsertOwnerBudget, type OwnerRecord } from "../../store/allocation-owners.js";
import { lockHostAccount, setHostStanding, upsertHostAccount, listHostAccounts } from "../../store/host-accounts.js";
import { appendLedger } from "../../store/allocation-ledger.js";
import type { Tx } from "../../store/store.js";
import type { AllocCtx } from "./allocation-context.js";

/** A budget as asked: without a disk budget, the owner's is kept (a new owner gets 40 GiB per allocation of its count). */
export type BudgetInput = Omit<Budget, "diskMib"> & { diskMib?: number | undefined };

export async function setOwnerBudget(ctx: AllocCtx, org: string, rawOwner: string, asked: BudgetInput, mustExist: boolean): Promise<OwnerRecord> {
  const owner = parseId(rawOwner, "owner");
  if (asked.diskMib !== undefined) checkBudget({ ...asked, diskMib: asked.diskMib });
  else checkBudget({ ...asked, diskMib: 1 });
  const now = ctx.now();
  return ctx.store.transaction(async (tx) => {
    if (!(await isPrincipalOf(tx, owner, org))) throw new BerthError("not_found", `not_found: no API token ${owner} in this organisation; owners are API principals (see berth token ls)`);
    const before = await lockOwner(tx, org, owner);
    if (mustExist && !before) throw new BerthError("not_admitted", `not_admitted: ${owner} is not admitted yet; run berth owner admit ${owner} first`);
    const budget: Budget = { ...asked, diskMib: asked.diskMib ?? before?.budget.diskMib ?? asked.count * DEFAULT_DISK_PER_ALLOCATION_MIB };
    await upsertOwnerBudget(tx, org, owner, budget, now);
    await appendLedger(tx, { at: now, event: "budget", org, allocation_id: null, owner, host_id: null, vcpu: budget.vcpu, memory_mib: budget.memoryMib, disk_mib: budget.diskMib, detail: String(budget.count), actor: ctx.actor });
    return (await lockOwner(tx, org, owner))!;
  }, { name: "owner_budget" });
}

export async function ownersOf(ctx: AllocCtx, org: string): Promise<OwnerRecord[]> {
  return ctx.store.transaction((tx) => listOwners(tx, org));
}

/**
 * Records a standing change under a new epoch and arms its push to the agent
 * (actions/host-standing.ts), in one transaction; returns the host id and epoch.
 */
/**
 * `goneBy`: an operator (this token id) attests the host is gone for good —
 * its agent will never answer again (machine destroyed, disk lost). Only with
 * `withdrawn`: the withdrawal then counts as acknowledged without the agent
 * (`withdrawing` ends), recorded as the operator's word in the ledger, and
 * its allocations' cleanups can be ended by `berth alloc resolve ID
 * --host-gone`. It is an attestation, not a proof: an agent that does come
 * back is not pushed this standing again.
 */
export async function changeHostStanding(ctx: AllocCtx, org: string, rawHost: string, standing: HostStanding, goneBy: string | null = null): Promise<{ hostId: string; epoch: number }> {
  const hostId = parseId(rawHost, "host");
  const now = ctx.now();
  if (goneBy !== null && standing !== "withdrawn") throw new BerthError("invalid_request", `invalid_request: only a withdrawn host can be attested gone (berth alloc standing ${hostId} withdrawn --host-gone)`);
  return ctx.store.transaction(async (tx) => {
    const h = await lockHostAccount(tx, hostId);
    if (!h || h.org !== org) throw new BerthError("not_found", `not_found: no host ${hostId} in this organisation`);
    const epoch = await setHostStanding(tx, hostId, standing, now);
    if (goneBy !== null) {
      await attestHostGone(tx, hostId, epoch);
      await ackStanding(tx, hostId, epoch);
      await clearDue(tx, "host_standing", hostId);
    } else await setDue(tx, "host_standing", hostId, now + STANDING_RETRY_MS);
    await appendLedger(tx, { at: now, event: "host_account", org, allocation_id: null, owner: null, host_id: hostId, vcpu: h.capacity.vcpu, memory_mib: h.capacity.memoryMib, disk_mib: h.capacity.diskMib ?? 0, detail: `${standing} epoch=${epoch}${goneBy !== null ? ` host gone: attested by operator ${goneBy}, not acknowledged by its agent` : ""}`, actor: ctx.actor });
    return { hostId, epoch };
  }, { name: "host_standing" });
}

/** Called in the enrollment transaction: the host's account follows its declared capacity. */
export async function accountEnrolledHost(tx: Tx, actor: string, host: { id: string; org: string; name: string; vcpu: number; memoryMib: number; diskMib?: number | null; slots: number }, now: number): Promise<void> {
  await upsertHostAccount(tx, host.id, host.org, host.name, { vcpu: host.vcpu, memoryMib: host.memoryMib, diskMib: host.diskMib ?? null, slots: host.slots }, now);
  const h = await lockHostAccount(tx, host.id);
  await appendLedger(tx, { at: now, event: "host_account", org: host.org, allocation_id: null, owner: null, host_id: host.id, vcpu: host.vcpu, memory_mib: host.memoryMib, disk_mib: host.diskMib ?? 0, detail: `${h?.standing ?? "ready"} slots=${host.slots}`, actor });
}

export { listHostAccounts };
