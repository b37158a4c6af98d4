/**
 * Start-up sweep: what did the previous agent process leave behind?
 *
 * Runs once, after the store's lock is held and before the SSH gateway or the
 * API admits anything. For each machine record (not destroyed):
 *
 *   - `creating` / `destroying`: the previous process died mid-operation. The
 *     machine is left as it is (pending) for the coordinator's retried
 *     operation (same opId) to finish; no key of it authenticates meanwhile.
 *   - `running` and the runtime reports the recorded incarnation: re-attached.
 *     Its keys are reloaded; expired ones and ones of an older generation are
 *     dropped durably. Their expiry timers are armed again.
 *   - `running` and the runtime reports another incarnation: when an
 *     unfinished fence, scrub or create of this machine explains it (the process died
 *     between the runtime's change and the record of it), pending, for the
 *     retried operation to record the new incarnation. Otherwise `mismatch`:
 *     recorded durably, reported in the log, health and `machines`; its keys
 *     never authenticate and every operation on it is refused. The agent
 *     never signals it.
 *   - `running` and the runtime has no such machine: `mismatch` (missing);
 *     only `destroy` is accepted for it (nothing is left to signal).
 *   - the runtime cannot be asked (an unreadable runtime record): `mismatch`
 *     (unreadable), the conservative reading, never "nothing there".
 *   - `mismatch` from an earlier start: stays so.
 *
 * Runtime machines with no record (`runtime.list()`) are reported, never
 * touched. They cannot be this agent's own: `create` writes the machine's
 * record (state `creating`) durably BEFORE it asks the runtime, so every
 * machine this state directory's agents ever created has a record.
 */
import type { AgentKeys } from "./keys.js";
import { errorMessage, type AgentLog } from "./log.js";
import type { Runtime } from "./runtime/types.js";
import type { AgentStore, MachineRecord } from "./store/store.js";
import type { MachineNetworks, SweepReport } from "./network/manager.js";

export interface RecoveryDeps {
  /** The machine and operation records the previous process left. */
  store: AgentStore;
  /** Asked what it sees of each machine (never told to act here). */
  runtime: Runtime;
  /** Re-attached machines' keys are reloaded into it. */
  keys: AgentKeys;
  now: () => number;
  log: AgentLog;
  /** Machine networks: a running machine's must be exactly as recorded; every other one is stale and removed. */
  network?: MachineNetworks | null;
}

export interface RecoveryReport {
  reattached: string[];
  /** Mid-operation: left for the coordinator's retried operation. */
  pending: Array<{ machineId: string; ops: string[] }>;
  mismatched: Array<{ machineId: string; why: string }>;
  /** Runtime machines with no record: reported, never touched. */
  unrecorded: string[];
  /** Keys dropped because they had expired (or were of an older generation) while no agent ran. */
  droppedKeys: number;
  /** Stale machine networks removed: of machines not running (created, destroyed or mid-operation), and objects no record explains. */
  staleNetworks: SweepReport;
}

export async function recover(deps: RecoveryDeps): Promise<RecoveryReport> {
  const { store, log } = deps;
  const report: RecoveryReport = {
    reattached: [], pending: [], mismatched: [], unrecorded: [], droppedKeys: 0,
    staleNetworks: { records: 0, netns: 0, links: 0, tables: 0, leases: 0 },
  };
  const records = store.machines.list(true);
  for (const m of records) {
    if (m.state !== "destroyed") await recoverMachine(deps, report, m);
  }
  if (deps.network) await sweepNetworks(deps, deps.network, report);
  await findUnrecorded(deps, report, records);
  log.info(
    {
      reattached: report.reattached.length,
      pending: report.pending.length,
      mismatched: report.mismatched.length,
      unrecorded: report.unrecorded.length,
      droppedKeys: report.droppedKeys,
      staleNetworks: report.staleNetworks.records + report.staleNetworks.netns,
    },
    "recovery sweep done",
  );
  return report;
}

/** One machine record (not destroyed): pending, mismatched or re-attached, as the header says. */
async function recoverMachine(deps: RecoveryDeps, report: RecoveryReport, m: MachineRecord): Promise<void> {
  const { store, runtime, keys, log } = deps;
  const unfinished = store.operations.unfinished(m.id);
  const pending = (): void => {
    report.pending.push({ machineId: m.id, ops: unfinished.map((o) => o.opId) });
  };
  const mismatch = (why: string): void => {
    store.machines.put({ ...m, state: "mismatch", mismatch: why, updatedAt: deps.now() });
    report.mismatched.push({ machineId: m.id, why });
    log.warn({ machineId: m.id, why }, "machine does not match its record: it is left untouched and reported");
  };

  switch (m.state) {
    case "creating":
    case "destroying":
      pending();
      return;
    case "mismatch":
      report.mismatched.push({ machineId: m.id, why: m.mismatch ?? "unknown" });
      log.warn({ machineId: m.id, why: m.mismatch }, "machine still does not match its record; left untouched");
      return;
    case "running":
      break;
  }

  let seen: { exists: boolean; incarnation: string | null; liveProcesses: number };
  try {
    seen = await runtime.inspect(m.id);
  } catch (e) {
    mismatch(`unreadable: the runtime could not say what machine ${m.id} is (${errorMessage(e)})`);
    return;
  }
  const explained = unfinished.some((o) => o.kind === "fence" || o.kind === "scrub" || o.kind === "provision");
  if (!seen.exists) {
    if (unfinished.some((o) => o.kind === "destroy")) pending();
    else mismatch(`missing: the runtime has no machine ${m.id} (recorded incarnation ${m.incarnation ?? "none"})`);
    return;
  }
  if (seen.incarnation !== m.incarnation) {
    if (explained) pending();
    else mismatch(`incarnation: recorded ${m.incarnation ?? "none"}, the runtime reports ${seen.incarnation ?? "none"}`);
    return;
  }
  if (deps.network && deps.network.intact(m.id) === false) {
    mismatch(`network: the namespace or veth of machine ${m.id} is not the recorded one`);
    return;
  }
  if (deps.network && deps.network.get(m.id) && unfinished.length === 0) {
    // The rules a previous process recorded must be the rules in force (table, addresses, routes).
    const v = await deps.network.verify(m.id, { namespace: true });
    if (!v.ok) {
      mismatch(`network: ${v.why}${v.diff.length > 0 ? `; diff: ${v.diff.join(" | ")}` : ""}`);
      return;
    }
  }
  const dropped = keys.attach(m.id, m.generation);
  report.droppedKeys += dropped.length;
  report.reattached.push(m.id);
  if (unfinished.length > 0) pending();
}

/**
 * A machine that is not running (or held as a mismatch) has no use for a
 * network: mid-provision (the retried provision sets it up again),
 * mid-destroy, destroyed, or never recorded. Removed in order, counted.
 */
async function sweepNetworks(deps: RecoveryDeps, network: MachineNetworks, report: RecoveryReport): Promise<void> {
  try {
    report.staleNetworks = await network.sweep((id) => {
      const m = deps.store.machines.get(id);
      return m !== null && (m.state === "running" || m.state === "mismatch");
    });
  } catch (e) {
    deps.log.warn({ error: errorMessage(e) }, "could not sweep stale machine networks");
  }
}

/** Runtime machines with no record: reported, never touched. */
async function findUnrecorded(deps: RecoveryDeps, report: RecoveryReport, records: MachineRecord[]): Promise<void> {
  try {
    const known = new Set(records.filter((m) => m.state !== "destroyed").map((m: MachineRecord) => m.id));
    report.unrecorded = (await deps.runtime.list()).filter((id) => !known.has(id)).sort();
  } catch (e) {
    deps.log.warn({ error: errorMessage(e) }, "could not list the runtime's machines");
  }
  for (const id of report.unrecorded) {
    deps.log.warn({ machineId: id }, "the runtime has a machine this agent has no record of: reported, never touched");
  }
}
