/**
 * The host half of the gvisor exec identity handshake.
 *
 * `runsc exec` runs the wrapper of gvisor-oci.ts, which prints one identity
 * line (its in-sandbox /proc/self/stat, then it execs the command with the
 * same pid). streams.ts strips that line from the output and hands it here.
 * The leader identity is accepted only if the line parses and its pid equals
 * the pid runsc itself writes to --internal-pid-file (host-side, not
 * borrower-controlled). On any failure the exact exec client is killed and
 * the exec is refused: no session ever runs with an unverified leader.
 *
 * A quick command's client can exit before its stderr was read, so the
 * client's exit only bounds the wait: the line (or the end of stderr, which
 * resolves it as null) still decides.
 */
import { existsSync, rmSync } from "node:fs";
import { BerthError } from "../../core/errors.js";
import { parseStat, safeRead, signalExact, sleep, waitUntil } from "./procfs.js";
import { IDENTITY_PREFIX } from "./streams.js";
import type { ProcessIdentity } from "./types.js";

export interface IdentityWait {
  machineId: string;
  /** The exact `runsc exec` client process on the host. */
  client: ProcessIdentity;
  /** The first stderr line (null when stderr ended without one). */
  line: Promise<string | null>;
  /** Resolves when the exec client exited. */
  exited: Promise<unknown>;
  /** runsc's --internal-pid-file for this exec; removed here. */
  ipidPath: string;
  /** Called once the wait is over, before any check (e.g. to remove the process spec file). */
  settled?: () => void;
}

/** Waits for the identity line and verifies it; resolves with the leader (pid == pgid in the sandbox). */
export async function awaitExecIdentity(w: IdentityWait): Promise<ProcessIdentity> {
  const timeout = sleep(15_000).then(() => "timeout" as const);
  const afterExit = w.exited.then(() => Promise.race([w.line, sleep(2_000).then(() => null)]));
  const first = await Promise.race([w.line, afterExit, timeout]);
  w.settled?.();
  const fail = (why: string): never => {
    signalExact(w.client, "SIGKILL");
    rmSync(w.ipidPath, { force: true });
    throw new BerthError("operation_failed", `operation_failed: command in machine ${w.machineId} did not start: ${why}`);
  };
  if (first === "timeout") fail("no identity from the sandbox within 15 s");
  if (typeof first !== "string" || !first.startsWith(IDENTITY_PREFIX)) {
    fail(typeof first === "string" ? first.replace(/[^\x20-\x7e]/g, "").slice(0, 300) : "runsc exec exited before the command started");
  }
  const st = parseStat((first as string).slice(IDENTITY_PREFIX.length));
  if (!st) fail("unreadable identity line");
  const leaderStat = st as NonNullable<typeof st>;
  // Cross-check with the pid runsc reports (host-side, not borrower-controlled).
  await waitUntil(() => existsSync(w.ipidPath) && safeRead(w.ipidPath).trim() !== "", 2_000, 2);
  const reported = Number(safeRead(w.ipidPath).trim());
  rmSync(w.ipidPath, { force: true });
  if (Number.isInteger(reported) && reported > 0 && reported !== leaderStat.pid) {
    fail(`identity mismatch: runsc reports pid ${reported}, wrapper reports ${leaderStat.pid}`);
  }
  return { pid: leaderStat.pid, startTime: leaderStat.startTime, pgid: leaderStat.pgid };
}
