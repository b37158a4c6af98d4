/**
 * `berth aws orphans`: what berth may be paying for that nothing accounts
 * for, looked up in every (region, deployment) the sweep covers (today's
 * configuration and every launch record, sweep.ts):
 *
 *   - instances carrying berth's tags whose machine has no live record
 *     (`no live machine`: the sweep would terminate them), or that match no
 *     launch record (`unrecorded`: launched before records existed, or by
 *     another database); an unrecorded instance of a live machine is listed
 *     and kept;
 *   - open launch records whose instance is gone (terminated, or no longer
 *     listed by EC2); those of a live machine are left to its destroy and
 *     the ready check.
 *
 * `end` terminates the instances with no live machine and closes the
 * records whose instance is gone; nothing else is touched.
 */
import { byInstanceId, stateOf, terminate } from "./ec2.js";
import { sweepOrphans, type LiveMachines, type SweptInstance } from "./sweep.js";
import type { AwsProvider } from "./aws-provider.js";
import type { LaunchRecord } from "../../store/aws-launches.js";

export interface OrphanInstance extends SweptInstance {
  /** Why it is listed. */
  why: Array<"no live machine" | "unrecorded">;
  /** `end` terminates it (no live machine claims it). */
  terminate: boolean;
}

export interface GoneRecord {
  clientToken: string;
  machineId: string;
  region: string;
  deployment: string;
  instanceId: string;
  state: string;
  /** `end` closes it (its machine has no live record; a live machine's is left to its destroy and the ready check). */
  close: boolean;
}

export interface OrphanReport {
  scopes: Array<{ region: string; deployment: string }>;
  instances: OrphanInstance[];
  records: GoneRecord[];
}

export async function findOrphans(provider: AwsProvider, live: LiveMachines): Promise<OrphanReport> {
  const swept = await sweepOrphans(provider, live, { terminate: false });
  const instances: OrphanInstance[] = [];
  for (const i of swept.instances) {
    const why: OrphanInstance["why"] = [];
    if (i.orphan) why.push("no live machine");
    if (!i.recorded) why.push("unrecorded");
    if (why.length > 0) instances.push({ ...i, why, terminate: i.orphan });
  }
  const records: GoneRecord[] = [];
  const open = await provider.records.open();
  const alive = await live([...new Set(open.map((r) => r.machineId))]);
  for (const rec of open) {
    if (!rec.instanceId) continue; // a launch whose answer was lost is resolved by its operation (src/store/aws-launches.ts)
    const inst = await byInstanceId(provider.clientsFor(rec.region).ec2, rec.instanceId);
    const state = inst ? stateOf(inst) : "not listed";
    if (state === "terminated" || state === "not listed") records.push(goneRecord(rec, state, !alive.has(rec.machineId)));
  }
  return { scopes: swept.scopes, instances, records };
}

function goneRecord(r: LaunchRecord, state: string, close: boolean): GoneRecord {
  return { clientToken: r.clientToken, machineId: r.machineId, region: r.region, deployment: r.deployment, instanceId: r.instanceId!, state, close };
}

/** Terminates the listed instances that no live machine claims, and closes the records whose instance is gone. */
export async function endOrphans(provider: AwsProvider, report: OrphanReport): Promise<{ terminated: string[]; closed: string[] }> {
  const terminated: string[] = [];
  const byRegion = new Map<string, string[]>();
  for (const i of report.instances) if (i.terminate) byRegion.set(i.region, [...(byRegion.get(i.region) ?? []), i.instanceId]);
  for (const [region, ids] of byRegion) {
    await terminate(provider.clientsFor(region).ec2, ids);
    terminated.push(...ids);
  }
  const closed: string[] = [];
  for (const r of report.records) {
    if (!r.close) continue;
    await provider.records.ended(r.clientToken, provider.now, `instance ${r.state} (berth aws orphans)`);
    closed.push(r.clientToken);
  }
  return { terminated, closed };
}
