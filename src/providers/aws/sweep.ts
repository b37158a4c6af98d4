/**
 * The orphan sweep: no paid resource outlives its record. It lists every
 * instance tagged with this deployment (pending, running, stopping, stopped)
 * and terminates those whose `berth:machine` names no live machine record
 * (absent, pruned, or destroyed), or that carry no machine tag at all.
 * Instances of other deployments are never touched. Termination is only
 * requested here; the next sweep sees whether it happened.
 */
import { describe, tagOf, terminate, TAG } from "./ec2.js";
import type { AwsProvider } from "./aws-provider.js";
import type { Store } from "../../store/store.js";

export interface SweepReport {
  /** Instances tagged for this deployment and not terminated. */
  seen: number;
  /** Instances whose termination was requested now (no live machine record). */
  terminated: string[];
}

/** Which of these machine ids have a live (not destroyed) record. */
export type LiveMachines = (machineIds: string[]) => Promise<Set<string>>;

export function liveMachinesIn(store: Store): LiveMachines {
  return async (ids) => {
    if (ids.length === 0) return new Set();
    const rows = await store.transaction((tx) =>
      tx.all<{ id: string }>(`SELECT id FROM machines WHERE provider = 'aws' AND state <> 'destroyed' AND id IN (${ids.map(() => "?").join(", ")})`, ids),
    );
    return new Set(rows.map((r) => r.id));
  };
}

export async function sweepOrphans(provider: AwsProvider, live: LiveMachines): Promise<SweepReport> {
  const report: SweepReport = { seen: 0, terminated: [] };
  for (const region of provider.regions()) {
    const { ec2 } = provider.clientsFor(region);
    const found = await describe(ec2, [
      { Name: `tag:${TAG.managed}`, Values: [provider.deployment] },
      { Name: "instance-state-name", Values: ["pending", "running", "stopping", "stopped"] },
    ]);
    report.seen += found.length;
    const alive = await live(found.map((i) => tagOf(i, TAG.machine)).filter((m): m is string => !!m));
    const orphans = found.filter((i) => !alive.has(tagOf(i, TAG.machine) ?? "")).map((i) => i.InstanceId!);
    await terminate(ec2, orphans);
    report.terminated.push(...orphans);
  }
  return report;
}

/** Runs the sweep every `everyMs` until stopped; failures are logged and retried next round. */
export function startSweepLoop(provider: AwsProvider, live: LiveMachines, everyMs: number, log: { warn: (o: object, m: string) => void; info: (o: object, m: string) => void }): () => void {
  let stopped = false;
  const round = async () => {
    try {
      const r = await sweepOrphans(provider, live);
      if (r.terminated.length > 0) log.info({ terminated: r.terminated }, "aws sweep terminated instances with no live machine record");
    } catch (e) {
      log.warn({ err: e instanceof Error ? e.message : String(e) }, "aws sweep failed; retrying next round");
    }
  };
  const timer = setInterval(() => {
    if (!stopped) void round();
  }, everyMs);
  timer.unref();
  void round();
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}
