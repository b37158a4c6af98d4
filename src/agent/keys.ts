/**
 * The agent's key authority: which public keys may open SSH sessions into
 * which machine, right now. The SSH gateway asks `authorize` on every login
 * (an O(1) lookup in memory) and listens to `onRevoked` to cut sessions.
 *
 * Guarantees:
 *   - A key authenticates only for a machine the agent has attached (its
 *     record matched the runtime), only while `now < expiresAt` (at equality
 *     it is already expired), and a grant key only at the machine's current
 *     generation (a keeper key is the keeper pool's long-lived key: it is not
 *     tied to a generation; see `supersededAt`).
 *   - Expiry is enforced here, by the agent alone: one timer per key fires at
 *     `expiresAt`, deletes the key durably and notifies every `onRevoked`
 *     listener, so a coordinator outage never extends access.
 *   - Advancing a machine to generation g removes every grant key of a
 *     generation below g (notified as revoked).
 *
 * Ordering: a key is written to the store (in the caller's transaction, with
 * the operation's result) before it is added to the index, so a crash can
 * only lose an install that was never confirmed. A removal leaves the index
 * only after its transaction commits, and is notified right after, so the
 * stored state never claims less access than the index grants; the window
 * is one synchronous commit.
 */
import type { KeyAuthority } from "./contracts.js";
import { errorMessage, type AgentLog } from "./log.js";
import type { AgentStore, StoredKey } from "./store/store.js";

/** Node's timers take at most 2^31-1 ms; longer expiries re-arm in steps. */
const MAX_TIMER_MS = 2_147_483_647;

export type RevokeReason = "removed" | "superseded" | "expired" | "destroyed";

/** Which key(s) to remove: by grant, by fingerprint, or both (a key matching either goes). */
export interface KeySelector {
  grantId?: string;
  fingerprint?: string;
}

function selects(which: KeySelector, k: StoredKey): boolean {
  return (which.grantId !== undefined && k.grantId === which.grantId) || (which.fingerprint !== undefined && k.fingerprint === which.fingerprint);
}

export interface AgentKeysDeps {
  /** The durable record of installed keys. */
  store: AgentStore;
  /** The clock that decides expiry (epoch ms). */
  now: () => number;
  /** Where expiries and listener failures are reported. */
  log: AgentLog;
}

type Listener = (machineId: string, fingerprint: string, grantId: string) => void;

export class AgentKeys implements KeyAuthority {
  readonly #deps: AgentKeysDeps;
  /** machineId -> fingerprint -> key; only attached machines appear. */
  readonly #index = new Map<string, Map<string, StoredKey>>();
  /** machineId -> current generation, for attached machines. */
  readonly #generation = new Map<string, number>();
  readonly #timers = new Map<string, NodeJS.Timeout>();
  readonly #listeners: Listener[] = [];
  #closed = false;

  constructor(deps: AgentKeysDeps) {
    this.#deps = deps;
  }

  // ---- KeyAuthority ------------------------------------------------------

  authorize(machineId: string, fingerprint: string, now: number): StoredKey | null {
    const key = this.#index.get(machineId)?.get(fingerprint);
    if (key === undefined) return null;
    if (key.mode === "grant" && key.generation !== this.#generation.get(machineId)) return null;
    if (key.expiresAt !== null && now >= key.expiresAt) return null;
    return key;
  }

  onRevoked(listener: Listener): void {
    this.#listeners.push(listener);
  }

  // ---- what the agent's operations and recovery call ---------------------

  /** Installed keys of a machine (attached or not), from memory when attached. */
  list(machineId: string): StoredKey[] {
    const m = this.#index.get(machineId);
    return m ? [...m.values()] : this.#deps.store.keys.list(machineId);
  }

  generationOf(machineId: string): number | undefined {
    return this.#generation.get(machineId);
  }

  /**
   * Makes a machine's stored keys usable (start-up, recovery, create). Keys
   * already expired or of an older generation are dropped durably first.
   * Returns what was dropped.
   */
  attach(machineId: string, generation: number): StoredKey[] {
    const now = this.#deps.now();
    const stored = this.#deps.store.keys.list(machineId);
    const dropped = stored.filter((k) => supersededAt(k, generation) || (k.expiresAt !== null && now >= k.expiresAt));
    if (dropped.length > 0) {
      this.#deps.store.transaction(() => {
        for (const k of dropped) this.#deps.store.keys.delete(machineId, k.fingerprint);
      });
    }
    this.#generation.set(machineId, generation);
    const m = new Map<string, StoredKey>();
    this.#index.set(machineId, m);
    for (const k of stored) {
      if (dropped.includes(k)) continue;
      m.set(k.fingerprint, k);
      this.#arm(k);
    }
    return dropped;
  }

  /**
   * Moves a machine to generation `generation` (never backwards) and removes
   * every key of an older generation. `within` runs in the same transaction.
   */
  advance(machineId: string, generation: number, within?: () => void): StoredKey[] {
    const current = this.#generation.get(machineId);
    if (current !== undefined && generation < current) {
      throw new Error(`generation of ${machineId} cannot move back from ${current} to ${generation}`);
    }
    const older = this.list(machineId).filter((k) => supersededAt(k, generation));
    this.#deps.store.transaction(() => {
      for (const k of older) this.#deps.store.keys.delete(machineId, k.fingerprint);
      this.#deps.store.removedKeys.prune(machineId, generation);
      within?.();
    });
    this.#generation.set(machineId, generation);
    if (!this.#index.has(machineId)) this.#index.set(machineId, new Map());
    this.#forget(older, "superseded");
    return older;
  }

  /**
   * Installs a key for the machine's current generation, replacing a key of
   * the same fingerprint; advances the generation first when the key's is
   * newer. `within` runs in the same transaction as the write.
   * Returns the keys superseded by the generation advance.
   */
  install(key: StoredKey, within?: () => void): StoredKey[] {
    const current = this.#generation.get(key.machineId);
    if (current === undefined) throw new Error(`machine ${key.machineId} is not attached`);
    if (key.generation < current) {
      throw new Error(`key for generation ${key.generation} of ${key.machineId}, which is at ${current}`);
    }
    const older = this.list(key.machineId).filter((k) => supersededAt(k, key.generation));
    const replaced = this.#index.get(key.machineId)?.get(key.fingerprint);
    this.#deps.store.transaction(() => {
      for (const k of older) this.#deps.store.keys.delete(key.machineId, k.fingerprint);
      this.#deps.store.removedKeys.prune(key.machineId, key.generation);
      this.#deps.store.keys.put(key);
      within?.();
    });
    this.#generation.set(key.machineId, key.generation);
    this.#forget(older, "superseded");
    if (replaced !== undefined && !older.includes(replaced) && replaced.grantId !== key.grantId) {
      this.#forget([replaced], "superseded");
    }
    let m = this.#index.get(key.machineId);
    if (m === undefined) {
      m = new Map();
      this.#index.set(key.machineId, m);
    }
    m.set(key.fingerprint, key);
    this.#arm(key);
    return older;
  }

  /**
   * Removes the key(s) named by grant id and/or fingerprint (a key matching
   * either: removing more access is the safe side) at `generation`,
   * and remembers the removal so a delayed install of the same grant or key
   * at that generation is refused. `within` runs in the same transaction.
   */
  remove(machineId: string, which: KeySelector, generation: number, within?: () => void): StoredKey[] {
    const now = this.#deps.now();
    const matches = this.list(machineId).filter((k) => selects(which, k));
    this.#deps.store.transaction(() => {
      for (const k of matches) {
        this.#deps.store.keys.delete(machineId, k.fingerprint);
        this.#deps.store.removedKeys.record(machineId, k.generation, k.grantId, k.fingerprint, now);
      }
      this.#deps.store.removedKeys.record(machineId, generation, which.grantId ?? null, which.fingerprint ?? null, now);
      within?.();
    });
    this.#forget(matches, "removed");
    return matches;
  }

  /** Removes every key of a machine and forgets it (destroy). `within` runs in the same transaction. */
  drop(machineId: string, within?: () => void): StoredKey[] {
    const all = this.list(machineId);
    this.#deps.store.transaction(() => {
      for (const k of all) this.#deps.store.keys.delete(machineId, k.fingerprint);
      within?.();
    });
    this.#forget(all, "destroyed");
    this.#index.delete(machineId);
    this.#generation.delete(machineId);
    return all;
  }

  /** Stops every timer (agent shutdown). Keys stay stored; the next process re-arms them. */
  close(): void {
    this.#closed = true;
    for (const t of this.#timers.values()) clearTimeout(t);
    this.#timers.clear();
  }

  // ---- internals ---------------------------------------------------------

  #arm(key: StoredKey): void {
    const id = timerId(key.machineId, key.fingerprint);
    const old = this.#timers.get(id);
    if (old !== undefined) clearTimeout(old);
    this.#timers.delete(id);
    if (key.expiresAt === null || this.#closed) return;
    const delay = Math.max(0, Math.min(key.expiresAt - this.#deps.now(), MAX_TIMER_MS));
    const t = setTimeout(() => this.#expire(key), delay);
    t.unref();
    this.#timers.set(id, t);
  }

  #expire(key: StoredKey): void {
    this.#timers.delete(timerId(key.machineId, key.fingerprint));
    const current = this.#index.get(key.machineId)?.get(key.fingerprint);
    if (current !== key || key.expiresAt === null) return; // replaced or removed meanwhile
    if (this.#deps.now() < key.expiresAt) {
      this.#arm(key); // a timer may fire a little early against this clock, or the delay was capped
      return;
    }
    try {
      this.#deps.store.keys.delete(key.machineId, key.fingerprint);
    } catch (e) {
      // The index still refuses it (now >= expiresAt); the next start drops it.
      this.#deps.log.error({ machineId: key.machineId, fingerprint: key.fingerprint, error: errorMessage(e) }, "could not delete an expired key from the store");
    }
    this.#deps.log.info(
      { machineId: key.machineId, fingerprint: key.fingerprint, grantId: key.grantId, expiresAt: key.expiresAt },
      "key expired: it no longer authenticates and its sessions are cut",
    );
    this.#forget([key], "expired");
  }

  /** Out of the index, timer cleared, listeners told. */
  #forget(keys: StoredKey[], reason: RevokeReason): void {
    for (const k of keys) {
      const m = this.#index.get(k.machineId);
      if (m?.get(k.fingerprint) === k) m.delete(k.fingerprint);
      const id = timerId(k.machineId, k.fingerprint);
      const t = this.#timers.get(id);
      if (t !== undefined && m?.get(k.fingerprint) === undefined) {
        clearTimeout(t);
        this.#timers.delete(id);
      }
      for (const l of this.#listeners) {
        try {
          l(k.machineId, k.fingerprint, k.grantId);
        } catch (e) {
          this.#deps.log.error(
            { machineId: k.machineId, fingerprint: k.fingerprint, reason, error: errorMessage(e) },
            "a revocation listener failed",
          );
        }
      }
    }
  }
}

/**
 * A grant key belongs to one generation (one borrow) and goes when the
 * machine moves past it. A keeper key is the keeper pool's long-lived key:
 * installed once (at provisioning), it outlives keeper borrows, which advance
 * the generation without any key operation; it goes only when removed,
 * expired or destroyed with the machine.
 */
export function supersededAt(k: StoredKey, generation: number): boolean {
  return k.mode === "grant" && k.generation < generation;
}

function timerId(machineId: string, fingerprint: string): string {
  return `${machineId}\0${fingerprint}`;
}
