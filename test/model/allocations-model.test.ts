/**
 * Model-based test of allocations on a real SQLite file: random sequences of
 * creates (random owner, id from a small set so retries and conflicts happen,
 * size, strategy, duration), releases, host standing changes, budget changes
 * and clock advances with expiry. After every step the store must agree with
 * a plain model and keep the invariants:
 *   - each owner's stored usage = the sum of its live allocations;
 *   - each host's stored usage = the sum of its live allocations, within capacity;
 *   - a create placed after a host left `ready` is never on that host;
 *   - a retry of an id with the same request answers the same allocation;
 *   - a refusal changes nothing.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import { randomBytes } from "node:crypto";
import { SqliteStore } from "../../src/store/sqlite/sqlite-store.js";
import { createToken } from "../../src/coordinator/auth.js";
import { createAllocation } from "../../src/coordinator/actions/allocation-create.js";
import type { AllocCtx } from "../../src/coordinator/actions/allocation-context.js";
import { releaseAllocation, onAllocationExpiryDue } from "../../src/coordinator/actions/allocation-release.js";
import { accountEnrolledHost, changeHostStanding, setOwnerBudget } from "../../src/coordinator/actions/allocation-owners.js";
import { DEFAULT_SIZES } from "../../src/core/allocation-sizes.js";
import { isBerthError } from "../../src/core/errors.js";
import { tempDir, TestClock } from "../helpers/env.js";

type Cmd =
  | { kind: "create"; owner: number; id: number; size: "small" | "large"; strategy: "binpack" | "spread"; durationMs: number | null }
  | { kind: "release"; id: number; asOwner: number }
  | { kind: "standing"; host: number; standing: "ready" | "draining" | "withdrawn" | "not_ready" }
  | { kind: "budget"; owner: number; vcpu: number; memGiB: number; count: number }
  | { kind: "advance"; ms: number };

const cmd: fc.Arbitrary<Cmd> = fc.oneof(
  { weight: 6, arbitrary: fc.record({ kind: fc.constant("create" as const), owner: fc.nat(2), id: fc.nat(11), size: fc.constantFrom("small" as const, "large" as const), strategy: fc.constantFrom("binpack" as const, "spread" as const), durationMs: fc.constantFrom(null, 60_000, 600_000) }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant("release" as const), id: fc.nat(11), asOwner: fc.nat(2) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("standing" as const), host: fc.nat(2), standing: fc.constantFrom("ready" as const, "draining" as const, "withdrawn" as const, "not_ready" as const) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("budget" as const), owner: fc.nat(2), vcpu: fc.integer({ min: 1, max: 10 }), memGiB: fc.integer({ min: 1, max: 20 }), count: fc.integer({ min: 1, max: 4 }) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("advance" as const), ms: fc.constantFrom(30_000, 61_000, 700_000) }) },
);

test("allocations model: random command sequences keep the invariants on SQLite", async () => {
  await fc.assert(
    fc.asyncProperty(fc.array(cmd, { minLength: 5, maxLength: 40 }), async (cmds) => {
      const dir = tempDir();
      const store = new SqliteStore({ path: `${dir.path}/berth.db` });
      const clock = new TestClock();
      const ctx: AllocCtx = { store, now: clock.now, actor: "model", config: { allocationSizes: DEFAULT_SIZES, maxAllocationMs: 3_600_000 } };
      try {
        const owners: string[] = [];
        for (let i = 0; i < 3; i++) {
          const t = await createToken(store, { org: "acme", role: "member", expiresAt: null, label: null }, clock.now(), (n) => randomBytes(n));
          await setOwnerBudget(ctx, "acme", t.id, { vcpu: 6, memoryMib: 12288, count: 3 }, false);
          owners.push(t.id);
        }
        const hosts = ["h_0", "h_1", "h_2"];
        for (const [i, h] of hosts.entries()) await store.transaction((tx) => accountEnrolledHost(tx, "model", { id: h, org: "acme", name: `n${i}`, vcpu: 6, memoryMib: 12288, slots: 2 }, clock.now()));
        const notReadySince = new Map<string, boolean>();
        const first = new Map<string, { owner: string; host: string; body: string }>();
        for (const c of cmds) {
          const dump = async () => store.transaction((tx) => tx.all("SELECT * FROM allocations ORDER BY id"));
          switch (c.kind) {
            case "create": {
              const id = `a${c.id}`;
              const body = JSON.stringify([owners[c.owner], c.size, c.strategy, c.durationMs]);
              const before = await dump();
              try {
                const r = await createAllocation(ctx, "acme", owners[c.owner]!, { id, size: c.size, strategy: c.strategy, durationMs: c.durationMs });
                const prev = first.get(id);
                if (prev) {
                  assert.equal(r.created, false, `${id} created twice`);
                  assert.equal(prev.body, body, `${id}: a different request got the old allocation`);
                  assert.equal(r.allocation.hostId, prev.host);
                } else {
                  assert.equal(r.created, true);
                  assert.equal(notReadySince.get(r.allocation.hostId) ?? false, false, `${id} placed on ${r.allocation.hostId}, which is not ready`);
                  first.set(id, { owner: owners[c.owner]!, host: r.allocation.hostId, body });
                }
              } catch (e) {
                if (!isBerthError(e)) throw e;
                assert.ok(["budget_exhausted", "no_capacity", "conflict"].includes(e.code), e.message);
                if (e.code === "conflict") assert.notEqual(first.get(id)?.body, body);
                assert.deepEqual(await dump(), before, "a refusal changed allocations");
              }
              break;
            }
            case "release": {
              const id = `a${c.id}`;
              try {
                await releaseAllocation(ctx, { org: "acme", principal: owners[c.asOwner]!, operator: false }, id, false);
                assert.equal(first.get(id)?.owner, owners[c.asOwner]);
              } catch (e) {
                if (!isBerthError(e)) throw e;
                assert.ok(["not_found", "forbidden"].includes(e.code), e.message);
              }
              break;
            }
            case "standing":
              await changeHostStanding(ctx, "acme", hosts[c.host]!, c.standing);
              notReadySince.set(hosts[c.host]!, c.standing !== "ready");
              break;
            case "budget":
              await setOwnerBudget(ctx, "acme", owners[c.owner]!, { vcpu: c.vcpu, memoryMib: c.memGiB * 1024, count: c.count }, true);
              break;
            case "advance": {
              clock.advance(c.ms);
              const due = await store.transaction((tx) => tx.all<{ ref: string }>("SELECT ref FROM due WHERE kind = 'alloc_expiry' AND due_at <= ?", [clock.now()]));
              for (const d of due) await store.transaction((tx) => onAllocationExpiryDue(tx, ctx, d.ref, clock.now()));
              const overdue = await store.transaction((tx) => tx.all("SELECT id FROM allocations WHERE state <> 'released' AND expires_at <= ?", [clock.now()]));
              assert.deepEqual(overdue, [], "an allocation outlived its expiry");
              break;
            }
          }
          // Invariants after every step.
          const s = await store.transaction(async (tx) => ({
            owners: await tx.all<{ owner: string; used_vcpu: number; used_memory_mib: number; used_count: number }>("SELECT * FROM alloc_owners"),
            hosts: await tx.all<{ host_id: string; vcpu: number; memory_mib: number; slots: number; used_vcpu: number; used_memory_mib: number; used_slots: number }>("SELECT * FROM host_accounts"),
            live: await tx.all<{ owner: string; host_id: string; vcpu: number; memory_mib: number }>("SELECT owner, host_id, vcpu, memory_mib FROM allocations WHERE state <> 'released'"),
          }));
          for (const o of s.owners) {
            const mine = s.live.filter((a) => a.owner === o.owner);
            assert.deepEqual([o.used_vcpu, o.used_memory_mib, o.used_count], [mine.reduce((x, a) => x + a.vcpu, 0), mine.reduce((x, a) => x + a.memory_mib, 0), mine.length]);
          }
          for (const h of s.hosts) {
            const on = s.live.filter((a) => a.host_id === h.host_id);
            assert.deepEqual([h.used_vcpu, h.used_memory_mib, h.used_slots], [on.reduce((x, a) => x + a.vcpu, 0), on.reduce((x, a) => x + a.memory_mib, 0), on.length]);
            assert.ok(h.used_vcpu <= h.vcpu && h.used_memory_mib <= h.memory_mib && h.used_slots <= h.slots, `host ${h.host_id} over capacity`);
          }
        }
      } finally {
        await store.close();
        dir.cleanup();
      }
    }),
    { numRuns: 40 },
  );
});
