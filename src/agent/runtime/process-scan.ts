/**
 * Finding the process runtime's machines on the host: which live processes
 * belong to a machine, and where its cgroups live (cgroup v2, root only).
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { allPids, isDead, readEnviron, readStat, type ProcStat } from "./procfs.js";
import type { ProcessIdentity } from "./types.js";

/** What a scan needs of a machine record. */
export interface ScannedMachine {
  machineId: string;
  /** The marker values (BERTH_INCARNATION) issued for this machine. */
  incarnations: string[];
  /** The machine's cgroup v2 directory, or null. */
  cgroup: string | null;
}

/**
 * Every live process of a machine: its environment carries the machine's
 * marker with one of its incarnations, or it is in the machine's cgroup, or
 * in the group of a tracked leader that is still exactly that process; plus
 * the descendants of any of those (a child that cleared its environment but
 * has not been orphaned yet). Never the agent itself or its parent.
 */
export function machineProcesses(rec: ScannedMachine, trackedLeaders: ProcessIdentity[]): ProcStat[] {
  const incs = new Set(rec.incarnations);
  const machineMark = `BERTH_MACHINE=${rec.machineId}`;
  const stats = new Map<number, ProcStat>();
  for (const pid of allPids()) {
    const st = readStat(pid);
    if (st && !isDead(st)) stats.set(pid, st);
  }
  const found = new Set<number>();
  for (const st of stats.values()) {
    const env = readEnviron(st.pid);
    if (!env.includes(machineMark)) continue;
    const vars = env.split("\0");
    if (!vars.includes(machineMark)) continue;
    const inc = vars.find((v) => v.startsWith("BERTH_INCARNATION="))?.slice("BERTH_INCARNATION=".length);
    if (inc !== undefined && incs.has(inc)) found.add(st.pid);
  }
  if (rec.cgroup) {
    for (const pid of readCgroupProcs(rec.cgroup)) if (stats.has(pid)) found.add(pid);
  }
  for (const leader of trackedLeaders) {
    const lst = stats.get(leader.pid);
    if (!lst || lst.startTime !== leader.startTime) continue;
    for (const st of stats.values()) if (st.pgid === leader.pgid) found.add(st.pid);
  }
  // Descendants of anything found (a child that cleared its environment but
  // has not been orphaned yet).
  const children = new Map<number, number[]>();
  for (const st of stats.values()) {
    const list = children.get(st.ppid) ?? [];
    list.push(st.pid);
    children.set(st.ppid, list);
  }
  const queue = [...found];
  while (queue.length > 0) {
    const p = queue.pop() as number;
    for (const c of children.get(p) ?? []) {
      if (!found.has(c)) {
        found.add(c);
        queue.push(c);
      }
    }
  }
  found.delete(process.pid);
  found.delete(process.ppid);
  return [...found].map((p) => stats.get(p) as ProcStat);
}

/**
 * Where this agent's machine cgroups go (cgroup v2, root only), or null.
 * Nothing is created here: create() makes `<base>/<machine>` and falls back to
 * marker-only fencing if that fails; destroy() removes it and the base when empty.
 */
export function findCgroupBase(stateDir: string): string | null {
  if (process.getuid?.() !== 0) return null;
  let mounts: string;
  try {
    mounts = readFileSync("/proc/self/mounts", "utf8");
  } catch {
    return null;
  }
  for (const line of mounts.split("\n")) {
    const [, mnt, type] = line.split(" ");
    if (type !== "cgroup2" || !mnt) continue;
    return join(mnt, `berth-${createHash("sha256").update(stateDir).digest("hex").slice(0, 12)}`);
  }
  return null;
}

/** Pids listed in a cgroup (none when it is gone or unreadable). */
export function readCgroupProcs(cg: string): number[] {
  try {
    return readFileSync(join(cg, "cgroup.procs"), "utf8")
      .split("\n")
      .filter((s) => s.length > 0)
      .map(Number);
  } catch {
    return [];
  }
}

