/**
 * Observations the release and recovery paths need and the runtime contract
 * does not give directly: is a recorded process group still populated, and is
 * a recorded host process (pid + start time) still that same process.
 *
 * - process runtime: sandboxes are plain host processes, so the group is
 *   probed by a scan of /proc on the host (zombies do not count).
 * - gvisor: the group lives in the sandbox's pid namespace. While the exec
 *   client is alive its leader is alive; afterwards a one-shot
 *   `kill -0 -PGID` inside the machine answers (exit 0 = present).
 * Anything that cannot be answered is "unknown", which keeps a record
 * retained rather than guessing "gone".
 */
import { readFileSync, readdirSync } from "node:fs";
import type { ProcessIdentity, Runtime } from "../runtime/types.js";

export type GroupPresence = "present" | "absent" | "unknown";

/** Whether the process group `pgid` has members (in the runtime's pid namespace). */
export async function probeGroup(runtime: Runtime, machineId: string, pgid: number, leaderExited: boolean): Promise<GroupPresence> {
  if (!Number.isInteger(pgid) || pgid <= 1) return "unknown";
  if (runtime.kind === "process") return hostGroupPresence(pgid);
  if (!leaderExited) return "present";
  return sandboxGroupPresence(runtime, machineId, pgid);
}

export function hostGroupPresence(pgid: number): GroupPresence {
  // kill(-pgid, 0) refused with ESRCH: no process of the group exists, not even
  // a zombie; the common answer once a command ended, without reading /proc.
  try {
    process.kill(-pgid, 0);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ESRCH") return "absent";
  }
  // Otherwise a scan: a zombie member answers kill() but is gone for our
  // purposes (it runs nothing, and an unreaped orphan may never be reaped in a
  // container whose init does not reap).
  let names: string[];
  try {
    names = readdirSync("/proc");
  } catch {
    return "unknown";
  }
  for (const n of names) {
    if (!/^\d+$/.test(n)) continue;
    const st = readHostProcess(Number(n));
    if (st && st.pgid === pgid) return "present";
  }
  return "absent";
}

async function sandboxGroupPresence(runtime: Runtime, machineId: string, pgid: number): Promise<GroupPresence> {
  try {
    // No running sandbox (the record's sandbox pid is not alive as recorded):
    // every process of it died with it. Read from the runtime's record, not a
    // count inside the sandbox, which would cost a second `runsc exec`.
    if ((await runtime.incarnation(machineId)) === null) return "absent";
    const h = await runtime.exec(machineId, { argv: ["/bin/sh", "-c", 'kill -0 "-$0" 2>/dev/null', String(pgid)], env: {} });
    h.stdin.end();
    h.stdout.resume();
    h.stderr.resume();
    const x = await h.exited;
    if (x.code === 0) return "present";
    if (x.code === 1) return "absent";
    return "unknown";
  } catch {
    return "unknown";
  }
}

/** The live host process with this pid, as an exact identity; null if no such pid. */
export function readHostProcess(pid: number): ProcessIdentity | null {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return null;
  }
  const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // After "pid (comm) ": [0]=state [1]=ppid [2]=pgrp ... [19]=starttime
  const state = rest[0];
  const pgid = Number(rest[2]);
  const startTime = Number(rest[19]);
  if (state === "Z" || state === "X") return null; // exited; only a zombie entry remains
  if (!Number.isFinite(pgid) || !Number.isFinite(startTime)) return null;
  return { pid, startTime, pgid };
}

export type HostProcessMatch = "absent" | "match" | "other";

/** Whether the exact recorded host process still exists ("other": the pid now names a different process). */
export function matchHostProcess(id: ProcessIdentity): HostProcessMatch {
  const cur = readHostProcess(id.pid);
  if (!cur) return "absent";
  return cur.startTime === id.startTime ? "match" : "other";
}
