/**
 * The reconciler in the background (reconciler.ts is one tick): a tick
 * whenever kicked, and at least every `intervalMs`; the operations a tick
 * started run after its commits, beside the next ticks.
 */
import type { Ctx } from "./context.js";
import type { Reconciler } from "./reconciler.js";

/**
 * Runs the reconciler in the background: a tick whenever kicked, and at
 * least every `intervalMs`. Started operations run concurrently; an operation
 * already running in this process is not started twice.
 */
export class ReconcilerLoop {
  #timer: NodeJS.Timeout | null = null;
  #running = false;
  #again = false;
  // Not running until start(): a kick before it (reconcile: false) must not tick behind the caller's back.
  #stopped = true;
  readonly #inflight = new Set<Promise<void>>();

  readonly #reconciler: Reconciler;

  constructor(reconciler: Reconciler, private readonly intervalMs = 250) {
    this.#reconciler = reconciler;
  }

  private get ctx(): Ctx {
    return this.#reconciler.deps.ctx;
  }

  start(): void {
    this.#stopped = false;
    this.#schedule(0);
  }

  kick(): void {
    if (this.#stopped) return;
    if (this.#running) {
      this.#again = true;
      return;
    }
    this.#schedule(0);
  }

  #schedule(ms: number): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = setTimeout(() => void this.#run(), ms);
    this.#timer.unref?.();
  }

  async #run(): Promise<void> {
    if (this.#stopped || this.#running) return;
    this.#running = true;
    this.#again = false;
    try {
      const r = await this.#reconciler.tick();
      for (const s of r.started) {
        const p = this.#reconciler.deps.executor.execute(s)
          .catch((e: unknown) => this.ctx.log.error({ err: String(e), op: s.op.id }, "operation completion failed; it will be retried from its due row"))
          .finally(() => this.#inflight.delete(p));
        this.#inflight.add(p);
      }
      if (r.visited >= 256) this.#again = true;
    } catch (e) {
      this.ctx.log.error({ err: String(e) }, "reconciler tick failed; retrying");
    } finally {
      this.#running = false;
      if (!this.#stopped) this.#schedule(this.#again ? 0 : this.intervalMs);
    }
  }

  /** Stops ticking and waits for operations under way. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    while (this.#running) await new Promise((r) => setTimeout(r, 5));
    await Promise.allSettled([...this.#inflight]);
  }
}
