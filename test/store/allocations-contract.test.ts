/**
 * Allocations against a real store, on SQLite (a file) and PostgreSQL (a
 * fresh schema; skipped with the reason when BERTH_TEST_PG_URL is unset):
 * admission, idempotent create, placement refusals, release, expiry, bad
 * ids, and the concurrent run with its audit replay of the ledger.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import type { Store } from "../../src/store/store.js";
import { createToken } from "../../src/coordinator/auth.js";
import { createAllocation, type CreateInput } from "../../src/coordinator/actions/allocation-create.js";
import type { AllocCtx } from "../../src/coordinator/actions/allocation-context.js";
import { releaseAllocation, onAllocationExpiryDue, resolveAllocation } from "../../src/coordinator/actions/allocation-release.js";
import { accountEnrolledHost, changeHostStanding, setOwnerBudget } from "../../src/coordinator/actions/allocation-owners.js";
import { insertHost } from "../../src/store/hosts.js";
import { getOwner } from "../../src/store/allocation-owners.js";
import { listHostAccounts } from "../../src/store/host-accounts.js";
import { ackStanding } from "../../src/store/host-standing.js";
import { casAllocationState } from "../../src/store/allocations.js";
import { planAllocation, showAllocation } from "../../src/coordinator/actions/allocation-read.js";
import { readLedger, type LedgerEntry } from "../../src/store/allocation-ledger.js";
import { DEFAULT_SIZES } from "../../src/core/allocation-sizes.js";
import { isBerthError } from "../../src/core/errors.js";
import { applyTakeover } from "../../src/coordinator/actions/allocation-takeover.js";
import { getActor } from "../../src/store/allocation-actors.js";
import { takeoverDecision } from "../../src/core/allocation-takeover.js";
import { PG_SKIP, dropSchema, openStore, tempDir, TestClock, type Engine } from "../helpers/env.js";

const ORG = "acme";
const SIZES = [...DEFAULT_SIZES, { name: "tiny", vcpu: 1, memoryMib: 2048, diskMib: 10240 }];

interface World {
  store: Store;
  clock: TestClock;
  ctx: AllocCtx;
  owner(budget?: { vcpu: number; memoryMib: number; diskMib?: number; count: number }): Promise<string>;
  host(name: string, cap?: { vcpu: number; memoryMib: number; diskMib?: number; slots: number }): Promise<string>;
  counts(): Promise<{ allocations: number; ledger: number }>;
  close(): Promise<void>;
}

async function world(engine: Engine, actor = "c-test"): Promise<World> {
  const dir = tempDir();
  const store = await openStore(engine, dir.path);
  const clock = new TestClock();
  const ctx: AllocCtx = { store, now: clock.now, actor, config: { allocationSizes: SIZES, maxAllocationMs: 8 * 3_600_000 } };
  return {
    store,
    clock,
    ctx,
    async owner(budget = { vcpu: 8, memoryMib: 8192, count: 4 }) {
      const t = await createToken(store, { org: ORG, role: "member", expiresAt: null, label: null }, clock.now(), (n) => randomBytes(n));
      await setOwnerBudget(ctx, ORG, t.id, budget, false);
      return t.id;
    },
    async host(name, cap = { vcpu: 8, memoryMib: 16384, slots: 4 }) {
      const id = `h_${name}`;
      await store.transaction((tx) => accountEnrolledHost(tx, actor, { id, org: ORG, name, ...cap }, clock.now()));
      return id;
    },
    async counts() {
      return store.transaction(async (tx) => ({
        allocations: Number((await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM allocations"))!.n),
        ledger: Number((await tx.get<{ n: number }>("SELECT COUNT(*) AS n FROM allocation_ledger"))!.n),
      }));
    },
    async close() {
      await dropSchema(store);
      await store.close();
      dir.cleanup();
    },
  };
}

const req = (id: string, size = "small", extra: Partial<CreateInput> = {}): CreateInput => ({ id, size, durationMs: null, strategy: "binpack", ...extra });

async function refusal(p: Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await p;
  } catch (e) {
    if (isBerthError(e)) return { code: e.code, message: e.message };
    throw e;
  }
  throw new Error("expected a refusal");
}

/**
 * Replays the ledger in sequence order and checks: no owner over its budget
 * and no host over capacity in any dimension after any reservation; no
 * reservation on a host after its withdrawal; each id reserved once, and
 * refunded at most once, after its reservation. Returns the final usage.
 */
function replay(ledger: LedgerEntry[]): { owners: Map<string, { vcpu: number; mem: number; count: number }>; hosts: Map<string, { vcpu: number; mem: number; slots: number }> } {
  const budgets = new Map<string, { vcpu: number; mem: number; count: number }>();
  const owners = new Map<string, { vcpu: number; mem: number; count: number }>();
  const caps = new Map<string, { vcpu: number; mem: number; slots: number; standing: string }>();
  const hosts = new Map<string, { vcpu: number; mem: number; slots: number }>();
  const reserved = new Set<string>();
  const refunded = new Set<string>();
  for (const e of ledger) {
    switch (e.event) {
      case "budget":
        budgets.set(e.owner!, { vcpu: e.vcpu, mem: e.memory_mib, count: Number(e.detail) });
        if (!owners.has(e.owner!)) owners.set(e.owner!, { vcpu: 0, mem: 0, count: 0 });
        break;
      case "host_account": {
        const prev = caps.get(e.host_id!);
        const [standing, slots] = e.detail!.split(" ");
        caps.set(e.host_id!, { vcpu: e.vcpu, mem: e.memory_mib, slots: slots ? Number(slots.slice(6)) : prev!.slots, standing: standing! });
        if (!hosts.has(e.host_id!)) hosts.set(e.host_id!, { vcpu: 0, mem: 0, slots: 0 });
        break;
      }
      case "reserve": {
        assert.ok(!reserved.has(e.allocation_id!), `allocation ${e.allocation_id} reserved twice`);
        reserved.add(e.allocation_id!);
        const o = owners.get(e.owner!)!;
        const b = budgets.get(e.owner!)!;
        o.vcpu += e.vcpu;
        o.mem += e.memory_mib;
        o.count += 1;
        assert.ok(o.vcpu <= b.vcpu && o.mem <= b.mem && o.count <= b.count, `owner ${e.owner} over budget at seq ${e.seq}: ${JSON.stringify(o)} > ${JSON.stringify(b)}`);
        const h = hosts.get(e.host_id!)!;
        const c = caps.get(e.host_id!)!;
        assert.equal(c.standing, "ready", `reservation at seq ${e.seq} on host ${e.host_id} while it was ${c.standing}`);
        h.vcpu += e.vcpu;
        h.mem += e.memory_mib;
        h.slots += 1;
        assert.ok(h.vcpu <= c.vcpu && h.mem <= c.mem && h.slots <= c.slots, `host ${e.host_id} over capacity at seq ${e.seq}: ${JSON.stringify(h)}`);
        break;
      }
      case "refund": {
        assert.ok(reserved.has(e.allocation_id!), `refund of ${e.allocation_id} before its reservation`);
        assert.ok(!refunded.has(e.allocation_id!), `allocation ${e.allocation_id} refunded twice`);
        refunded.add(e.allocation_id!);
        const o = owners.get(e.owner!)!;
        o.vcpu -= e.vcpu;
        o.mem -= e.memory_mib;
        o.count -= 1;
        const h = hosts.get(e.host_id!)!;
        h.vcpu -= e.vcpu;
        h.mem -= e.memory_mib;
        h.slots -= 1;
        break;
      }
      default:
        throw new Error(`unknown ledger event ${String(e.event)}`);
    }
  }
  return { owners, hosts };
}

for (const engine of ["sqlite", "postgres"] as Engine[]) {
  describe(`allocations on ${engine}`, { skip: engine === "postgres" ? PG_SKIP : false }, () => {
    test("create reserves budget and a host slot with an immutable plan; the same id and request returns it again without charging", async () => {
      const w = await world(engine);
      try {
        const owner = await w.owner();
        const h = await w.host("one");
        const a = await createAllocation(w.ctx, ORG, owner, req("dev-1", "small", { durationMs: 3_600_000 }));
        assert.equal(a.created, true);
        assert.equal(a.allocation.state, "placed");
        assert.equal(a.allocation.hostId, h);
        assert.deepEqual(a.allocation.plan, { hostId: h, hostName: "one", strategy: "binpack", size: "small", vcpu: 2, memoryMib: 4096, diskMib: 20480, placedAt: w.clock.now() });
        assert.equal(a.allocation.expiresAt, w.clock.now() + 3_600_000);
        w.clock.advance(1000);
        const again = await createAllocation(w.ctx, ORG, owner, req("dev-1", "small", { durationMs: 3_600_000 }));
        assert.equal(again.created, false);
        assert.deepEqual(again.allocation, a.allocation);
        const rows = await w.store.transaction(async (tx) => ({
          owner: await tx.get<{ used_vcpu: number; used_memory_mib: number; used_count: number }>("SELECT used_vcpu, used_memory_mib, used_count FROM alloc_owners WHERE owner = ?", [owner]),
          host: await tx.get<{ used_vcpu: number; used_memory_mib: number; used_slots: number }>("SELECT used_vcpu, used_memory_mib, used_slots FROM host_accounts WHERE host_id = ?", [h]),
          due: await tx.get<{ due_at: number }>("SELECT due_at FROM due WHERE kind = 'alloc_expiry' AND ref = 'dev-1'"),
        }));
        assert.deepEqual({ ...rows.owner }, { used_vcpu: 2, used_memory_mib: 4096, used_count: 1 });
        assert.deepEqual({ ...rows.host }, { used_vcpu: 2, used_memory_mib: 4096, used_slots: 1 });
        assert.equal(Number(rows.due!.due_at), a.allocation.expiresAt);
      } finally {
        await w.close();
      }
    });

    test("the same id with another request is conflict, and writes nothing; another owner's id is conflict too", async () => {
      const w = await world(engine);
      try {
        const owner = await w.owner();
        const other = await w.owner();
        await w.host("one");
        await createAllocation(w.ctx, ORG, owner, req("dev-1"));
        const before = await w.counts();
        for (const [who, r] of [[owner, req("dev-1", "large")], [owner, req("dev-1", "small", { durationMs: 60_000 })], [owner, req("dev-1", "small", { strategy: "spread" })], [other, req("dev-1")]] as const) {
          const e = await refusal(createAllocation(w.ctx, ORG, who, r));
          assert.equal(e.code, "conflict");
          assert.match(e.message, /allocation id dev-1 is already taken by a different request/);
        }
        assert.deepEqual(await w.counts(), before);
      } finally {
        await w.close();
      }
    });

    test("budget refusals name the exhausted dimension with the figures", async () => {
      const w = await world(engine);
      try {
        const owner = await w.owner({ vcpu: 8, memoryMib: 8192, count: 4 });
        await w.host("one");
        await createAllocation(w.ctx, ORG, owner, req("a", "tiny"));
        await createAllocation(w.ctx, ORG, owner, req("b", "small"));
        const before = await w.counts();
        assert.deepEqual(await refusal(createAllocation(w.ctx, ORG, owner, req("c", "small"))), { code: "budget_exhausted", message: "budget_exhausted: memory 6/8 GiB used, small needs 4" });
        const lean = await w.owner({ vcpu: 2, memoryMib: 65536, count: 9 });
        await createAllocation(w.ctx, ORG, lean, req("d", "small"));
        assert.equal((await refusal(createAllocation(w.ctx, ORG, lean, req("e", "tiny")))).message, "budget_exhausted: vcpu 2/2 used, tiny needs 1");
        const few = await w.owner({ vcpu: 64, memoryMib: 65536, count: 1 });
        await createAllocation(w.ctx, ORG, few, req("f", "tiny"));
        assert.equal((await refusal(createAllocation(w.ctx, ORG, few, req("g", "tiny")))).message, "budget_exhausted: allocations 1/1 live, tiny needs 1");
        assert.equal((await w.counts()).allocations, before.allocations + 2);
      } finally {
        await w.close();
      }
    });

    test("disk: the budget refusal names disk and writes nothing; a host without the disk free is not chosen; both charged and counted exactly", async () => {
      const w = await world(engine);
      try {
        const owner = await w.owner({ vcpu: 64, memoryMib: 65536, diskMib: 30 * 1024, count: 9 });
        const h = await w.host("one", { vcpu: 64, memoryMib: 65536, diskMib: 45 * 1024, slots: 9 });
        await createAllocation(w.ctx, ORG, owner, req("a", "small"));
        await createAllocation(w.ctx, ORG, owner, req("b", "tiny"));
        const before = await w.counts();
        const used = (await w.store.transaction((tx) => getOwner(tx, ORG, owner)))!.used;
        assert.deepEqual(await refusal(createAllocation(w.ctx, ORG, owner, req("c", "small"))), { code: "budget_exhausted", message: "budget_exhausted: disk 30/30 GiB used, small needs 20" });
        assert.deepEqual(await w.counts(), before, "nothing half-created: no allocation, no ledger entry");
        assert.deepEqual((await w.store.transaction((tx) => getOwner(tx, ORG, owner)))!.used, used);
        assert.deepEqual(used, { vcpu: 3, memoryMib: 6144, diskMib: 30 * 1024, count: 2 });
        // The host has 15 GiB of disk left: another owner's small does not fit there, and the refusal says why.
        const rich = await w.owner({ vcpu: 64, memoryMib: 65536, diskMib: 1024 * 1024, count: 9 });
        const noRoom = await refusal(createAllocation(w.ctx, ORG, rich, req("d", "small")));
        assert.equal(noRoom.code, "no_capacity");
        assert.match(noRoom.message, /one: disk: 15\/45 GiB free, small needs 20/);
        const acct = (await w.store.transaction((tx) => listHostAccounts(tx, ORG))).find((x) => x.hostId === h)!;
        assert.deepEqual([acct.capacity.diskMib, acct.used.diskMib], [45 * 1024, 30 * 1024]);
        const ledger = await w.store.transaction((tx) => readLedger(tx, ORG));
        assert.deepEqual(ledger.filter((e) => e.event === "reserve").map((e) => [e.allocation_id, Number(e.disk_mib)]), [["a", 20480], ["b", 10240]]);
      } finally {
        await w.close();
      }
    });

    test("not admitted, unknown size, duration past policy, zero or negative budget: refused with nothing written", async () => {
      const w = await world(engine);
      try {
        await w.host("one");
        const t = await createToken(w.store, { org: ORG, role: "member", expiresAt: null, label: null }, w.clock.now(), (n) => randomBytes(n));
        const before = await w.counts();
        assert.equal((await refusal(createAllocation(w.ctx, ORG, t.id, req("x")))).code, "not_admitted");
        const owner = await w.owner();
        const mid = await w.counts();
        const unknown = await refusal(createAllocation(w.ctx, ORG, owner, req("x", "huge")));
        assert.equal(unknown.code, "invalid_request");
        assert.match(unknown.message, /unknown size "huge"; known sizes: small, large, tiny/);
        const long = await refusal(createAllocation(w.ctx, ORG, owner, req("x", "small", { durationMs: 9 * 3_600_000 })));
        assert.equal(long.message, "invalid_request: requested duration 9h is past the policy maximum of 8h; ask for at most 8h");
        for (const b of [{ vcpu: 0, memoryMib: 1024, count: 1 }, { vcpu: 1, memoryMib: -1, count: 1 }, { vcpu: 1, memoryMib: 1024, count: 0 }]) {
          const e = await refusal(setOwnerBudget(w.ctx, ORG, t.id, b, false));
          assert.equal(e.code, "invalid_request");
        }
        assert.equal((await refusal(setOwnerBudget(w.ctx, ORG, "tok_nobody", { vcpu: 1, memoryMib: 1024, count: 1 }, false))).code, "not_found");
        assert.equal((await refusal(setOwnerBudget(w.ctx, ORG, t.id, { vcpu: 1, memoryMib: 1024, count: 1 }, true))).code, "not_admitted");
        assert.equal(before.allocations, 0);
        assert.deepEqual(await w.counts(), mid);
      } finally {
        await w.close();
      }
    });

    test("ids a route cannot address are refused before anything is read or written", async () => {
      const w = await world(engine);
      try {
        const owner = await w.owner();
        await w.host("one");
        const before = await w.counts();
        for (const bad of ["a/b", "a?b", "a b", "é", "x".repeat(129), "..", "", "a.b", "%2F"]) {
          const e = await refusal(createAllocation(w.ctx, ORG, owner, req(bad)));
          assert.equal(e.code, "invalid_id", bad);
        }
        assert.deepEqual(await w.counts(), before);
        assert.equal((await createAllocation(w.ctx, ORG, owner, req("x".repeat(128)))).created, true, "128 characters is the limit, inclusive");
      } finally {
        await w.close();
      }
    });

    test("placement never chooses a draining, withdrawn, not-ready or identity-switching host; the refusal names every host's reason", async () => {
      const w = await world(engine);
      try {
        const owner = await w.owner({ vcpu: 64, memoryMib: 65536, count: 20 });
        const a = await w.host("a");
        const b = await w.host("b");
        const c = await w.host("c", { vcpu: 1, memoryMib: 65536, slots: 9 });
        await changeHostStanding(w.ctx, ORG, a, "withdrawn");
        await changeHostStanding(w.ctx, ORG, b, "draining");
        const e = await refusal(createAllocation(w.ctx, ORG, owner, req("x")));
        assert.equal(e.code, "no_capacity");
        assert.equal(e.message, "no_capacity: no host has room for small (a: host is withdrawn; b: host is draining; c: vcpu: 1/1 free, small needs 2); see berth alloc plan --size small");
        await changeHostStanding(w.ctx, ORG, b, "not_ready");
        const plan = await planAllocation(w.ctx, { org: ORG, principal: owner, operator: false }, "small", "binpack");
        assert.equal(plan.decision.chosen, null);
        assert.deepEqual(plan.decision.verdicts.map((v) => (v.fits ? "fits" : v.reason)), ["host is withdrawn", "host is not ready", "vcpu: 1/1 free, small needs 2"]);
        assert.deepEqual(plan.budget, { admitted: true, fits: true, message: null });
        await changeHostStanding(w.ctx, ORG, b, "ready");
        // A host in the middle of its identity switch reads as not ready and is never chosen.
        await w.store.transaction((tx) =>
          insertHost(tx, b, ORG, "b", { url: "http://127.0.0.1:9", runtime: "process", capacity: { vcpu: 8, memoryMib: 16384, slots: 4 }, ssh: { host: "127.0.0.1", port: 9, hostKey: "k", fingerprint: "f" } }, w.clock.now()),
        );
        await w.store.transaction((tx) => tx.run("UPDATE hosts SET identity_state = 'prepared' WHERE id = ?", [b]));
        assert.equal((await refusal(createAllocation(w.ctx, ORG, owner, req("x")))).code, "no_capacity");
        const switching = await planAllocation(w.ctx, { org: ORG, principal: owner, operator: false }, "small", "binpack");
        assert.deepEqual(switching.decision.verdicts.map((v) => (v.fits ? "fits" : v.reason)), ["host is withdrawn", "host is not ready", "vcpu: 1/1 free, small needs 2"]);
        await w.store.transaction((tx) => tx.run("UPDATE hosts SET identity_state = 'active' WHERE id = ?", [b]));
        const ok = await createAllocation(w.ctx, ORG, owner, req("x"));
        assert.equal(ok.allocation.hostId, b);
        assert.equal(c.length > 0, true);
      } finally {
        await w.close();
      }
    });

    // model/allocation.pml ARM_HOSTGONE, MUTANT_GONE_UNATTESTED: before gone_epoch, an acknowledged withdrawal was enough.
    test("resolve --host-gone needs the operator's attestation under the host's current standing epoch, not an acknowledged withdrawal", async () => {
      const w = await world(engine);
      try {
        const owner = await w.owner();
        const h = await w.host("g");
        const operator = { org: ORG, principal: "op", operator: true };
        const idle = await w.store.transaction(async (tx) => (await getOwner(tx, ORG, owner))!.used);
        /** An allocation whose cleanup is under way on h (launched, then released). */
        const releasing = async (id: string) => {
          await createAllocation(w.ctx, ORG, owner, req(id));
          await w.store.transaction((tx) => casAllocationState(tx, id, "placed", "launching", w.clock.now(), null));
          assert.equal((await releaseAllocation(w.ctx, { org: ORG, principal: owner, operator: false }, id, false)).state, "releasing");
        };
        await releasing("x");
        const charged = await w.store.transaction(async (tx) => (await getOwner(tx, ORG, owner))!.used);
        const { epoch } = await changeHostStanding(w.ctx, ORG, h, "withdrawn");
        await w.store.transaction((tx) => ackStanding(tx, h, epoch)); // what the live agent's acknowledgment records
        const e = await refusal(resolveAllocation(w.ctx, operator, "x", "host_gone"));
        assert.equal(e.code, "conflict");
        assert.match(e.message, /host g is withdrawn \(acknowledged by its agent\) but not attested gone/);
        assert.deepEqual(await w.store.transaction(async (tx) => (await getOwner(tx, ORG, owner))!.used), charged, "nothing returned");

        await changeHostStanding(w.ctx, ORG, h, "withdrawn", "tok_op");
        assert.equal((await resolveAllocation(w.ctx, operator, "x", "host_gone")).state, "released");
        assert.deepEqual(await w.store.transaction(async (tx) => (await getOwner(tx, ORG, owner))!.used), idle, "returned once, on the attestation");

        // An attestation of an earlier epoch does not carry over: the host made ready, then withdrawn again.
        await changeHostStanding(w.ctx, ORG, h, "ready");
        await releasing("y");
        const again = await changeHostStanding(w.ctx, ORG, h, "withdrawn");
        await w.store.transaction((tx) => ackStanding(tx, h, again.epoch));
        assert.equal((await refusal(resolveAllocation(w.ctx, operator, "y", "host_gone"))).code, "conflict");
        assert.equal((await showAllocation(w.ctx, operator, "y")).state, "releasing");
      } finally {
        await w.close();
      }
    });

    test("release of a never-launched allocation returns slot and budget once; again is a no-op; others' allocations are refused", async () => {
      const w = await world(engine);
      try {
        const owner = await w.owner({ vcpu: 2, memoryMib: 4096, count: 1 });
        const other = await w.owner();
        const h = await w.host("one", { vcpu: 2, memoryMib: 4096, slots: 1 });
        await createAllocation(w.ctx, ORG, owner, req("mine"));
        assert.equal((await refusal(releaseAllocation(w.ctx, { org: ORG, principal: other, operator: false }, "mine", false))).code, "forbidden");
        assert.equal((await refusal(releaseAllocation(w.ctx, { org: "other-org", principal: owner, operator: true }, "mine", false))).code, "not_found");
        assert.equal((await refusal(showAllocation(w.ctx, { org: ORG, principal: other, operator: false }, "mine"))).code, "not_found");
        const r = await releaseAllocation(w.ctx, { org: ORG, principal: owner, operator: false }, "mine", false);
        assert.equal(r.state, "released");
        const again = await releaseAllocation(w.ctx, { org: ORG, principal: owner, operator: false }, "mine", false);
        assert.equal(again.state, "released");
        const ledger = await w.store.transaction((tx) => readLedger(tx, ORG));
        assert.equal(ledger.filter((e) => e.event === "refund").length, 1);
        // Budget and slot are back: the same owner can allocate again on the same one-slot host.
        const next = await createAllocation(w.ctx, ORG, owner, req("mine-2"));
        assert.equal(next.allocation.hostId, h);
        // Released allocations keep their id: a retry of the old create still answers the old allocation.
        const old = await createAllocation(w.ctx, ORG, owner, req("mine"));
        assert.equal(old.created, false);
        assert.equal(old.allocation.state, "released");
      } finally {
        await w.close();
      }
    });

    test("expiry: re-armed before, released at equality with the reservation returned", async () => {
      const w = await world(engine);
      try {
        const owner = await w.owner();
        await w.host("one");
        const a = await createAllocation(w.ctx, ORG, owner, req("e1", "small", { durationMs: 60_000 }));
        w.clock.advance(59_999);
        await w.store.transaction((tx) => onAllocationExpiryDue(tx, w.ctx, "e1", w.clock.now()));
        assert.equal((await showAllocation(w.ctx, { org: ORG, principal: owner, operator: false }, "e1")).state, "placed");
        w.clock.advance(1);
        assert.equal(w.clock.now(), a.allocation.expiresAt);
        await w.store.transaction((tx) => onAllocationExpiryDue(tx, w.ctx, "e1", w.clock.now()));
        const after = await showAllocation(w.ctx, { org: ORG, principal: owner, operator: false }, "e1");
        assert.equal(after.state, "released");
        assert.match(after.reason ?? "", /expiry/);
        const due = await w.store.transaction((tx) => tx.get("SELECT * FROM due WHERE kind = 'alloc_expiry'"));
        assert.equal(due, undefined);
        replay(await w.store.transaction((tx) => readLedger(tx, ORG)));
      } finally {
        await w.close();
      }
    });

    test("50 concurrent creates from 5 owners on 3 hosts, one withdrawn mid-run, then retries of the same ids with releases: the audit replay holds", async () => {
      const w = await world(engine);
      try {
        const owners: string[] = [];
        for (let i = 0; i < 5; i++) owners.push(await w.owner({ vcpu: 10, memoryMib: 20480, count: 5 }));
        const big = { vcpu: 16, memoryMib: 32768, slots: 8 };
        const hosts = [await w.host("h0", big), await w.host("h1", big), await w.host("h2", big)];
        const withdrawn = hosts[1]!;
        const jobs = Array.from({ length: 50 }, (_, i) => ({ owner: owners[i % 5]!, r: req(`job-${i}`, i % 3 === 0 ? "large" : "small", { strategy: i % 2 ? "spread" : "binpack" }) }));
        type Outcome = { id: string; startedAfterWithdraw: boolean; host: string | null; created: boolean; code: string | null };
        let withdrawnAt = false;
        const run = async (j: (typeof jobs)[number]): Promise<Outcome> => {
          const startedAfterWithdraw = withdrawnAt;
          try {
            const r = await createAllocation(w.ctx, ORG, j.owner, j.r);
            return { id: j.r.id, startedAfterWithdraw, host: r.allocation.hostId, created: r.created, code: null };
          } catch (e) {
            if (!isBerthError(e)) throw e;
            return { id: j.r.id, startedAfterWithdraw, host: null, created: false, code: e.code };
          }
        };
        const first = jobs.slice(0, 20).map(run);
        await Promise.all(first.slice(0, 5));
        await changeHostStanding(w.ctx, ORG, withdrawn, "withdrawn");
        withdrawnAt = true;
        const round1 = await Promise.all([...first, ...jobs.slice(20).map(run)]);
        // Round 2: every id again (same requests), with some releases racing them.
        const created1 = round1.filter((o) => o.host !== null);
        const releases = created1.slice(0, 6).map((o) => releaseAllocation(w.ctx, { org: ORG, principal: jobs.find((j) => j.r.id === o.id)!.owner, operator: false }, o.id, false));
        const round2 = await Promise.all([...jobs.map((j) => run(j)), ...releases.map(async (p) => (await p, null))]);
        const outcomes = [...round1, ...round2.filter((o): o is Outcome => o !== null)];
        for (const o of outcomes) {
          if (o.code) assert.ok(["budget_exhausted", "no_capacity"].includes(o.code), `unexpected refusal ${o.code} for ${o.id}`);
          if (o.startedAfterWithdraw && o.created) assert.notEqual(o.host, withdrawn, `${o.id} placed on the withdrawn host after its withdrawal committed`);
        }
        // A retry of an id created in round 1 answers that same allocation.
        for (const o of round2.filter((x): x is Outcome => x !== null && x.host !== null)) {
          const before = created1.find((c) => c.id === o.id);
          if (before) {
            assert.equal(o.created, false, `${o.id} created twice`);
            assert.equal(o.host, before.host);
          }
        }
        const ledger = await w.store.transaction((tx) => readLedger(tx, ORG));
        const final = replay(ledger);
        const reserves = ledger.filter((e) => e.event === "reserve");
        const refusals = outcomes.filter((o) => o.code !== null);
        // Enough happened to mean something: reservations on every host, the withdrawn one only before, and both kinds of refusal.
        assert.ok(reserves.length >= 12, `only ${reserves.length} reservations`);
        assert.ok(refusals.length > 0, "nothing was refused: the limits were never reached");
        assert.equal(ledger.filter((e) => e.event === "refund").length, 6);
        // The stored counters agree with the replay and with the live rows.
        const stored = await w.store.transaction(async (tx) => ({
          owners: await tx.all<{ owner: string; used_vcpu: number; used_memory_mib: number; used_count: number }>("SELECT owner, used_vcpu, used_memory_mib, used_count FROM alloc_owners"),
          hosts: await tx.all<{ host_id: string; used_vcpu: number; used_memory_mib: number; used_slots: number }>("SELECT host_id, used_vcpu, used_memory_mib, used_slots FROM host_accounts"),
          live: await tx.all<{ owner: string; host_id: string; n: number }>("SELECT owner, host_id, COUNT(*) AS n FROM allocations WHERE state <> 'released' GROUP BY owner, host_id"),
        }));
        for (const o of stored.owners) {
          const r = final.owners.get(o.owner)!;
          assert.deepEqual([o.used_vcpu, o.used_memory_mib, o.used_count], [r.vcpu, r.mem, r.count]);
          assert.equal(stored.live.filter((l) => l.owner === o.owner).reduce((s, l) => s + Number(l.n), 0), o.used_count);
        }
        for (const h of stored.hosts) {
          const r = final.hosts.get(h.host_id)!;
          assert.deepEqual([h.used_vcpu, h.used_memory_mib, h.used_slots], [r.vcpu, r.mem, r.slots]);
        }
        const ids = await w.store.transaction((tx) => tx.all<{ id: string }>("SELECT id FROM allocations"));
        assert.equal(new Set(ids.map((r) => r.id)).size, ids.length);
      } finally {
        await w.close();
      }
    });

    test("takeover: replacements racing on one actor record admit exactly one; the loser sees the winner's record", async () => {
      const w = await world(engine);
      try {
        const first = takeoverDecision("t1", { kind: "none" }, { kind: "absent" }, "wanted");
        assert.deepEqual(await w.store.transaction((tx) => applyTakeover(tx, "t1", first, "c-old", 1)), { kind: "won", generation: 1 });
        const prior = (await w.store.transaction((tx) => getActor(tx, "t1")))!;
        assert.deepEqual(prior, { allocationId: "t1", generation: 1, actor: "c-old", kind: "actor" });
        // c-old died before its hold: two replacements see it terminal and no hold, at the same moment.
        const racers = ["c-a", "c-b", "c-c", "c-d"];
        const outcomes = await Promise.all(
          racers.map((me, i) =>
            w.store.transaction(async (tx) => {
              const d = takeoverDecision("t1", { kind: "recorded", record: prior, liveness: "terminal" }, { kind: "absent" }, i % 2 ? "retired" : "wanted");
              return applyTakeover(tx, "t1", d, me, 2);
            }),
          ),
        );
        assert.equal(outcomes.filter((o) => o.kind === "won").length, 1, JSON.stringify(outcomes));
        assert.equal(outcomes.filter((o) => o.kind === "lost").length, racers.length - 1);
        const now = (await w.store.transaction((tx) => getActor(tx, "t1")))!;
        assert.equal(now.generation, 2);
        assert.ok(racers.includes(now.actor));
        // A late replacement still deciding on the old record loses and writes nothing.
        const late = takeoverDecision("t1", { kind: "recorded", record: prior, liveness: "terminal" }, { kind: "absent" }, "wanted");
        assert.deepEqual(await w.store.transaction((tx) => applyTakeover(tx, "t1", late, "c-late", 3)), { kind: "lost" });
        assert.deepEqual(await w.store.transaction((tx) => getActor(tx, "t1")), now);
        // Two first actors racing (no record yet): one wins.
        const firsts = await Promise.all(["x", "y"].map((me) => w.store.transaction((tx) => applyTakeover(tx, "t2", takeoverDecision("t2", { kind: "none" }, { kind: "absent" }, "wanted"), me, 4))));
        assert.deepEqual(firsts.map((o) => o.kind).sort(), ["lost", "won"]);
      } finally {
        await w.close();
      }
    });

    test("the replay check fails on a ledger that over-books (it can fail)", () => {
      const base = { at: 0, org: ORG, allocation_id: null, owner: null, host_id: null, detail: null, actor: "x", disk_mib: 0 };
      const ledger: LedgerEntry[] = [
        { ...base, seq: 1, event: "budget", owner: "o", vcpu: 2, memory_mib: 4096, detail: "1" },
        { ...base, seq: 2, event: "host_account", host_id: "h", vcpu: 8, memory_mib: 16384, detail: "ready slots=4" },
        { ...base, seq: 3, event: "reserve", allocation_id: "a", owner: "o", host_id: "h", vcpu: 2, memory_mib: 4096 },
        { ...base, seq: 4, event: "reserve", allocation_id: "b", owner: "o", host_id: "h", vcpu: 2, memory_mib: 4096 },
      ];
      assert.throws(() => replay(ledger), /over budget/);
      const afterWithdraw: LedgerEntry[] = [...ledger.slice(0, 2), { ...base, seq: 3, event: "host_account", host_id: "h", vcpu: 8, memory_mib: 16384, detail: "withdrawn" }, ledger[2]!];
      assert.throws(() => replay(afterWithdraw), /while it was withdrawn/);
    });
  });
}
