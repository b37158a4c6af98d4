/**
 * Exact process identity from /proc, shared by both runtimes.
 *
 * A pid alone is not an identity: pids are reused. berth identifies a process
 * by (pid, kernel start time in clock ticks since boot — /proc/PID/stat field
 * 22). Every signal this module sends re-reads the start time immediately
 * before the kill(2) and refuses when it differs, so a recycled pid is never
 * signalled. (Without pidfds there remains a window of one syscall between the
 * re-read and the kill; pid reuse inside that window would need the kernel to
 * cycle the whole pid space in microseconds.)
 */
import { readFileSync, readdirSync } from "node:fs";
import type { ProcessIdentity } from "./types.js";

export interface ProcStat {
  pid: number;
  comm: string;
  /** R, S, D, Z, X, T, ... */
  state: string;
  ppid: number;
  pgid: number;
  sid: number;
  /** Foreground process group of the controlling terminal (field 8); -1 without one. */
  tpgid: number;
  startTime: number;
}

/** Parse the text of /proc/PID/stat (comm may contain spaces and parentheses). */
export function parseStat(text: string): ProcStat | null {
  const open = text.indexOf("(");
  const close = text.lastIndexOf(")");
  if (open < 0 || close < open) return null;
  const pid = Number(text.slice(0, open).trim());
  const comm = text.slice(open + 1, close);
  // Fields after ")": index 0 is field 3 (state).
  const f = text.slice(close + 2).trim().split(/\s+/);
  const num = (i: number): number => Number(f[i - 3]);
  const state = f[0] ?? "?";
  const startTime = num(22);
  if (!Number.isFinite(pid) || !Number.isFinite(startTime)) return null;
  return { pid, comm, state, ppid: num(4), pgid: num(5), sid: num(6), tpgid: num(8), startTime };
}

export function readStat(pid: number): ProcStat | null {
  try {
    return parseStat(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return null;
  }
}

/** True for a process that has exited (gone, zombie or dead): it can run nothing more. */
export function isDead(st: ProcStat | null): boolean {
  return st === null || st.state === "Z" || st.state === "X" || st.state === "x";
}

/** The identity of a live process, or null. */
export function identityOf(pid: number): ProcessIdentity | null {
  const st = readStat(pid);
  if (isDead(st) || st === null) return null;
  return { pid: st.pid, startTime: st.startTime, pgid: st.pgid };
}

/** The process `pid` is alive and is exactly the one recorded (same start time). */
export function matches(id: { pid: number; startTime: number }): boolean {
  const st = readStat(id.pid);
  return !isDead(st) && st !== null && st.startTime === id.startTime;
}

/** Every pid currently in /proc. */
export function allPids(): number[] {
  const out: number[] = [];
  for (const name of readdirSync("/proc")) {
    const n = Number(name);
    if (Number.isInteger(n) && n > 0) out.push(n);
  }
  return out;
}

/** The environment a process was started with, as raw NUL-separated text ("" if unreadable). */
export function readEnviron(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/environ`, "latin1");
  } catch {
    return "";
  }
}

export function readCmdline(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter((s) => s.length > 0);
  } catch {
    return [];
  }
}

/**
 * SIGKILL/other signal to exactly this process: refused (false) unless it is
 * alive with the recorded start time. Never signals this process itself.
 */
export function signalExact(id: { pid: number; startTime: number }, signal: NodeJS.Signals): boolean {
  if (id.pid <= 1 || id.pid === process.pid) return false;
  if (!matches(id)) return false;
  try {
    process.kill(id.pid, signal);
    return true;
  } catch {
    return false;
  }
}

/**
 * Signal the process group led by `leader`, only while the leader is alive,
 * has the recorded start time and still leads the recorded group. A group
 * whose leader is gone is refused: its number may already belong to someone else.
 */
export function signalGroupExact(leader: ProcessIdentity, signal: NodeJS.Signals): boolean {
  if (leader.pgid <= 1 || leader.pid !== leader.pgid || leader.pgid === process.pid) return false;
  const st = readStat(leader.pid);
  if (isDead(st) || st === null || st.startTime !== leader.startTime || st.pgid !== leader.pgid) return false;
  try {
    process.kill(-leader.pgid, signal);
    return true;
  } catch {
    return false;
  }
}

/**
 * A terminal signal (INT, QUIT, TSTP) as the keyboard would send it: to the
 * foreground process group of the leader's controlling terminal (its tpgid).
 * With job control the foreground job has its own group, so this is not the
 * leader's group. Refused unless the leader is exactly the recorded process and
 * still leads its group, and unless the foreground group is verifiably a group
 * of the leader's session (a live member with the leader's session id). A
 * leader without a controlling terminal (no PTY) gets the signal in its own group.
 */
export function signalForegroundExact(leader: ProcessIdentity, signal: NodeJS.Signals): boolean {
  if (leader.pgid <= 1 || leader.pid !== leader.pgid || leader.pgid === process.pid) return false;
  const st = readStat(leader.pid);
  if (isDead(st) || st === null || st.startTime !== leader.startTime || st.pgid !== leader.pgid) return false;
  const fg = st.tpgid;
  if (!Number.isInteger(fg) || fg <= 0 || fg === leader.pgid) return signalGroupExact(leader, signal);
  if (fg === process.pid) return false;
  let verified = false;
  for (const pid of allPids()) {
    const m = readStat(pid);
    if (m && !isDead(m) && m.pgid === fg && m.sid === st.sid) {
      verified = true;
      break;
    }
  }
  if (!verified) return false;
  // Re-check the leader right before the kill: still exact, still on the same foreground group.
  const again = readStat(leader.pid);
  if (isDead(again) || again === null || again.startTime !== leader.startTime || again.tpgid !== fg) return false;
  try {
    process.kill(-fg, signal);
    return true;
  } catch {
    return false;
  }
}

/** A small file's text (a pid file, a log), or "" when it cannot be read. */
export function safeRead(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Poll until `done()` or the deadline; returns the final value of done(). */
export async function waitUntil(done: () => boolean, timeoutMs: number, stepMs = 5): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (done()) return true;
    if (Date.now() >= end) return done();
    await sleep(stepMs);
  }
}
