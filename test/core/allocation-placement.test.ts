import { test } from "node:test";
import assert from "node:assert/strict";
import { choose, place, noCapacityMessage, type HostAccount, type HostStanding } from "../../src/core/allocation-placement.js";
import { lookupSize, sizeCatalog } from "../../src/core/allocation-sizes.js";

const small = lookupSize(sizeCatalog(), "small");

function host(
  id: string,
  used: { vcpu: number; memoryMib: number; diskMib?: number; slots: number },
  standing: HostStanding = "ready",
  cap: { vcpu: number; memoryMib: number; diskMib?: number | null; slots: number } = { vcpu: 8, memoryMib: 16384, diskMib: 102400, slots: 4 },
): HostAccount {
  return { hostId: id, name: `n-${id}`, standing, capacity: { diskMib: 102400, ...cap }, used: { diskMib: 0, ...used } };
}
const empty = { vcpu: 0, memoryMib: 0, slots: 0 };

test("disk: a host without the size's disk free does not fit, named; a host whose agent declared no disk is not checked for it", () => {
  const d = place([host("d", { vcpu: 0, memoryMib: 0, diskMib: 92160, slots: 0 }), host("old", empty, "ready", { vcpu: 8, memoryMib: 16384, diskMib: null, slots: 4 })], small);
  const reasons = Object.fromEntries(d.verdicts.map((v) => [v.hostId, v.fits ? "fits" : v.reason]));
  assert.deepEqual(reasons, { d: "disk: 10/100 GiB free, small needs 20", old: "fits" });
  assert.equal(d.chosen?.hostId, "old");
  assert.equal(choose([host("d", { vcpu: 0, memoryMib: 0, diskMib: 92160, slots: 0 })], small), null, "choose refuses it too");
  assert.equal(choose([host("d", { vcpu: 0, memoryMib: 0, diskMib: 81920, slots: 0 })], small)?.hostId, "d", "exactly the size's disk free fits");
});

test("binpack picks the fullest host that still fits; spread the emptiest", () => {
  const hosts = [host("a", empty), host("b", { vcpu: 4, memoryMib: 8192, slots: 2 }), host("c", { vcpu: 2, memoryMib: 4096, slots: 1 })];
  assert.equal(place(hosts, small, "binpack").chosen?.hostId, "b");
  assert.equal(place(hosts, small, "spread").chosen?.hostId, "a");
  assert.equal(place(hosts, small).chosen?.hostId, "b", "binpack is the default");
});

test("ties break on host id, whatever the input order", () => {
  assert.equal(place([host("z", empty), host("m", empty)], small, "binpack").chosen?.hostId, "m");
  assert.equal(place([host("m", empty), host("z", empty)], small, "spread").chosen?.hostId, "m");
});

for (const standing of ["draining", "withdrawn", "not_ready"] as const) {
  test(`a ${standing} host is never chosen, even when it is the only one with room`, () => {
    const d = place([host("a", empty, standing), host("b", { vcpu: 8, memoryMib: 0, slots: 0 })], small);
    assert.equal(d.chosen, null);
    const va = d.verdicts.find((v) => v.hostId === "a")!;
    assert.equal(va.fits, false);
    assert.match((va as { reason: string }).reason, new RegExp(`host is ${standing.replace("_", " ")}`));
  });
}

test("per-host verdicts name the dimension that does not fit", () => {
  const d = place(
    [
      host("v", { vcpu: 7, memoryMib: 0, slots: 0 }),
      host("m", { vcpu: 0, memoryMib: 14336, slots: 0 }),
      host("s", { vcpu: 0, memoryMib: 0, slots: 4 }),
      host("ok", empty),
    ],
    small,
  );
  const reasons = Object.fromEntries(d.verdicts.map((v) => [v.hostId, v.fits ? "fits" : v.reason]));
  assert.deepEqual(reasons, {
    v: "vcpu: 1/8 free, small needs 2",
    m: "memory: 2/16 GiB free, small needs 4",
    s: "slots: 0/4 free",
    ok: "fits",
  });
  assert.equal(d.chosen?.hostId, "ok");
});

test("exact fit in every dimension is accepted", () => {
  const d = place([host("a", { vcpu: 6, memoryMib: 12288, slots: 3 })], small);
  assert.equal(d.chosen?.hostId, "a");
});

test("excluded hosts are not chosen (re-placement after a lost race)", () => {
  const d = place([host("a", empty), host("b", empty)], small, "binpack", new Set(["a"]));
  assert.equal(d.chosen?.hostId, "b");
});

test("no capacity message lists every host's reason, or says there are no hosts", () => {
  assert.match(noCapacityMessage(place([], small), small), /no host is enrolled/);
  const msg = noCapacityMessage(place([host("a", empty, "withdrawn"), host("b", { vcpu: 8, memoryMib: 0, slots: 0 })], small), small);
  assert.equal(msg, "no_capacity: no host has room for small (n-a: host is withdrawn; n-b: vcpu: 0/8 free, small needs 2); see berth alloc plan --size small");
});

test("choose (the create hot path) agrees with place on random inputs", () => {
  let seed = 7;
  const rnd = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % n;
  };
  const standings: HostStanding[] = ["ready", "ready", "ready", "draining", "withdrawn", "not_ready"];
  for (let run = 0; run < 500; run++) {
    const hosts = Array.from({ length: 1 + rnd(12) }, (_, i) =>
      host(`h${rnd(6)}${i}`, { vcpu: rnd(9), memoryMib: 1024 * rnd(17), diskMib: 10240 * rnd(11), slots: rnd(5) }, standings[rnd(standings.length)]!, {
        vcpu: 8, memoryMib: 16384, diskMib: rnd(4) === 0 ? null : 102400, slots: 4,
      }),
    );
    const exclude = new Set(hosts.filter(() => rnd(8) === 0).map((h) => h.hostId));
    for (const strategy of ["binpack", "spread"] as const) {
      assert.equal(choose(hosts, small, strategy, exclude)?.hostId ?? null, place(hosts, small, strategy, exclude).chosen?.hostId ?? null, `run ${run} ${strategy}`);
    }
  }
});
