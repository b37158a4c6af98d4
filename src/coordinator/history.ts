/**
 * The dashboard's history, as this coordinator sees it: borrows served (with
 * their latency) and returned are counted in memory per (organisation, pool,
 * 10-second bucket); every 10 s the closed buckets are written to the store
 * (`src/store/history.ts`) with each pool's machines by state class counted
 * then, and rows past the retention are deleted. A page reads the stored
 * buckets and adds this process's buckets not written yet.
 *
 * Beside them, labelled series (`src/store/history-series.ts`): provisions
 * given up and quarantines by reason class per pool, counted here the same
 * way, and allocation use per host and per owner, taken at each write.
 */
import type { Store } from "../store/store.js";
import { allPools, HISTORY_BUCKET_MS, machineStatesOfAllPools, writeHistory, type HistoryRow } from "../store/history.js";
import { allocationUse, writeSeries, type SeriesRow } from "../store/history-series.js";

/** A bucket's counts as this process keeps them until written (the state counts are taken at the write). */
type Counts = Pick<HistoryRow, "org" | "pool" | "at" | "started" | "returned" | "latency">;

/** Buckets kept in memory while the store cannot be written (the oldest are dropped past it). */
const MAX_PENDING = 10_000;

export class HistoryRecorder {
  readonly #pending = new Map<string, Counts>();
  readonly #events = new Map<string, SeriesRow>();
  constructor(readonly latencyBounds: readonly number[]) {}

  #bucket(org: string, pool: string, at: number): Counts {
    const start = at - (at % HISTORY_BUCKET_MS);
    const key = `${org}\0${pool}\0${start}`;
    let c = this.#pending.get(key);
    if (!c) {
      if (this.#pending.size >= MAX_PENDING) this.#pending.delete(this.#pending.keys().next().value!);
      this.#pending.set(key, (c = { org, pool, at: start, started: 0, returned: 0, latency: new Array<number>(this.latencyBounds.length + 1).fill(0) }));
    }
    return c;
  }

  borrowed(org: string, pool: string, at: number, latencySeconds: number): void {
    const c = this.#bucket(org, pool, at);
    c.started++;
    let i = this.latencyBounds.findIndex((b) => latencySeconds <= b);
    if (i < 0) i = this.latencyBounds.length;
    c.latency[i]!++;
  }

  returned(org: string, pool: string, at: number): void {
    this.#bucket(org, pool, at).returned++;
  }

  /** A pool's provision given up (`failed`) or its provisioning breaker opening (`breaker_open`). */
  provision(org: string, pool: string, at: number, label: "failed" | "breaker_open"): void {
    this.#event(org, pool, at, "provision", label);
  }

  /** A machine of a pool quarantined, by reason class (`berth_machines_quarantined_total`'s). */
  quarantined(org: string, pool: string, at: number, reason: string): void {
    this.#event(org, pool, at, "quarantine", reason);
  }

  #event(org: string, pool: string, at: number, series: "provision" | "quarantine", label: string): void {
    const start = at - (at % HISTORY_BUCKET_MS);
    const key = `${org}\0${pool}\0${start}\0${series}\0${label}`;
    const e = this.#events.get(key);
    if (e) e.value++;
    else {
      if (this.#events.size >= MAX_PENDING) this.#events.delete(this.#events.keys().next().value!);
      this.#events.set(key, { org, scope: pool, at: start, series, label, value: 1 });
    }
  }

  /** This process's counted series of a pool not written yet. */
  pendingSeries(org: string, pool: string): SeriesRow[] {
    return [...this.#events.values()].filter((e) => e.org === org && e.scope === pool).map((e) => ({ ...e }));
  }

  /** This process's buckets of a pool not written yet (no state counts: those are taken when a bucket is written). */
  pending(org: string, pool: string): HistoryRow[] {
    return [...this.#pending.values()].filter((c) => c.org === org && c.pool === pool).map((c) => ({ ...c, latency: [...c.latency], ready: null, lent: null, cleanup: null, quarantined: null }));
  }

  /**
   * Writes the buckets closed by `now` (with `all`, the open one too: at a
   * stop): each pool's last closed bucket even without borrows, so its state
   * counts are kept, and every pending bucket.
   */
  async flush(store: Store, instance: string, now: number, all = false): Promise<number> {
    const open = now - (now % HISTORY_BUCKET_MS);
    const closed = open - HISTORY_BUCKET_MS;
    const taken = [...this.#pending].filter(([, c]) => all || c.at < open);
    // Counted series are written as increments (a bucket's later counts add to what was written).
    const events = [...this.#events].filter(([, e]) => all || e.at < open).map(([key, e]) => ({ key, e, written: { ...e } }));
    const written = await store.transaction(async (tx) => {
      const states = new Map<string, { ready: number; lent: number; cleanup: number; quarantined: number }>();
      for (const p of await allPools(tx)) states.set(`${p.org}\0${p.pool}`, { ready: 0, lent: 0, cleanup: 0, quarantined: 0 });
      for (const s of await machineStatesOfAllPools(tx)) {
        const st = states.get(`${s.org}\0${s.pool}`);
        const cls = stateClassOf(s.state);
        if (st && cls) st[cls] += s.n;
      }
      const rows = new Map<string, HistoryRow>();
      for (const [key, st] of states) {
        const [org, pool] = key.split("\0") as [string, string];
        rows.set(`${key}\0${closed}`, { org, pool, at: closed, started: 0, returned: 0, latency: new Array<number>(this.latencyBounds.length + 1).fill(0), ...st });
      }
      for (const [key, c] of taken) {
        const st = states.get(`${c.org}\0${c.pool}`) ?? { ready: 0, lent: 0, cleanup: 0, quarantined: 0 };
        rows.set(key, { ...c, ...st });
      }
      await writeHistory(tx, instance, [...rows.values()], now);
      const series = [...events.map((x) => x.written), ...(await allocationUse(tx, closed))];
      await writeSeries(tx, instance, series, now);
      return rows.size;
    }, { name: "history" });
    for (const [key, c] of taken) if (this.#pending.get(key) === c) this.#pending.delete(key);
    for (const { key, e, written } of events) {
      e.value -= written.value;
      if (e.value <= 0 && this.#events.get(key) === e) this.#events.delete(key);
    }
    return written;
  }
}

/** Machine states grouped as the dashboard's capacity bars group them. */
export function stateClassOf(state: string): "ready" | "lent" | "cleanup" | "quarantined" | null {
  if (state === "ready") return "ready";
  if (state === "reserved" || state === "installing" || state === "busy") return "lent";
  if (state === "revoking" || state === "fencing" || state === "scrubbing") return "cleanup";
  if (state === "quarantined") return "quarantined";
  return null;
}
