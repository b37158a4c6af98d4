/**
 * A command of the `process` runtime (process.ts), once its arguments are
 * known: spawned on a PTY or with pipes, and its ExecHandle.
 */
import { spawn } from "node:child_process";
import pty from "node-pty";
import { BerthError } from "../../core/errors.js";
import { signalExact, signalForegroundExact, signalGroupExact } from "./procfs.js";
import { fromChild, fromPty, type Plumbing } from "./streams.js";
import type { ExecHandle, ExecRequest, ProcessIdentity } from "./types.js";
import { validatePty } from "./common.js";

/** `/bin/sh ARGS` in `workspace`: on a PTY (node-pty's child calls setsid()), else with pipes in a group of its own. */
export function spawnExec(
  machineId: string,
  args: string[],
  workspace: string,
  env: Record<string, string>,
  ptyReq: ExecRequest["pty"] | null,
): { plumbing: Plumbing; pid: number; resize: (cols: number, rows: number) => void } {
  if (ptyReq) {
    validatePty(ptyReq.cols, ptyReq.rows);
    // node-pty's child calls setsid(): it leads its own session and group and
    // the PTY slave is its controlling terminal.
    const p = pty.spawn("/bin/sh", args, {
      name: env.TERM,
      cols: ptyReq.cols,
      rows: ptyReq.rows,
      cwd: workspace,
      env,
      encoding: null,
    });
    return {
      plumbing: fromPty(p),
      pid: p.pid,
      resize: (cols, rows) => {
        validatePty(cols, rows);
        p.resize(cols, rows);
      },
    };
  }
  const child = spawn("/bin/sh", args, { cwd: workspace, env, detached: true, stdio: ["pipe", "pipe", "pipe"] });
  if (child.pid === undefined) {
    throw new BerthError("operation_failed", `operation_failed: could not start a process in machine ${machineId}`);
  }
  return {
    plumbing: fromChild(child),
    pid: child.pid,
    resize: () => {
      throw new BerthError("invalid_request", "invalid_request: resize needs a PTY session");
    },
  };
}

/** The handle of a spawned command led by `leader` (which is also its client). */
export function execHandle(incarnation: string, leader: ProcessIdentity, plumbing: Plumbing, resize: (cols: number, rows: number) => void): ExecHandle {
  return {
    incarnation,
    client: leader,
    leader,
    stdin: plumbing.stdin,
    stdout: plumbing.stdout,
    stderr: plumbing.stderr,
    resize(cols, rows) {
      resize(cols, rows);
      // TIOCSWINSZ already signals the terminal's foreground group; the
      // explicit SIGWINCH to the session's own group is the contract.
      signalGroupExact(leader, "SIGWINCH");
    },
    signalGroup: async (signal) => signalGroupExact(leader, signal),
    signalForeground: async (signal) => signalForegroundExact(leader, signal),
    killClient: (signal = "SIGKILL") => signalExact(leader, signal),
    exited: plumbing.exited,
    pause: plumbing.pause,
    resume: plumbing.resume,
  };
}
