/**
 * How `berth up` stops, and why it is the only one a terminal signal reaches.
 *
 * The agent is spawned in its own session (and so its own process group), and
 * runsc spawns each sandbox in a session of its own: nothing `berth up`
 * starts is in the terminal's foreground process group. A Ctrl-C or a hangup
 * of the terminal therefore reaches `berth up` alone, which stops everything
 * in order:
 *   1. the first SIGINT/SIGTERM/SIGHUP ends the wait (or interrupts the start);
 *   2. the pools are drained through the coordinator — borrows ended, machines
 *      destroyed by the agent — for at most TEARDOWN_MS;
 *   3. the agent is stopped (SIGTERM; SIGKILL after AGENT_STOP_MS);
 *   4. any machine still under the agent's state directory is destroyed
 *      directly through the runtime (runsc delete, process groups killed).
 * A further signal during step 2 forces: the wait ends there and steps 3–4
 * run at once. While `berth up -- CMD` runs its command, signals belong to the
 * command (forwarded to it as `berth run` does); stopping starts afterwards.
 */

export const TEARDOWN_MS = 30_000;
export const AGENT_STOP_MS = 10_000;

/** AGENT_STOP_MS, or a shorter wait set by a test (BERTH_TEST_HOOKS=1 with BERTH_TEST_AGENT_STOP_MS) that only needs it to pass. */
export function agentStopMs(): number {
  const t = process.env.BERTH_TEST_HOOKS === "1" ? Number(process.env.BERTH_TEST_AGENT_STOP_MS) : NaN;
  return Number.isFinite(t) && t > 0 ? t : AGENT_STOP_MS;
}

const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
export type StopSignal = (typeof SIGNALS)[number];
export const SIGNAL_EXIT: Record<StopSignal, number> = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 };

/** A start step was cut short by a signal. */
export class Interrupted extends Error {
  constructor(readonly signal: StopSignal) {
    super(`interrupted by ${signal}`);
    this.name = "Interrupted";
  }
}

export class UpSignals {
  /** The signal that asked to stop, if one did. */
  received: StopSignal | null = null;
  private stopping = false;
  private delegated = false;
  private resolveFirst!: (s: StopSignal) => void;
  private readonly first = new Promise<StopSignal>((r) => (this.resolveFirst = r));
  private readonly forcing = new AbortController();
  private readonly handlers = SIGNALS.map((s) => [s, () => this.on(s)] as const);

  /** Installed before anything is started, so that no signal kills berth with its children left behind. */
  constructor(private readonly say: (s: string) => void) {
    for (const [s, h] of this.handlers) process.on(s, h);
  }

  /** Aborted by a signal that arrives once stopping has begun. */
  get force(): AbortSignal {
    return this.forcing.signal;
  }

  /** Resolves with the first signal. */
  waitForSignal(): Promise<StopSignal> {
    return this.first;
  }

  /** Runs one start step; a signal ends the wait for it with Interrupted (the step's own result is dropped). */
  async interruptible<T>(p: Promise<T>): Promise<T> {
    p.catch(() => undefined);
    const r = await Promise.race([p.then((v) => ({ v })), this.first.then((s) => ({ s }))]);
    if ("s" in r) throw new Interrupted(r.s);
    return r.v;
  }

  /** While `f` runs, signals are its own (a command on a borrowed machine forwards them). */
  async delegate<T>(f: () => Promise<T>): Promise<T> {
    this.delegated = true;
    try {
      return await f();
    } finally {
      this.delegated = false;
    }
  }

  /** Stopping has begun (signalled or not): from now on a signal forces. */
  beginStop(): void {
    this.stopping = true;
  }

  dispose(): void {
    for (const [s, h] of this.handlers) process.off(s, h);
  }

  private on(sig: StopSignal): void {
    if (this.delegated) return;
    if (!this.stopping) {
      this.stopping = true;
      this.received = sig;
      this.resolveFirst(sig);
      return;
    }
    if (!this.forcing.signal.aborted) {
      this.say(`${sig} again: forcing — stopping the agent and destroying its machines directly`);
      this.forcing.abort();
    }
  }
}
