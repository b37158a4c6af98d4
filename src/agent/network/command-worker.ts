/**
 * The thread that starts the agent's `ip` and `nft` commands (host.ts `cmd`).
 * A spawn holds the thread that makes it until the child has exec'd (fork,
 * then the wait for exec: tens of ms each on a loaded host), so commands
 * started on the agent's main thread would hold its event loop — and every
 * request it serves, a lend-time check among them — for as long. Here they
 * hold only this thread. Requests and answers are messages; the outcome is
 * exactly execFile's.
 */
import { execFile } from "node:child_process";
import { parentPort } from "node:worker_threads";

export interface CommandRequest {
  id: number;
  file: string;
  args: string[];
  input?: string;
  timeoutMs: number;
}
export interface CommandAnswer {
  id: number;
  code: number;
  stdout: string;
  stderr: string;
}
/** Fault point (tests), see host.ts `holdNextCommand`. */
export interface HoldRequest {
  hold: { file: string; args: string[]; state: Int32Array; boundMs: number };
}

let hold: HoldRequest["hold"] | null = null;

function run(r: CommandRequest): void {
  const h = hold;
  if (h && h.file === r.file && h.args.every((a, i) => r.args[i] === a)) {
    hold = null;
    Atomics.store(h.state, 0, 1);
    Atomics.wait(h.state, 1, 0, h.boundMs);
    Atomics.store(h.state, 0, 2);
  }
  const child = execFile(r.file, r.args, { timeout: r.timeoutMs, maxBuffer: 8 << 20 }, (err, stdout, stderr) => {
    const code = err ? (typeof (err as { code?: unknown }).code === "number" ? (err as { code: number }).code : 1) : 0;
    parentPort?.postMessage({ id: r.id, code, stdout: String(stdout), stderr: String(stderr) } satisfies CommandAnswer);
  });
  if (r.input !== undefined) child.stdin?.end(r.input);
  // A child that could not be started at all (ENOENT) answers through the callback too.
  child.stdin?.on("error", () => undefined);
}

parentPort?.on("message", (m: CommandRequest | HoldRequest) => {
  if ("hold" in m) hold = m.hold;
  else run(m);
});
