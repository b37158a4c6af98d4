/** What a session is given and what it reports: its dependencies, timing bounds, spec and outcome. */
import type { PtyRequest, Runtime } from "../runtime/types.js";
import type { SessionStore } from "./store.js";

export interface Log {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

/** Grace periods and bounds; all short and configurable (tests use the defaults). */
export interface SessionTiming {
  /** Wait after SIGHUP before SIGTERM. */
  hupGraceMs: number;
  /** Wait after SIGTERM before SIGKILL. */
  termGraceMs: number;
  /** Wait after SIGKILL for the group to vanish. */
  killWaitMs: number;
  /** Wait for the exec client to be reaped once the group is gone. */
  reapWaitMs: number;
  /** Completion: once all output read has been sent, stop waiting for more after this long without any (a background writer holds it open). A client slow to take output is waited for. */
  drainIdleMs: number;
  /** Completion: stop reading output this long after exit even if bytes still flow. */
  drainMaxMs: number;
}

export const DEFAULT_TIMING: SessionTiming = {
  hupGraceMs: 200,
  termGraceMs: 500,
  killWaitMs: 2000,
  reapWaitMs: 5000,
  drainIdleMs: 2000,
  drainMaxMs: 30_000,
};

export interface SessionDeps {
  /** Run the command and signal its exact group. */
  runtime: Runtime;
  /** Durable session records (intent/running/release_intent/clean). */
  store: SessionStore;
  /** The agent's clock (epoch ms), for record timestamps. */
  now: () => number;
  log: Log;
  timing: SessionTiming;
}

export interface SessionSpec {
  sessionId: string;
  machineId: string;
  grantId: string;
  fingerprint: string;
  /** null: the machine's login shell (SSH `shell`). */
  argv: string[] | null;
  env: Record<string, string>;
  pty: PtyRequest | null;
}

/** How a session ended, for the registry and tests. */
export interface SessionOutcome {
  sessionId: string;
  state: "clean" | "release_intent";
  reason: string;
  note: string | null;
}
