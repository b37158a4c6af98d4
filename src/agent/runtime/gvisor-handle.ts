/**
 * The ExecHandle of one gvisor exec: streams from the `runsc exec` client,
 * group signals through the runtime's checked in-sandbox signal (never a bare
 * numeric group), and, with a PTY, foreground signals through the client.
 * Signals of one exec are sent one at a time, in the order asked.
 */
import type pty from "node-pty";
import { BerthError } from "../../core/errors.js";
import { validatePty } from "./common.js";
import { signalExact } from "./procfs.js";
import type { Plumbing } from "./streams.js";
import type { ExecHandle, ProcessIdentity } from "./types.js";

export interface GvisorExecParts {
  incarnation: string;
  /** The exact `runsc exec` client on the host. */
  client: ProcessIdentity;
  /** The verified in-sandbox leader (pid == pgid). */
  leader: ProcessIdentity;
  plumbing: Plumbing;
  /** The client's PTY, or null for pipes. */
  pty: pty.IPty | null;
  /** The leader is berth-pty-relay, which passes the signals it gets on to its terminal's foreground group. */
  relayed?: boolean;
  /**
   * `kill -SIG -PGID` inside the sandbox, only while the leader is still the
   * recorded process in the same container; "0" only checks. False: refused.
   */
  signalLeaderGroup: (signal: NodeJS.Signals | "0") => Promise<boolean>;
}

export function gvisorExecHandle(x: GvisorExecParts): ExecHandle {
  const { client, plumbing, pty: p } = x;
  let chain: Promise<unknown> = Promise.resolve();
  const signalGroup = (signal: NodeJS.Signals): Promise<boolean> => {
    const next = chain.then(() => x.signalLeaderGroup(signal));
    chain = next.catch(() => undefined);
    return next;
  };
  // With a PTY the exec client forwards the signals it receives to the foreground process
  // group of the session of the process it started (runsc's own terminal handling): the
  // in-sandbox equivalent of the host tty's tpgid, which gVisor's /proc does not report.
  // The leader is checked in the sandbox first (same script, signal 0), then the exact
  // client is signalled on the host; while that client lives, the process it waits for is
  // the recorded leader, so the forwarding cannot reach another session.
  const signalForeground = (signal: NodeJS.Signals): Promise<boolean> => {
    // No PTY: the group. A relayed PTY: the relay's group (the relay passes it on), not through the
    // client, whose forwarding would reach the relay anyway and does not pass every signal (QUIT).
    if (!p || x.relayed) return signalGroup(signal);
    const next = chain.then(async () => {
      if (!(await x.signalLeaderGroup("0"))) return false;
      return signalExact(client, signal);
    });
    chain = next.catch(() => undefined);
    return next;
  };
  return {
    incarnation: x.incarnation,
    client,
    leader: x.leader,
    stdin: plumbing.stdin,
    stdout: plumbing.stdout,
    stderr: plumbing.stderr,
    resize(cols, rows) {
      if (!p) throw new BerthError("invalid_request", "invalid_request: resize needs a PTY session");
      validatePty(cols, rows);
      p.resize(cols, rows);
      void signalGroup("SIGWINCH").catch(() => undefined);
    },
    signalGroup,
    signalForeground,
    killClient: (signal = "SIGKILL") => signalExact(client, signal),
    exited: plumbing.exited,
    pause: plumbing.pause,
    resume: plumbing.resume,
  };
}
