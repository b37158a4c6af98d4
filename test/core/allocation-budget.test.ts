import { test } from "node:test";
import assert from "node:assert/strict";
import { admit, checkBudget, refund, ZERO_USAGE, type Budget, type Usage } from "../../src/core/allocation-budget.js";
import { DEFAULT_SIZES, lookupSize, parseSizeSpec, sizeCatalog, gib } from "../../src/core/allocation-sizes.js";
import { parseBytes } from "../../src/core/bytes.js";
import { BerthError } from "../../src/core/errors.js";

const sizes = sizeCatalog();
const small = lookupSize(sizes, "small");
const large = lookupSize(sizes, "large");

test("default catalog: small 2 vCPU / 4 GiB / 20 GiB disk, large 4 vCPU / 8 GiB / 40 GiB disk", () => {
  assert.deepEqual(DEFAULT_SIZES, [
    { name: "small", vcpu: 2, memoryMib: 4096, diskMib: 20480 },
    { name: "large", vcpu: 4, memoryMib: 8192, diskMib: 40960 },
  ]);
});

test("a size as written for berth serve --alloc-size", () => {
  const mib = (t: string) => Math.floor(parseBytes(t, "x") / 2 ** 20);
  assert.deepEqual(parseSizeSpec("tiny=1,512M,64M", mib), { name: "tiny", vcpu: 1, memoryMib: 512, diskMib: 64 });
  assert.deepEqual(parseSizeSpec("small=2,4G,20G", mib), DEFAULT_SIZES[0]);
  assert.throws(() => parseSizeSpec("tiny=1,512M", mib), (e: BerthError) => /is not NAME=VCPU,MEMORY,DISK/.test(e.message));
  assert.throws(() => sizeCatalog([parseSizeSpec("tiny=1,512M,16M", mib)]), (e: BerthError) => /size tiny needs at least 32 MiB of disk/.test(e.message));
});

test("unknown size is refused naming the known ones", () => {
  assert.throws(() => lookupSize(sizes, "huge"), (e: BerthError) => e.code === "invalid_request" && /unknown size "huge"; known sizes: small, large/.test(e.message));
});

test("catalog refuses duplicates, bad names and non-positive dimensions", () => {
  for (const bad of [
    [{ name: "a", vcpu: 1, memoryMib: 128, diskMib: 64 }, { name: "a", vcpu: 1, memoryMib: 128, diskMib: 64 }],
    [{ name: "A b", vcpu: 1, memoryMib: 128, diskMib: 64 }],
    [{ name: "z", vcpu: 0, memoryMib: 128, diskMib: 64 }],
    [{ name: "z", vcpu: 1, memoryMib: 0, diskMib: 64 }],
    [{ name: "z", vcpu: 1, memoryMib: 128, diskMib: 0 }],
  ]) assert.throws(() => sizeCatalog(bad), (e: BerthError) => e.code === "invalid_request");
});

test("budget must be whole and positive in every dimension", () => {
  for (const b of [
    { vcpu: 0, memoryMib: 1, diskMib: 1, count: 1 },
    { vcpu: 1, memoryMib: -1, diskMib: 1, count: 1 },
    { vcpu: 1, memoryMib: 1, diskMib: 0, count: 1 },
    { vcpu: 1, memoryMib: 1, diskMib: 1, count: 0 },
    { vcpu: 1.5, memoryMib: 1, diskMib: 1, count: 1 },
  ]) {
    assert.throws(() => checkBudget(b), (e: BerthError) => e.code === "invalid_request" && /must be a whole number of at least 1/.test(e.message));
  }
  assert.throws(() => checkBudget({ vcpu: 1, memoryMib: 1, diskMib: 0, count: 1 }), /budget disk must be/);
  assert.deepEqual(checkBudget({ vcpu: 1, memoryMib: 1, diskMib: 1, count: 1 }), { vcpu: 1, memoryMib: 1, diskMib: 1, count: 1 });
});

const B: Budget = { vcpu: 8, memoryMib: 8192, diskMib: 61440, count: 3 };
const table: Array<{ name: string; used: Usage; size: typeof small; want: string | null }> = [
  { name: "empty budget admits small", used: ZERO_USAGE, size: small, want: null },
  { name: "exactly full after admits", used: { vcpu: 6, memoryMib: 4096, diskMib: 40960, count: 2 }, size: small, want: null },
  { name: "memory exhausted names the dimension", used: { vcpu: 2, memoryMib: 6144, diskMib: 0, count: 1 }, size: small, want: "budget_exhausted: memory 6/8 GiB used, small needs 4" },
  { name: "vcpu exhausted", used: { vcpu: 7, memoryMib: 0, diskMib: 0, count: 1 }, size: small, want: "budget_exhausted: vcpu 7/8 used, small needs 2" },
  { name: "disk exhausted names disk", used: { vcpu: 0, memoryMib: 0, diskMib: 51200, count: 1 }, size: small, want: "budget_exhausted: disk 50/60 GiB used, small needs 20" },
  { name: "count exhausted", used: { vcpu: 0, memoryMib: 0, diskMib: 0, count: 3 }, size: small, want: "budget_exhausted: allocations 3/3 live, small needs 1" },
  { name: "large over memory", used: { vcpu: 0, memoryMib: 512, diskMib: 0, count: 0 }, size: large, want: "budget_exhausted: memory 0.5/8 GiB used, large needs 8" },
];
for (const row of table) {
  test(`admit: ${row.name}`, () => {
    const d = admit(B, row.used, row.size);
    if (row.want === null) {
      assert.equal(d.kind, "admit");
      if (d.kind === "admit") assert.deepEqual(d.after, { vcpu: row.used.vcpu + row.size.vcpu, memoryMib: row.used.memoryMib + row.size.memoryMib, diskMib: row.used.diskMib + row.size.diskMib, count: row.used.count + 1 });
    } else {
      assert.equal(d.kind, "refuse");
      if (d.kind === "refuse") assert.equal(d.message, row.want);
    }
  });
}

test("refund returns exactly the size and refuses to go below zero", () => {
  assert.deepEqual(refund({ vcpu: 2, memoryMib: 4096, diskMib: 20480, count: 1 }, small), ZERO_USAGE);
  assert.throws(() => refund({ vcpu: 2, memoryMib: 4096, diskMib: 0, count: 1 }, small), /refund below zero/);
  assert.throws(() => refund(ZERO_USAGE, small));
});

test("gib prints one decimal at most", () => {
  assert.equal(gib(4096), "4");
  assert.equal(gib(1536), "1.5");
  assert.equal(gib(0), "0");
});
