/**
 * Runs allocation launches and cleanups (actions/allocation-launch.ts,
 * actions/allocation-cleanup.ts), sandbox watches and restarts
 * (actions/allocation-watch.ts) and standing pushes (actions/host-standing.ts) outside the reconciler's transactions: the
 * reconciler visits an `alloc_launch` / `alloc_cleanup` due row and, after
 * its commit, hands the allocation here. One drive per allocation at a time
 * in this process; other coordinators are kept apart by the actor record and
 * its lease, not by this set.
 */
import { driveLaunch, type AllocWorkerDeps } from "./actions/allocation-launch.js";
import { driveCleanup } from "./actions/allocation-cleanup.js";
import { pushStanding } from "./actions/host-standing.js";
import { driveRestart, driveWatch } from "./actions/allocation-watch.js";

export type { AllocWorkerDeps };

export class AllocationWorker {
  readonly #busy = new Set<string>();
  readonly #running = new Set<Promise<void>>();
  constructor(private readonly d: AllocWorkerDeps) {}

  drive(kind: "alloc_launch" | "alloc_cleanup" | "host_standing" | "alloc_watch" | "alloc_restart", id: string): void {
    const key = `${kind}:${id}`;
    if (this.#busy.has(key)) return;
    this.#busy.add(key);
    const step =
      kind === "alloc_launch" ? driveLaunch(this.d, id)
      : kind === "alloc_cleanup" ? driveCleanup(this.d, id)
      : kind === "alloc_watch" ? driveWatch(this.d, id)
      : kind === "alloc_restart" ? driveRestart(this.d, id)
      : pushStanding({ ...this.d, log: this.d.ctx.log }, id).then(() => undefined);
    const p = step
      .catch((e: unknown) => this.d.ctx.log.warn({ allocation: id, kind, error: e instanceof Error ? e.message : String(e) }, "allocation step failed; retried at its due time"))
      .finally(() => {
        this.#busy.delete(key);
        this.#running.delete(p);
      });
    this.#running.add(p);
  }

  /** Resolves once every step started so far has ended (stop, tests). */
  async idle(): Promise<void> {
    while (this.#running.size > 0) await Promise.allSettled([...this.#running]);
  }
}

/**
 * Test hook, like the store's pauseForTest: when NODE_ENV=test and
 * BERTH_TEST_PAUSE_AT names `point`, print `berth-test: paused at <point>`
 * on stderr and wait forever, so a test can SIGKILL the coordinator exactly
 * there. Without both variables this is a no-op.
 */
export async function pauseForTestAt(point: string): Promise<void> {
  if (process.env.NODE_ENV !== "test" || process.env.BERTH_TEST_PAUSE_AT !== point) return;
  process.stderr.write(`berth-test: paused at ${point}\n`);
  await new Promise<never>(() => setInterval(() => undefined, 60_000));
}
