/**
 * Run-one-command helpers over the client library's SSH leg, for tests and
 * benchmarks that drive a machine directly (the CLI uses src/client/ssh.ts).
 */
import { PassThrough, type Writable } from "node:stream";
import { connect as connectSsh, type ExecResult, type SshConnection, type SshTarget } from "../client/ssh.js";

export { exitStatusOf, type ExecResult, type SshTarget } from "../client/ssh.js";

export function connect(t: SshTarget, timeoutMs = 15_000): Promise<SshConnection> {
  return connectSsh(t, { timeoutMs });
}

/** Runs one command, piping its output to the given streams; resolves with its exit status. */
export async function execStreaming(
  c: SshConnection,
  command: string,
  io: { stdout: Writable; stderr: Writable; onFirstByte?: () => void },
): Promise<ExecResult> {
  let first = false;
  const tap = (w: Writable): Writable => {
    if (!io.onFirstByte) return w;
    const t = new PassThrough();
    t.once("data", () => {
      if (!first) {
        first = true;
        io.onFirstByte!();
      }
    });
    t.pipe(w, { end: false });
    return t;
  };
  const cmd = await c.start(command, { stdout: tap(io.stdout), stderr: tap(io.stderr) });
  return cmd.done;
}
