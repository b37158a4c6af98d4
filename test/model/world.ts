/**
 * The system under test for the model-based tests: a real coordinator
 * (startCoordinator, a real SQLite file, the real actions, reconciler tick
 * and operation executor) with a scripted provider at the outermost
 * boundary, driven step by step under a TestClock. The background loop is
 * stopped: the test decides when the reconciler ticks and when each started
 * operation reaches the provider, so every interleaving is reproducible
 * from the seed.
 *
 * Clients of the coordinator (keeper borrowers, portable borrowers, the
 * outside keeper that registers machines) are simulated here too; what they
 * were told (tokens, expiries, generations) is the reference model the
 * invariant checks in checks.ts compare the store and the provider against.
 */
import { join } from "node:path";
import pino from "pino";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { startCoordinator, type Coordinator } from "../../src/coordinator/server.js";
import { authenticate, createToken, type Principal, type Role } from "../../src/coordinator/auth.js";
import { ensurePool, type EnsureInput } from "../../src/coordinator/actions/pools.js";
import { registerMachine } from "../../src/coordinator/actions/register.js";
import { borrowKeeper, heartbeatKeeper, returnKeeper } from "../../src/coordinator/actions/borrow.js";
import { enrollHost } from "../../src/coordinator/actions/hosts.js";
import { drainPool } from "../../src/coordinator/actions/drain.js";
import type { StartedOp } from "../../src/coordinator/executor.js";
import { isBerthError } from "../../src/core/errors.js";
import type { PortableApi } from "../../src/coordinator/actions/portable-api.js";
import { TestClock } from "../helpers/env.js";
import { AGENT_PROFILE, SimulatedAgentProvider, type Fault, type Parked, type SimProfile } from "./simulated-agent-provider.js";
import { Checks, InvariantViolation } from "./checks.js";

export type PoolName = "ext" | "kp" | "pp";

export const CONFIG = { portable: true, ackTimeoutMs: 20_000, maxBorrowMs: 120_000, claimTtlMs: 60_000, retentionMs: 600_000 };
export const HEARTBEAT_MS = 10_000;
export const HARD_TTL_MS = 3_600_000;

const POOLS: Record<PoolName, Omit<EnsureInput, "minReady" | "maxReady" | "name">> = {
  ext: { compatibilityKey: "ext", access: "keeper", provider: "external", identity: null, hardTtlMs: HARD_TTL_MS, heartbeatMs: HEARTBEAT_MS, keeperKey: null },
  kp: { compatibilityKey: "kp", access: "keeper", provider: "hosts", identity: null, hardTtlMs: HARD_TTL_MS, heartbeatMs: HEARTBEAT_MS, keeperKey: "ssh-ed25519 AAAAkeeper" },
  pp: { compatibilityKey: "pp", access: "portable", provider: "hosts", identity: null, hardTtlMs: HARD_TTL_MS, heartbeatMs: HEARTBEAT_MS, keeperKey: null },
};

/** Deterministic pseudo-random bytes (mulberry32), so ids and tokens follow the seed. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function ed25519Line(i: number): string {
  const type = Buffer.from("ssh-ed25519");
  const key = Buffer.alloc(32, i + 1);
  const blob = Buffer.concat([Buffer.from([0, 0, 0, type.length]), type, Buffer.from([0, 0, 0, 32]), key]);
  return `ssh-ed25519 ${blob.toString("base64")} model-${i}`;
}
export const KEYS = [0, 1, 2].map(ed25519Line);

export interface ClientBorrow {
  kind: "keeper" | "portable";
  id: string;
  token: string;
  grantToken: string | null;
  pool: PoolName;
  machineId: string;
  publicKey: string | null;
  expiresAt: number;
  /** The client's view: whether an ack answered `active`. */
  active: boolean;
  done: boolean;
}

interface InFlight {
  /** The provider's parked call this request waits on. */
  parked: Parked;
  what: string;
  promise: Promise<{ ok: true; value: unknown } | { ok: false; error: unknown }>;
  onSettle: (r: { ok: true; value: unknown } | { ok: false; error: unknown }) => void;
}

/** Refusals a client may legitimately get; anything else is a defect. */
const EXPECTED = new Set([
  "pool_exhausted", "borrow_not_active", "borrow_expired", "generation_mismatch", "claim_consumed", "claim_expired", "claim_not_found",
  "namespace_conflict", "portable_unsupported", "grant_expired", "grant_not_pending", "token_mismatch", "key_mismatch", "conflict", "not_found", "forbidden",
]);

export class World {
  readonly clock = new TestClock();
  readonly provider: SimulatedAgentProvider;
  readonly checks: Checks;
  readonly secrets: string[] = [];
  readonly borrows: ClientBorrow[] = [];
  readonly claims: Array<{ token: string; used: boolean }> = [];
  readonly inflight: InFlight[] = [];
  readonly trace: string[] = [];
  store!: SqliteStore;
  coord!: Coordinator;
  portable!: PortableApi;
  #tokens = new Map<Role, string>();
  #resources = 0;
  readonly #random: () => number;

  private constructor(readonly dir: string, seed: number, profile: SimProfile) {
    this.#random = seededRandom(seed);
    this.provider = new SimulatedAgentProvider(this.clock.now, profile, seededRandom(seed ^ 0xa75));
    this.checks = new Checks(this);
  }

  static async start(dir: string, seed: number, profile: SimProfile = AGENT_PROFILE): Promise<World> {
    const w = new World(dir, seed, profile);
    await w.#open();
    for (const role of ["operator", "member", "agent"] as Role[]) {
      const t = await createToken(w.store, { org: "acme", role, expiresAt: null, label: null }, w.clock.now(), w.randomBytes);
      w.#tokens.set(role, t.token);
      w.secrets.push(t.token);
    }
    await enrollHost(w.coord.ctx, await w.principal("agent"), { name: "h1", url: "http://127.0.0.1:1", runtime: "process", capacity: { vcpu: 8, memoryMib: 8192, slots: 5 }, ssh: { host: "127.0.0.1", port: 2222, hostKey: "ssh-ed25519 AAAAscripted", fingerprint: "SHA256:x" } }, new Uint8Array(32));
    return w;
  }

  readonly randomBytes = (n: number): Uint8Array => {
    const b = new Uint8Array(n);
    for (let i = 0; i < n; i++) b[i] = Math.floor(this.#random() * 256);
    return b;
  };

  async #open(): Promise<void> {
    this.store = new SqliteStore({ path: join(this.dir, "berth.db") });
    this.coord = await startCoordinator({
      store: this.store,
      secret: new Uint8Array(32).fill(7),
      log: pino({ level: "silent" }),
      now: this.clock.now,
      randomBytes: this.randomBytes,
      providers: [this.provider],
      config: { ...CONFIG, ...(this.provider.profile.claimTtlMs ? { claimTtlMs: this.provider.profile.claimTtlMs } : {}) },
      reconcile: false,
    });
    // No background ticks at all (kicks included): the test schedules every step.
    await this.coord.loop.stop();
    this.portable = this.coord.portable!;
  }

  /** What a run exercised (audit events and provider effects), so a summary shows the runs are not vacuous. */
  async stats(): Promise<Record<string, number>> {
    const rows = await this.store.transaction((tx) => tx.all<{ event: string; n: number }>("SELECT event, COUNT(*) AS n FROM audit GROUP BY event"));
    const out: Record<string, number> = {};
    for (const r of rows) out[r.event] = Number(r.n);
    out.crashes = this.provider.epoch;
    out.orphans_delivered = this.#orphansDelivered;
    Object.assign(out, this.provider.counts);
    return out;
  }
  #orphansDelivered = 0;

  async close(): Promise<void> {
    await this.coord.stop();
    await this.store.close();
  }

  principal(role: Role): Promise<Principal> {
    return authenticate(this.store, `Bearer ${this.#tokens.get(role)!}`, this.clock.now());
  }

  note(s: string): void {
    this.trace.push(`${this.clock.now() - Date.UTC(2026, 10, 29, 12)}ms ${s}`);
  }

  /** Runs an action; an expected refusal is returned as its code, anything else fails the run. */
  async #call<T>(what: string, f: () => Promise<T>): Promise<{ ok: true; value: T } | { ok: false; code: string }> {
    try {
      return { ok: true, value: await f() };
    } catch (e) {
      if (isBerthError(e) && EXPECTED.has(e.code)) {
        this.note(`${what} refused: ${e.code}`);
        return { ok: false, code: e.code };
      }
      throw new InvariantViolation("crash", `${what} failed unexpectedly: ${e instanceof Error ? e.stack ?? e.message : String(e)}`);
    }
  }

  /** Waits until `p` settles or the provider parks the call it made. */
  async #settleOrPark<T>(start: () => Promise<T>): Promise<{ settled: true; value: { ok: true; value: T } | { ok: false; error: unknown } } | { settled: false; parked: Parked; promise: Promise<{ ok: true; value: T } | { ok: false; error: unknown }> }> {
    const before = this.provider.parked.length;
    const parked = new Promise<"parked">((resolve) => {
      this.provider.onPark = () => resolve("parked");
    });
    // Started only now: the provider may be called synchronously, before the first await.
    const wrapped = start().then((value) => ({ ok: true as const, value }), (error: unknown) => ({ ok: false as const, error }));
    const r = await Promise.race([wrapped, parked]);
    this.provider.onPark = null;
    if (r === "parked" && this.provider.parked.length > before) {
      return { settled: false, parked: this.provider.parked[this.provider.parked.length - 1]!, promise: wrapped };
    }
    return { settled: true, value: await wrapped };
  }

  // ---- commands ----

  async ensure(pool: PoolName, minReady: number, maxReady: number): Promise<void> {
    const p = await this.principal("operator");
    const r = await this.#call(`ensure ${pool}`, () => ensurePool(this.coord.ctx, p, { name: pool, minReady, maxReady, ...POOLS[pool] }));
    if (r.ok) {
      for (const c of r.value.claims) {
        this.secrets.push(c.token);
        this.claims.push({ token: c.token, used: false });
      }
      this.note(`ensure ${pool} ${minReady}/${maxReady}: ${r.value.claims.length} claims`);
    }
    await this.checks.afterFill();
  }

  async register(claimIdx: number, reuseResource: boolean): Promise<void> {
    if (this.claims.length === 0) return;
    const c = this.claims[claimIdx % this.claims.length]!;
    const resourceId = reuseResource && this.#resources > 0 ? `vm-${this.#resources}` : `vm-${++this.#resources}`;
    const p = await this.principal("operator");
    const r = await this.#call("register", () => registerMachine(this.coord.ctx, p, { pool: "ext", claimToken: c.token, resourceId, ssh: { host: "10.0.0.1", port: 22, user: "ci", hostKey: null }, hardTtlMs: null }));
    if (r.ok) {
      if (c.used) throw new InvariantViolation("I7", "a fill claim registered a second machine");
      c.used = true;
    }
    this.note(`register ${resourceId}: ${r.ok ? r.value.machineId : r.code}`);
  }

  async borrow(pool: PoolName, crossNamespace: boolean, keyIdx: number, durationMs: number | null): Promise<void> {
    const p = await this.principal("member");
    const portable = (pool === "pp") !== crossNamespace;
    const now = this.clock.now();
    if (!portable) {
      const r = await this.#call(`borrow ${pool}`, () => borrowKeeper(this.coord.ctx, p, pool));
      if (crossNamespace && r.ok) throw new InvariantViolation("I10", `a keeper borrow was served from portable pool ${pool}`);
      if (!r.ok) return;
      this.secrets.push(r.value.borrowToken);
      this.borrows.push({ kind: "keeper", id: r.value.borrowId, token: r.value.borrowToken, grantToken: null, pool, machineId: r.value.machine.id, publicKey: null, expiresAt: r.value.expiresAt, active: true, done: false });
      this.note(`borrow ${pool} -> ${r.value.borrowId} on ${r.value.machine.id}@${r.value.machine.generation}`);
      return;
    }
    const publicKey = KEYS[keyIdx % KEYS.length]!;
    const r = await this.#call(`borrow portable ${pool}`, () => this.portable.borrow(p, pool, { publicKey, ...(durationMs === null ? {} : { durationMs }) }, null));
    if (crossNamespace && r.ok) throw new InvariantViolation("I10", `a portable borrow was served from keeper pool ${pool}`);
    if (!r.ok) return;
    const v = r.value as { borrowId: string; borrowToken: string; grantToken: string; expiresAt: number; machine: { id: string; generation: number } };
    this.secrets.push(v.borrowToken, v.grantToken);
    this.borrows.push({ kind: "portable", id: v.borrowId, token: v.borrowToken, grantToken: v.grantToken, pool, machineId: v.machine.id, publicKey, expiresAt: v.expiresAt, active: false, done: false });
    await this.checks.onIssued(v.borrowId, v.expiresAt, now, durationMs);
    this.note(`borrow portable -> ${v.borrowId} on ${v.machine.id}@${v.machine.generation} expires +${v.expiresAt - now}`);
  }

  #pick(idx: number, f: (b: ClientBorrow) => boolean = (b) => !b.done): ClientBorrow | undefined {
    const live = this.borrows.filter(f);
    return live.length ? live[idx % live.length] : undefined;
  }

  async ack(idx: number, fault: Fault, wrongKey: boolean): Promise<void> {
    const b = this.#pick(idx, (x) => x.kind === "portable" && !x.done);
    if (!b) return;
    const p = await this.principal("member");
    const publicKey = wrongKey ? KEYS[(KEYS.indexOf(b.publicKey!) + 1) % KEYS.length]! : b.publicKey!;
    this.provider.faults = [fault];
    this.note(`ack ${b.id} (${fault}${wrongKey ? ", wrong key" : ""})`);
    const r = await this.#settleOrPark(() => this.portable.ack(p, b.id, { token: b.token, grantToken: b.grantToken!, publicKey }));
    this.provider.faults = [];
    const onAck = (x: { ok: true; value: unknown } | { ok: false; error: unknown }) => {
      if (!x.ok) {
        if (isBerthError(x.error) && EXPECTED.has(x.error.code)) return;
        throw new InvariantViolation("crash", `ack failed unexpectedly: ${String(x.error)}`);
      }
      const shown = x.value as { state: string; expiresAt: number };
      if (shown.state === "active") {
        if (this.clock.now() >= shown.expiresAt) throw new InvariantViolation("I2", `ack answered active for ${b.id} at or after its expiry`);
        if (!wrongKey) b.active = true;
      }
    };
    if (r.settled) onAck(r.value);
    else this.inflight.push({ parked: r.parked, what: `ack ${b.id}`, promise: r.promise, onSettle: onAck });
  }

  async heartbeat(idx: number): Promise<void> {
    const b = this.#pick(idx);
    if (!b) return;
    const p = await this.principal("member");
    const before = await this.checks.deadlinesOf(b);
    const now = this.clock.now();
    const r = await this.#call(`heartbeat ${b.id}`, () =>
      b.kind === "keeper" ? heartbeatKeeper(this.coord.ctx, p, b.id, b.token) : this.portable.heartbeat(p, b.id, { token: b.token, grantToken: b.grantToken! }),
    );
    if (r.ok) {
      this.note(`heartbeat ${b.id}`);
      if (before && now >= before.expiresAt) throw new InvariantViolation("I6", `a heartbeat at or after expiry was accepted for ${b.id}`);
      if (before && before.live && now >= before.heartbeatDeadline) throw new InvariantViolation("I6", `a late heartbeat revived ${b.id} (deadline ${before.heartbeatDeadline}, now ${now})`);
    }
  }

  async return(idx: number, drain: boolean): Promise<void> {
    const b = this.#pick(idx);
    if (!b) return;
    const p = await this.principal("member");
    const disposition = drain ? "drain" : "ready";
    const r = await this.#call(`return ${b.id}`, () =>
      b.kind === "keeper" ? returnKeeper(this.coord.ctx, p, b.id, b.token, disposition) : this.portable.return(p, b.id, { token: b.token, grantToken: b.grantToken!, disposition }),
    );
    if (r.ok || r.code === "borrow_not_active" || r.code === "borrow_expired") b.done = true;
    this.note(`return ${b.id} ${disposition}: ${r.ok ? "ok" : r.code}`);
  }

  /** The borrower opens an SSH session with what it holds; the provider's gateway decides. */
  async connect(idx: number): Promise<void> {
    const b = this.#pick(idx, (x) => !x.done && (x.active || x.kind === "keeper"));
    if (!b) return;
    const m = await this.checks.machine(b.machineId);
    if (!m) return;
    const fingerprint = b.kind === "keeper" ? "keeper" : (await import("../../src/core/ssh-public-key.js")).parsePublicKey(b.publicKey).fingerprint;
    const opened = this.provider.openSession(m.resource_id, fingerprint);
    this.note(`connect ${b.id}: ${opened ? "session open" : "refused"}`);
    if (opened && b.kind === "portable") await this.checks.onSession(b);
  }

  async tick(faults: Fault[], duplicate: boolean): Promise<void> {
    if (process.env.BERTH_MODEL_DEBUG) {
      const due = await this.store.transaction((tx) => tx.all<{ kind: string; ref: string; due_at: number }>("SELECT kind, ref, due_at FROM due WHERE due_at <= ? ORDER BY due_at, kind, ref", [this.clock.now()]));
      this.note(`due: ${due.map((d) => `${d.kind}:${d.ref}@${d.due_at - this.clock.now()}`).join(" ")}`);
    }
    // A tick stops early when a row it handled is due again at once (a fill
    // re-armed by a quarantine); the loop's next pass takes the rest. Run the
    // passes the loop would run, then check that nothing due is left undone.
    const r = { visited: 0, started: [] as StartedOp[] };
    for (let pass = 0; pass < 4; pass++) {
      const one = await this.coord.reconciler.tick();
      r.visited += one.visited;
      r.started.push(...one.started);
      const left = await this.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM due WHERE due_at <= ?", [this.clock.now()]));
      if (one.visited === 0 || Number(left?.n ?? 0) === 0) break;
    }
    this.note(`tick: visited ${r.visited}, started ${r.started.map((s) => `${s.op.kind}@${s.op.generation}`).join(",")}`);
    await this.checks.afterFill();
    await this.checks.afterTick();
    for (let i = 0; i < r.started.length; i++) await this.#execute(r.started[i]!, faults[i % Math.max(1, faults.length)] ?? "none", duplicate && i === 0);
  }

  async #execute(s: StartedOp, fault: Fault, duplicate: boolean): Promise<void> {
    this.provider.faults = [fault];
    const r = await this.#settleOrPark(() => this.coord.executor.execute(s));
    this.provider.faults = [];
    const onDone = (x: { ok: true; value: unknown } | { ok: false; error: unknown }) => {
      if (!x.ok) throw new InvariantViolation("crash", `executing ${s.op.kind} ${s.op.id} failed: ${String(x.error)}`);
    };
    if (!r.settled) {
      this.note(`${s.op.kind}@${s.op.generation} parked`);
      this.inflight.push({ parked: r.parked, what: `${s.op.kind} ${s.op.id}`, promise: r.promise, onSettle: onDone });
      return;
    }
    onDone(r.value);
    if (duplicate) {
      // The same completion delivered twice (a retried reply): the second must change nothing.
      this.note(`${s.op.kind}@${s.op.generation} duplicate completion`);
      await this.coord.executor.execute(s);
    }
  }

  /** A whole borrow cycle at once (borrow, ack, return, the ticks that clean up), so machines reach newer generations within a short sequence. */
  async cycle(pool: PoolName, keyIdx: number): Promise<void> {
    const before = this.borrows.length;
    await this.borrow(pool, false, keyIdx, null);
    if (this.borrows.length === before) return;
    const b = this.borrows[this.borrows.length - 1]!;
    if (b.kind === "portable") await this.ack(this.borrows.filter((x) => x.kind === "portable" && !x.done).indexOf(b), "none", false);
    await this.return(this.borrows.filter((x) => !x.done).indexOf(b), false);
    for (let i = 0; i < 4; i++) await this.tick([], false);
  }

  async deliver(idx: number): Promise<void> {
    if (this.provider.parked.length === 0) return;
    const p = this.provider.deliver(idx % this.provider.parked.length)!;
    this.note(`deliver ${p.kind} ${p.opId}`);
    const at = this.inflight.findIndex((f) => f.parked === p);
    if (at < 0) return;
    const f = this.inflight.splice(at, 1)[0]!;
    f.onSettle(await f.promise);
  }

  async deliverOrphan(idx: number): Promise<void> {
    if (this.provider.orphans.length === 0) return;
    this.note(`late request of a dead coordinator reaches the machine`);
    this.provider.deliverOrphan(idx % this.provider.orphans.length);
    this.#orphansDelivered++;
  }

  async advance(ms: number): Promise<void> {
    this.clock.advance(ms);
    this.note(`advance ${ms}`);
  }

  /** Moves the clock to exactly the next deadline in the due index (or a client-known expiry). */
  async advanceToDeadline(idx: number): Promise<void> {
    const now = this.clock.now();
    // Mostly the near deadlines (ack, heartbeat, expiry, retries); now and then the far ones (TTL rotation, retention).
    const far = idx % 8 === 7 ? "" : " AND kind NOT IN ('ttl','retention')";
    const due = await this.store.transaction((tx) => tx.all<{ due_at: number }>(`SELECT DISTINCT due_at FROM due WHERE due_at > ?${far} ORDER BY due_at LIMIT 4`, [now]));
    const times = [...due.map((d) => Number(d.due_at)), ...this.borrows.filter((b) => !b.done && b.expiresAt > now).map((b) => b.expiresAt)];
    if (times.length === 0) return;
    const t = times.sort((a, b) => a - b)[idx % times.length]!;
    this.clock.t = t;
    this.note(`advance to deadline ${t - now}ms ahead`);
  }

  /**
   * With a slow provider (the AWS profile), time moves on while the
   * reconciler runs until the first launches are up, so sequences start from
   * filled pools as they do with the agent profile (where this does nothing).
   */
  async warmUp(): Promise<void> {
    if (this.provider.profile.provisionPolls === 0 && this.provider.profile.provisionMs === 0) return;
    for (let i = 0; i < 12; i++) {
      const left = await this.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE state = 'provisioning'"));
      if (Number(left?.n ?? 0) === 0) return;
      await this.advance(31_000);
      await this.tick([], false);
    }
  }

  async drain(pool: PoolName, force: boolean): Promise<void> {
    const p = await this.principal("operator");
    await this.#call(`drain ${pool}`, () => drainPool(this.coord.ctx, p, pool, force));
    this.note(`drain ${pool}${force ? " --force" : ""}`);
  }

  /** The coordinator process dies: calls under way lose their caller; the same SQLite file is reopened by a new one. */
  async crash(): Promise<void> {
    this.note("coordinator crash + restart");
    this.provider.crash();
    this.inflight.length = 0;
    await this.coord.stop();
    await this.store.close();
    await this.#open();
  }

  /**
   * No more faults: every parked reply arrives, late requests land, and time
   * moves on while the reconciler runs, until nothing is due. Every
   * obligation must finish from its durable record (invariant 9).
   */
  async settle(): Promise<void> {
    this.note("settle");
    while (this.provider.parked.length > 0) await this.deliver(0);
    while (this.provider.orphans.length > 0) await this.deliverOrphan(0);
    for (let round = 0; round < 80; round++) {
      this.clock.advance(31_000);
      const r = await this.coord.reconciler.tick();
      if (process.env.BERTH_MODEL_DEBUG) this.note(`settle tick: visited ${r.visited}, started ${r.started.map((s) => `${s.op.kind}@${s.op.generation}`).join(",")}`);
      for (const s of r.started) await this.#execute(s, "none", false);
      await this.checks.afterStep();
      const open = await this.store.transaction((tx) => tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM operations WHERE state IN ('pending','running')"));
      if (r.visited === 0 && Number(open?.n ?? 0) === 0 && round > 12) break;
    }
    await this.checks.settled();
  }
}
