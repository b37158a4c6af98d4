/**
 * The orphan sweep: no paid resource outlives its record. It looks in every
 * (region, deployment) that today's configuration names AND that any launch
 * record ever named (src/store/aws-launches.ts), so renaming `deployment` or moving a pool
 * to another region leaves nothing unswept. In each, it lists every instance
 * tagged with that deployment (pending, running, stopping, stopped) and
 * terminates those whose `berth:machine` names no live machine record
 * (absent, pruned, or destroyed), or that carry no machine tag at all.
 * Instances of deployments never configured nor recorded are never touched.
 * Termination is only requested here; the next sweep sees whether it happened.
 * It also reports instances that carry berth's tags but match no launch
 * record (launched before records existed, or by another coordinator's
 * database): `berth aws orphans` lists them.
 */
import { describe, tagOf, terminate, TAG } from "./ec2.js";
import type { AwsProvider } from "./aws-provider.js";
import type { Store } from "../../store/store.js";
import { liveMachineIdsOf } from "../../store/machines.js";

export interface SweptInstance {
  instanceId: string;
  region: string;
  deployment: string;
  machineId: string | null;
  state: string;
  /** Its ClientToken matches a launch record. */
  recorded: boolean;
  /** Its machine has no live record: it is (or, with terminate off, would be) terminated. */
  orphan: boolean;
}

export interface SweepReport {
  /** Instances tagged for a swept deployment and not terminated. */
  seen: number;
  /** Instances whose termination was requested now (no live machine record). */
  terminated: string[];
  /** The (region, deployment) pairs looked in. */
  scopes: Array<{ region: string; deployment: string }>;
  instances: SweptInstance[];
}

/** Which of these machine ids have a live (not destroyed) record. */
export type LiveMachines = (machineIds: string[]) => Promise<Set<string>>;

export function liveMachinesIn(store: Store): LiveMachines {
  return async (ids) => {
    if (ids.length === 0) return new Set();
    return new Set(await store.transaction((tx) => liveMachineIdsOf(tx, "aws", ids)));
  };
}

export async function sweepOrphans(provider: AwsProvider, live: LiveMachines, o: { terminate?: boolean } = {}): Promise<SweepReport> {
  const report: SweepReport = { seen: 0, terminated: [], scopes: await sweepScopes(provider), instances: [] };
  for (const { region, deployment } of report.scopes) {
    const { ec2 } = provider.clientsFor(region);
    const found = await describe(ec2, [
      { Name: `tag:${TAG.managed}`, Values: [deployment] },
      { Name: "instance-state-name", Values: ["pending", "running", "stopping", "stopped"] },
    ]);
    report.seen += found.length;
    const alive = await live(found.map((i) => tagOf(i, TAG.machine)).filter((m): m is string => !!m));
    const orphans: string[] = [];
    for (const i of found) {
      const machineId = tagOf(i, TAG.machine) ?? null;
      const orphan = !alive.has(machineId ?? "");
      const rec = i.ClientToken ? await provider.records.byToken(i.ClientToken) : undefined;
      report.instances.push({ instanceId: i.InstanceId!, region, deployment, machineId, state: i.State?.Name ?? "unknown", recorded: !!rec, orphan });
      if (orphan) orphans.push(i.InstanceId!);
    }
    if (o.terminate !== false) {
      await terminate(ec2, orphans);
      report.terminated.push(...orphans);
    }
  }
  return report;
}

/** Today's (region, deployment) pairs and every pair a launch record names, each once. */
export async function sweepScopes(provider: AwsProvider): Promise<Array<{ region: string; deployment: string }>> {
  const all = [...provider.regions().map((region) => ({ region, deployment: provider.deployment })), ...(await provider.records.scopes())];
  const seen = new Set<string>();
  return all.filter((s) => {
    const k = `${s.region}\0${s.deployment}`;
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
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
