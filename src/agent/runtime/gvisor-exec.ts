/**
 * Starting one `runsc exec` client for a command in a machine's sandbox:
 * its environment (an image's Env as the base; PATH, HOME, USER, SHELL and
 * BERTH_* never from the request), the process spec written to a 0600 file
 * (the environment stays out of argv, visible in ps), the relay for a PTY
 * where the incarnation has it, and the client spawned under node-pty or as
 * a detached child. The identity handshake that follows is gvisor-identity.ts.
 */
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import pty from "node-pty";
import { BerthError } from "../../core/errors.js";
import { readStat } from "./procfs.js";
import { fromChild, fromPty, type Plumbing } from "./streams.js";
import { PATH_IN, execProcessSpec } from "./gvisor-oci.js";
import type { Runsc } from "./gvisor-runsc.js";
import type { ContainerRecord, GvisorMachineRecord } from "./gvisor-records.js";
import type { ExecRequest, ProcessIdentity } from "./types.js";
import { cleanEnv, loginShell } from "./common.js";

/** Where the relay is inside the sandbox (the /run/berth bind). */
const PTY_RELAY_IN = "/run/berth/berth-pty-relay";

export interface ExecClient {
  client: ProcessIdentity;
  plumbing: Plumbing;
  p: pty.IPty | null;
  /** The wrapper's identity line (null: none came). */
  line: Promise<string | null>;
  specPath: string;
  ipidPath: string;
  relayed: boolean;
}

/** Spawns the exec client of `req` in container `c` of `rec`; files go under `execDir`. */
export function spawnExecClient(runsc: Runsc, execDir: string, rec: GvisorMachineRecord, c: ContainerRecord, req: ExecRequest, netns: string | null): ExecClient {
  const image = rec.image;
  const shell = image ? image.shell : loginShell();
  const env = cleanEnv(
    req.env,
    {
      PATH: image?.env.PATH ?? PATH_IN,
      HOME: image?.env.HOME ?? "/workspace",
      USER: image ? image.user.name : "root",
      SHELL: shell,
      TERM: req.pty ? req.pty.term || "xterm" : "dumb",
      BERTH_MACHINE: rec.machineId,
      BERTH_INCARNATION: rec.incarnation as string,
    },
    image?.env ?? null,
  );
  const command = req.argv && req.argv.length > 0 ? req.argv : [shell, "-l"];
  // A PTY session gets a /dev/pts terminal of the sandbox's own (the relay), where this incarnation has it.
  const relayed = Boolean(req.pty) && existsSync(join(c.bundle, "run", "berth-pty-relay"));
  const argv = relayed ? [PTY_RELAY_IN, ...command] : command;
  mkdirSync(execDir, { recursive: true, mode: 0o700 });
  const tag = randomBytes(8).toString("hex");
  const specPath = join(execDir, `${tag}.json`);
  const ipidPath = join(execDir, `${tag}.pid`);
  const as = image ? { uid: image.user.uid, gid: image.user.gid, additionalGids: image.user.additionalGids, cwd: image.workingDir ?? "/workspace" } : undefined;
  writeFileSync(specPath, JSON.stringify(execProcessSpec(argv, env, Boolean(req.pty), as)), { mode: 0o600 });
  const { file: execFile, args } = runsc.command(runsc.execArgs(c.id, specPath, ipidPath), netns);
  let setLine!: (l: string | null) => void;
  const line = new Promise<string | null>((r) => (setLine = r));
  let plumbing: Plumbing;
  let clientPid: number;
  let p: pty.IPty | null = null;
  if (req.pty) {
    p = pty.spawn(execFile, args, {
      name: env.TERM,
      cols: req.pty.cols,
      rows: req.pty.rows,
      cwd: "/",
      env: { PATH: process.env.PATH ?? PATH_IN },
      encoding: null,
    });
    clientPid = p.pid;
    plumbing = fromPty(p, setLine);
  } else {
    const child = spawn(execFile, args, { detached: true, stdio: ["pipe", "pipe", "pipe"] });
    if (child.pid === undefined) throw new BerthError("operation_failed", "operation_failed: could not start runsc exec");
    clientPid = child.pid;
    plumbing = fromChild(child, setLine);
  }
  const cst = readStat(clientPid);
  const client: ProcessIdentity = { pid: clientPid, startTime: cst ? cst.startTime : -1, pgid: cst ? cst.pgid : clientPid };
  return { client, plumbing, p, line, specPath, ipidPath, relayed };
}
