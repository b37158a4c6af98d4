/**
 * Recovery of session records a previous agent process left (hard loss), and
 * the later sweep of records a live release had to retain.
 *
 * Sessions are never reattached: the SSH connection died with the process that
 * owned it. A retained record is made `clean` only after the runtime shows its
 * processes are gone:
 *   - the exec client (a host process) is absent, or its pid now names another
 *     process (different start time);
 *   - the recorded group is empty — for the process runtime probed on the host;
 *     for gvisor, implied by the machine being gone or restarted (a new
 *     incarnation), else probed inside the machine;
 *   - an `intent` without identities is clean only when the machine is gone,
 *     restarted, or runs no process at all.
 * The only signal recovery sends is to an exact match: the recorded exec client
 * (pid and start time both equal) or, for the process runtime, the recorded
 * group while its exact leader is still alive. Anything else — a live group
 * whose leader is gone, an unverifiable observation — stays recorded and is
 * reported; the machine's fence removes it, and a later sweep cleans it.
 */
import type { ProcessIdentity, Runtime } from "../runtime/types.js";
import type { SessionRecord, SessionStore } from "./store.js";
import type { Log } from "./types.js";
import { hostGroupPresence, matchHostProcess, probeGroup, type GroupPresence, type HostProcessMatch } from "./probe.js";

export interface RecoveryObservation {
  /** What the runtime sees of the session's machine. */
  machine: { exists: boolean; incarnation: string | null; liveProcesses: number } | null;
  /** The recorded exec client, on the host (null: none recorded). */
  client: HostProcessMatch | null;
  /** The recorded group leader, where the host can see it (process runtime); null otherwise. */
  leader: HostProcessMatch | null;
  /** The recorded group (null: none recorded). */
  group: GroupPresence | null;
}

export type RecoveryDecision =
  | { kind: "clean"; evidence: string }
  | { kind: "stop_exact"; target: "client" | "group"; why: string }
  | { kind: "retain"; why: string };

/** What to do with one unfinished record, given what was observed. Pure. */
export function recoveryDecision(rec: SessionRecord, o: RecoveryObservation): RecoveryDecision {
  const machineGone = o.machine !== null && !o.machine.exists;
  const restarted =
    o.machine !== null && o.machine.exists && rec.incarnation !== null && o.machine.incarnation !== null && o.machine.incarnation !== rec.incarnation;
  if (rec.client === null || rec.leader === null) {
    if (machineGone) return { kind: "clean", evidence: "no identities recorded; the machine no longer exists" };
    if (restarted) return { kind: "clean", evidence: `no identities recorded; the machine restarted (incarnation ${rec.incarnation} -> ${o.machine!.incarnation})` };
    if (o.machine !== null && o.machine.liveProcesses === 0) return { kind: "clean", evidence: "no identities recorded; the machine runs no process" };
    return { kind: "retain", why: "an exec may have started before its identities were recorded; retained until the machine is fenced" };
  }
  // The leader first: while it is alive the recorded group number is provably the session's own.
  if (o.leader === "match") return { kind: "stop_exact", target: "group", why: "the recorded group leader is still alive" };
  if (o.client === "match") return { kind: "stop_exact", target: "client", why: "the recorded exec client is still alive" };
  if (machineGone) return { kind: "clean", evidence: "exec client gone; the machine no longer exists" };
  if (restarted) return { kind: "clean", evidence: `exec client gone; the machine restarted (incarnation ${rec.incarnation} -> ${o.machine!.incarnation})` };
  switch (o.group) {
    case "absent":
      return { kind: "clean", evidence: `exec client gone; process group ${rec.leader.pgid} is empty` };
    case "present":
      return { kind: "retain", why: `process group ${rec.leader.pgid} still has members but its leader is gone; never signalled, left for the machine's fence` };
    case "unknown":
    case null:
      return { kind: "retain", why: `absence of process group ${rec.leader.pgid} could not be verified` };
  }
}

export interface RecoveryReport {
  cleaned: { sessionId: string; machineId: string; evidence: string }[];
  retained: { sessionId: string; machineId: string; why: string }[];
}

export interface RecoveryDeps {
  store: SessionStore;
  runtime: Runtime;
  now: () => number;
  log: Log;
  /** Records owned by a live session of this process; never touched. */
  skip?: ReadonlySet<string>;
  /** Wait after SIGKILL of an exact match before observing again. */
  killWaitMs?: number;
}

async function observe(runtime: Runtime, rec: SessionRecord): Promise<RecoveryObservation> {
  let machine: RecoveryObservation["machine"] = null;
  try {
    machine = await runtime.inspect(rec.machineId);
  } catch {
    machine = null;
  }
  const client = rec.client ? matchHostProcess(rec.client) : null;
  const hostVisibleLeader = runtime.kind === "process" && rec.leader !== null;
  const leader = hostVisibleLeader ? matchHostProcess(rec.leader!) : null;
  let group: GroupPresence | null = null;
  if (rec.leader) {
    if (runtime.kind === "process") group = hostGroupPresence(rec.leader.pgid);
    else if (machine && machine.exists && (rec.incarnation === null || machine.incarnation === rec.incarnation))
      group = await probeGroup(runtime, rec.machineId, rec.leader.pgid, client !== "match");
  }
  return { machine, client, leader, group };
}

/** SIGKILL an exact host process (or its group), re-verifying the identity immediately before. */
function killExact(id: ProcessIdentity, group: boolean): boolean {
  if (matchHostProcess(id) !== "match") return false;
  try {
    process.kill(group ? -id.pgid : id.pid, "SIGKILL");
    return true;
  } catch {
    return false;
  }
}

/** Clean every unfinished record whose processes are verifiably gone; report the rest. */
export async function recoverSessions(deps: RecoveryDeps): Promise<RecoveryReport> {
  const report: RecoveryReport = { cleaned: [], retained: [] };
  for (const rec of deps.store.unfinished()) {
    if (deps.skip?.has(rec.sessionId)) continue;
    let decision = recoveryDecision(rec, await observe(deps.runtime, rec));
    for (let attempt = 0; decision.kind === "stop_exact" && attempt < 3; attempt++) {
      const target = decision.target === "client" ? rec.client! : rec.leader!;
      const killed = killExact(target, decision.target === "group");
      deps.log.warn({ session: rec.sessionId, machine: rec.machineId, target: decision.target, pid: target.pid, killed }, "recovery stopped an exact leftover of a session");
      await new Promise((r) => setTimeout(r, deps.killWaitMs ?? 200));
      decision = recoveryDecision(rec, await observe(deps.runtime, rec));
    }
    const from = ["intent", "running", "release_intent"] as const;
    if (decision.kind === "clean") {
      deps.store.transition(rec.sessionId, from, { state: "clean", note: `recovered: ${decision.evidence}`, updatedAt: deps.now() });
      report.cleaned.push({ sessionId: rec.sessionId, machineId: rec.machineId, evidence: decision.evidence });
    } else {
      const why = decision.kind === "retain" ? decision.why : `${decision.why}, and stopping it did not succeed`;
      deps.store.transition(rec.sessionId, from, { state: "release_intent", note: `retained: ${why}`, updatedAt: deps.now() });
      report.retained.push({ sessionId: rec.sessionId, machineId: rec.machineId, why });
    }
  }
  if (report.cleaned.length || report.retained.length) deps.log.info({ cleaned: report.cleaned.length, retained: report.retained }, "session records recovered");
  return report;
}
