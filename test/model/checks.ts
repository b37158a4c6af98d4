/**
 * PRODUCT.md's invariants, checked after every step of a model run against
 * the store (what the coordinator recorded), the scripted provider (what
 * really happened at the machines) and the reference model (what the
 * clients were told). Each failure names its invariant, e.g. "[I5] …", so
 * scripts/mutants.sh can report which check caught a broken build.
 */
import type { World, ClientBorrow } from "./world.js";
import type { MachineRow } from "../../src/store/machines.js";
import { parsePublicKey } from "../../src/core/ssh-public-key.js";

export class InvariantViolation extends Error {
  constructor(readonly check: string, message: string) {
    super(`[${check}] ${message}`);
    this.name = "InvariantViolation";
  }
}

function fail(check: string, message: string): never {
  throw new InvariantViolation(check, message);
}

interface GrantDb {
  id: string;
  machine_id: string;
  generation: number;
  fingerprint: string;
  state: string;
  expires_at: number;
  activated_at: number | null;
  heartbeat_deadline: number;
  ack_deadline: number;
}

interface BorrowDb {
  id: string;
  machine_id: string;
  state: string;
  generation: number;
  heartbeat_deadline: number;
  expires_at: number;
}

const GRANT_RANK: Record<string, number> = { pending: 0, installing: 1, active: 2, invalidated: 3, revoked: 4, fenced: 5, closed: 6 };
const GONE = new Set(["quarantined", "draining", "destroying", "destroyed"]);
const LENT = new Set(["reserved", "installing", "busy"]);
const CLEANUP = new Set(["revoking", "fencing", "scrubbing"]);
const TABLES = ["api_tokens", "pools", "hosts", "machines", "claims", "borrows", "grants", "due", "operations", "audit"];

export class Checks {
  readonly #expires = new Map<string, number>();
  readonly #grantRank = new Map<string, number>();
  readonly #borrowEnded = new Set<string>();
  readonly #machineGone = new Set<string>();
  readonly #total = new Map<string, number>();
  readonly #claimsSeen = new Set<string>();

  constructor(private readonly w: World) {}

  #q<T>(sql: string, params: (string | number)[] = []): Promise<T[]> {
    return this.w.store.transaction((tx) => tx.all<T>(sql, params));
  }

  async machine(id: string): Promise<MachineRow | undefined> {
    return (await this.#q<MachineRow>("SELECT * FROM machines WHERE id = ?", [id]))[0];
  }

  async deadlinesOf(b: ClientBorrow): Promise<{ expiresAt: number; heartbeatDeadline: number; live: boolean } | null> {
    if (b.kind === "keeper") {
      const r = (await this.#q<BorrowDb>("SELECT * FROM borrows WHERE id = ?", [b.id]))[0];
      return r ? { expiresAt: Number(r.expires_at), heartbeatDeadline: Number(r.heartbeat_deadline), live: r.state === "active" } : null;
    }
    const g = (await this.#q<GrantDb>("SELECT * FROM grants WHERE id = ?", [b.id]))[0];
    return g ? { expiresAt: Number(g.expires_at), heartbeatDeadline: Number(g.heartbeat_deadline), live: g.state === "active" } : null;
  }

  /** I3: the expiry fixed at issue is min(now + requested, now + 30 min, machine hard TTL, authorization expiry). */
  async onIssued(grantId: string, expiresAt: number, now: number, durationMs: number | null): Promise<void> {
    const g = (await this.#q<GrantDb>("SELECT * FROM grants WHERE id = ?", [grantId]))[0];
    if (!g) fail("I3", `grant ${grantId} was answered but not stored`);
    const m = (await this.machine(g.machine_id))!;
    const cap = Math.min(this.w.coord.ctx.config.maxBorrowMs, 30 * 60_000);
    const want = Math.min(now + Math.min(durationMs ?? cap, cap), now + 30 * 60_000, Number(m.hard_expires_at));
    if (expiresAt !== want || Number(g.expires_at) !== want) fail("I3", `grant ${grantId} expires at +${expiresAt - now}, stored +${Number(g.expires_at) - now}; want +${want - now}`);
    this.#expires.set(grantId, want);
  }

  /** A session admitted with a grant key: the key's grant must be unexpired (its expiry travelled with the install). */
  async onSession(b: ClientBorrow): Promise<void> {
    const fp = parsePublicKey(b.publicKey).fingerprint;
    const m = (await this.machine(b.machineId))!;
    const key = this.w.provider.machines.get(m.resource_id)?.keys.get(fp);
    if (!key) return;
    const g = (await this.#q<GrantDb>("SELECT * FROM grants WHERE id = ?", [key.grantId]))[0];
    if (!g) fail("I2", `a key of unknown grant ${key.grantId} admitted a session`);
    if (this.w.clock.now() >= Number(g.expires_at)) fail("I3", `a session was admitted with the key of grant ${g.id} at or after its expiry`);
    if (g.generation !== key.generation) fail("I4", `the key of grant ${g.id} is installed for generation ${key.generation}, not ${g.generation}`);
  }

  /** I7: claims are issued only while ready capacity (with claims under way) is below minReady. */
  async afterFill(): Promise<void> {
    const now = this.w.clock.now();
    const claims = await this.#q<{ id: string; pool: string; state: string; expires_at: number }>("SELECT id, pool, state, expires_at FROM claims");
    const pools = await this.#q<{ name: string; min_ready: number }>("SELECT name, min_ready FROM pools");
    for (const p of pools) {
      const fresh = claims.filter((c) => c.pool === p.name && !this.#claimsSeen.has(c.id));
      if (fresh.length === 0) continue;
      const open = claims.filter((c) => c.pool === p.name && c.state === "open" && Number(c.expires_at) > now).length;
      const ready = (await this.#q<{ n: number }>("SELECT COUNT(*) AS n FROM machines WHERE pool = ? AND state = 'ready'", [p.name]))[0]!.n;
      if (Number(ready) + open > p.min_ready) fail("I7", `pool ${p.name}: ${fresh.length} claims issued although ready ${ready} + open claims ${open} exceed minReady ${p.min_ready}`);
    }
    for (const c of claims) this.#claimsSeen.add(c.id);
  }

  /** I2/I6: once the reconciler has looked, nothing past its deadline is still live. */
  async afterTick(): Promise<void> {
    const now = this.w.clock.now();
    for (const g of await this.#q<GrantDb>("SELECT * FROM grants WHERE state IN ('pending','installing','active')")) {
      if (now >= Number(g.expires_at)) fail("I2", `grant ${g.id} is still ${g.state} after a tick at or past its expiry (+${now - Number(g.expires_at)}ms)`);
      if (g.state === "active" && now >= Number(g.heartbeat_deadline)) fail("I6", `grant ${g.id} is still active after a tick past its heartbeat deadline`);
      if (g.state === "pending" && now >= Number(g.ack_deadline)) fail("I6", `grant ${g.id} is still pending after a tick past its ack deadline`);
    }
    for (const b of await this.#q<BorrowDb>("SELECT * FROM borrows WHERE state = 'active'")) {
      if (now >= Number(b.expires_at) || now >= Number(b.heartbeat_deadline)) fail("I6", `keeper borrow ${b.id} is still active after a tick past its deadline`);
    }
  }

  async afterStep(): Promise<void> {
    const w = this.w;
    const now = w.clock.now();
    const machines = await this.#q<MachineRow>("SELECT * FROM machines");
    const grants = await this.#q<GrantDb>("SELECT * FROM grants");
    const borrows = await this.#q<BorrowDb>("SELECT * FROM borrows");
    const byId = new Map(machines.map((m) => [m.id, m]));

    // I1: at most one non-closed grant (or live keeper borrow) per machine.
    const holders = new Map<string, string[]>();
    for (const g of grants) if (g.state !== "closed") holders.set(g.machine_id, [...(holders.get(g.machine_id) ?? []), g.id]);
    for (const b of borrows) if (b.state === "active") holders.set(b.machine_id, [...(holders.get(b.machine_id) ?? []), b.id]);
    for (const [m, hs] of holders) if (hs.length > 1) fail("I1", `machine ${m} has ${hs.length} open grants/borrows: ${hs.join(", ")}`);

    for (const m of machines) {
      const gen = Number(m.generation);
      // I6: a machine that was quarantined or drained never comes back.
      if (GONE.has(m.state)) this.#machineGone.add(m.id);
      else if (this.#machineGone.has(m.id)) fail("I6", `machine ${m.id} came back to ${m.state} after quarantine/drain`);
      if (m.provider !== "hosts") continue;
      if (m.state === "ready") {
        // I1: a ready machine has no installed borrow key and no live borrower session.
        const keys = w.provider.liveGrantKeys(m.resource_id);
        if (keys.length > 0) fail("I1", `ready machine ${m.id} still has grant keys installed (${keys.map((k) => `${k.grantId}@${k.generation}`).join(", ")})`);
        const sessions = w.provider.liveSessions(m.resource_id);
        if (sessions.length > 0) fail("I1", `ready machine ${m.id} still has ${sessions.length} live borrower sessions`);
        // I5: returned to ready only after key removal (portable) and fence are proven, then scrub.
        if (gen >= 1) {
          const fence = w.provider.lastEffect(m.resource_id, "fence", gen);
          const scrub = w.provider.lastEffect(m.resource_id, "scrub", gen);
          if (!fence) fail("I5", `machine ${m.id} is ready at generation ${gen} without a proven fence`);
          if (fence.bootAfter === fence.bootBefore) fail("I5", `machine ${m.id} is ready at generation ${gen} although its fence was reported without a boot change (still boot ${fence.bootBefore})`);
          if (!scrub || scrub.seq < fence.seq) fail("I5", `machine ${m.id} is ready at generation ${gen} without a scrub after its fence`);
          if (m.access === "portable") {
            const removed = w.provider.lastEffect(m.resource_id, "remove_key", gen);
            if (!removed || removed.seq > fence.seq) fail("I5", `machine ${m.id} is ready at generation ${gen} without its key removal proven before the fence`);
          }
        }
      }
    }

    // I4: a lost reply never causes a blind second install.
    for (const [k, ops] of w.provider.installs) if (ops.size > 1) fail("I4", `two different install operations acted on ${k}`);

    for (const g of grants) {
      const m = byId.get(g.machine_id);
      // I10: grants only on portable machines.
      if (m && m.access !== "portable") fail("I10", `grant ${g.id} is on ${m.access} machine ${m.id}`);
      // I3: expiresAt never moves.
      const fixed = this.#expires.get(g.id);
      if (fixed !== undefined && fixed !== Number(g.expires_at)) fail("I3", `grant ${g.id}'s expiry moved by ${Number(g.expires_at) - fixed}ms`);
      // I6: a grant's state only moves forward.
      const rank = GRANT_RANK[g.state] ?? -1;
      const before = this.#grantRank.get(g.id) ?? -1;
      if (rank < before) fail("I6", `grant ${g.id} went back to ${g.state}`);
      this.#grantRank.set(g.id, rank);
      if (g.state === "active") {
        // I2/I4: active only after a confirmed install of exactly its generation, before its expiry.
        if (!m || m.state !== "busy" || Number(m.generation) !== Number(g.generation)) fail("I2", `grant ${g.id} is active while its machine is ${m?.state}@${m?.generation} (grant generation ${g.generation})`);
        if (g.activated_at === null || Number(g.activated_at) >= Number(g.expires_at)) fail("I2", `grant ${g.id} was activated at or after its expiry`);
        const ops = await this.#q<{ id: string; state: string }>("SELECT id, state FROM operations WHERE kind = 'install_key' AND machine_id = ? AND generation = ?", [g.machine_id, g.generation]);
        const confirmed = ops.some((o) => o.state === "done" && w.provider.done.has(o.id) && w.provider.log.some((e) => e.opId === o.id));
        if (!confirmed) fail("I2", `grant ${g.id} is active without a provider-confirmed install at generation ${g.generation}`);
        const key = w.provider.machines.get(m.resource_id)?.keys.get(g.fingerprint);
        if (now < Number(g.expires_at) && (!key || key.generation !== Number(g.generation))) fail("I4", `grant ${g.id} is active but its key is not installed at generation ${g.generation}`);
      }
    }

    for (const b of borrows) {
      const m = byId.get(b.machine_id);
      if (m && m.access !== "keeper") fail("I10", `keeper borrow ${b.id} is on ${m.access} machine ${m.id}`);
      if (b.state !== "active") this.#borrowEnded.add(b.id);
      else if (this.#borrowEnded.has(b.id)) fail("I6", `keeper borrow ${b.id} became active again`);
    }

    // I7: capacity never grows past maxReady; every live registered machine consumed exactly its claim.
    const pools = await this.#q<{ name: string; max_ready: number }>("SELECT name, max_ready FROM pools");
    const claims = await this.#q<{ id: string; pool: string; state: string; expires_at: number; machine_id: string | null }>("SELECT * FROM claims");
    for (const p of pools) {
      const ms = machines.filter((m) => m.pool === p.name);
      const held = ms.filter((m) => m.state === "ready" || LENT.has(m.state) || CLEANUP.has(m.state)).length;
      const open = claims.filter((c) => c.pool === p.name && c.state === "open" && Number(c.expires_at) > now).length;
      const total = held + open;
      const prev = this.#total.get(p.name) ?? 0;
      if (total > Math.max(Number(p.max_ready), prev)) fail("I7", `pool ${p.name}: ready+lent+cleanup+claims = ${total} grew above maxReady ${p.max_ready}`);
      this.#total.set(p.name, total);
    }
    const claimById = new Map(claims.map((c) => [c.id, c]));
    for (const m of machines) {
      if (m.state === "provisioning" || GONE.has(m.state) || !m.claim_id) continue;
      const c = claimById.get(m.claim_id);
      if (!c || c.state !== "consumed") fail("I7", `machine ${m.id} is ${m.state} but its claim ${m.claim_id} is ${c?.state ?? "missing"}`);
    }

    // I8: no raw secret in any stored record.
    const dump = await this.dump();
    for (const s of w.secrets) if (dump.includes(s)) fail("I8", `a raw token (${s.slice(0, 4)}…) is stored in the database`);
  }

  async dump(): Promise<string> {
    const parts: string[] = [];
    for (const t of TABLES) parts.push(JSON.stringify(await this.#q(`SELECT * FROM ${t}`)));
    return parts.join("\n");
  }

  /** I9: after the settle phase every obligation has finished from its durable record. */
  async settled(): Promise<void> {
    const w = this.w;
    const open = await this.#q<{ id: string; kind: string; state: string }>("SELECT id, kind, state FROM operations WHERE state IN ('pending','running')");
    if (open.length > 0) fail("I9", `operations still unfinished after settling: ${open.map((o) => `${o.kind}:${o.state}`).join(", ")}`);
    const machines = await this.#q<MachineRow>("SELECT * FROM machines");
    for (const m of machines) {
      const fine = m.state === "ready" || m.state === "destroyed" || (m.provider === "external" && (m.state === "draining" || m.state === "quarantined"));
      if (!fine) fail("I9", `machine ${m.id} (${m.provider}) is stuck in ${m.state} after settling`);
    }
    const live = await this.#q<{ id: string; state: string }>("SELECT id, state FROM grants WHERE state <> 'closed'");
    if (live.length > 0) fail("I9", `grants not closed after settling: ${live.map((g) => `${g.id}:${g.state}`).join(", ")}`);
    const active = await this.#q<{ id: string }>("SELECT id FROM borrows WHERE state = 'active'");
    if (active.length > 0) fail("I9", `keeper borrows still active after settling`);
    // No leaked machine: whatever exists at the provider is a live record; whatever the store says is gone is gone.
    const byResource = new Map(machines.filter((m) => m.provider === "hosts").map((m) => [m.resource_id, m]));
    for (const [res, sim] of w.provider.machines) {
      if (!sim.exists) continue;
      const m = byResource.get(res);
      if (!m || m.state === "destroyed") fail("I9", `machine ${res} still exists at the provider but its record is ${m ? "destroyed" : "gone"} (leaked)`);
    }
    for (const m of byResource.values()) {
      if (m.state === "ready" && !w.provider.machines.get(m.resource_id)?.exists) fail("I9", `ready machine ${m.id} does not exist at the provider`);
    }
  }
}
