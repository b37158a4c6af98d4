import { test } from "node:test";
import assert from "node:assert/strict";
import { allocationTransition, expired, expiryFor, launchGate, ALLOCATION_STATES, type AllocationEvent, type AllocationState } from "../../src/core/allocation.js";

type Row = [AllocationState, AllocationEvent, AllocationState | "refused", string[]];
const rel = (cause: "owner" | "expiry" = "owner", keepVolume = false): AllocationEvent => ({ kind: "release", cause, keepVolume });
const table: Row[] = [
  ["placed", { kind: "launch_started" }, "launching", ["launch"]],
  ["launching", { kind: "launch_started" }, "launching", []],
  ["ready", { kind: "launch_started" }, "refused", []],
  ["launching", { kind: "launched" }, "ready", []],
  ["placed", { kind: "launched" }, "refused", []],
  ["launching", { kind: "launch_failed", reason: "agent refused" }, "releasing", ["cleanup"]],
  ["ready", { kind: "launch_failed", reason: "x" }, "refused", []],
  ["placed", rel("expiry"), "released", ["refund"]],
  ["launching", rel(), "releasing", ["cleanup"]],
  ["ready", rel(), "releasing", ["cleanup"]],
  ["releasing", rel(), "releasing", []],
  ["quarantined", rel(), "quarantined", []],
  ["released", rel(), "released", []],
  ["releasing", { kind: "cleanup_done" }, "released", ["refund"]],
  ["released", { kind: "cleanup_done" }, "released", []],
  ["ready", { kind: "cleanup_done" }, "refused", []],
  ["releasing", { kind: "cleanup_doubtful", reason: "process survived" }, "quarantined", []],
  ["quarantined", { kind: "cleanup_doubtful", reason: "again" }, "quarantined", []],
  ["placed", { kind: "cleanup_doubtful", reason: "x" }, "refused", []],
  ["quarantined", { kind: "quarantine_resolved" }, "released", ["refund"]],
  ["ready", { kind: "quarantine_resolved" }, "refused", []],
  ["quarantined", { kind: "host_gone", by: "op" }, "released", ["refund"]],
  ["releasing", { kind: "host_gone", by: "op" }, "released", ["refund"]],
  ["ready", { kind: "host_gone", by: "op" }, "refused", []],
  ["launching", { kind: "host_gone", by: "op" }, "refused", []],
  ["ready", { kind: "sandbox_died", reason: "not running" }, "failed", []],
  ["failed", { kind: "sandbox_died", reason: "again" }, "failed", []],
  ["launching", { kind: "sandbox_died", reason: "x" }, "refused", []],
  ["releasing", { kind: "sandbox_died", reason: "x" }, "refused", []],
  ["failed", { kind: "restarted" }, "ready", []],
  ["releasing", { kind: "restarted" }, "refused", []],
  ["failed", rel(), "releasing", ["cleanup"]],
  ["failed", rel("expiry"), "releasing", ["cleanup"]],
];
for (const [from, e, want, effects] of table) {
  test(`${from} --${e.kind}--> ${want}`, () => {
    const t = allocationTransition(from, e);
    if (want === "refused") {
      assert.equal(t.ok, false);
      return;
    }
    assert.ok(t.ok);
    assert.equal(t.state, want);
    assert.deepEqual(t.effects.map((x) => x.kind), effects);
    assert.equal(t.changed, from !== want);
  });
}

test("refund happens only on the edge into released, and released is terminal", () => {
  const events: AllocationEvent[] = [{ kind: "launch_started" }, { kind: "launched" }, { kind: "launch_failed", reason: "x" }, rel(), { kind: "cleanup_done" }, { kind: "cleanup_doubtful", reason: "x" }, { kind: "quarantine_resolved" }, { kind: "host_gone", by: "op" }, { kind: "sandbox_died", reason: "x" }, { kind: "restarted" }];
  for (const from of ALLOCATION_STATES) {
    for (const e of events) {
      const t = allocationTransition(from, e);
      if (!t.ok) continue;
      const refunds = t.effects.filter((x) => x.kind === "refund").length;
      assert.equal(refunds, from !== "released" && t.state === "released" ? 1 : 0, `${from} ${e.kind}`);
      if (from === "released") assert.equal(t.state, "released");
    }
  }
});

test("release keeps the volume when asked", () => {
  const t = allocationTransition("ready", rel("owner", true));
  assert.ok(t.ok);
  assert.deepEqual(t.effects, [{ kind: "cleanup", keepVolume: true }]);
});

test("launch gate: withdrawn and draining hosts never launch; not-ready waits", () => {
  assert.deepEqual(launchGate("ready"), { kind: "launch" });
  assert.equal(launchGate("withdrawn").kind, "release");
  assert.equal(launchGate("draining").kind, "release");
  assert.equal(launchGate("not_ready").kind, "wait");
});

test("expiry at equality; duration defaults to and is capped by policy", () => {
  assert.equal(expired(1000, 999), false);
  assert.equal(expired(1000, 1000), true);
  assert.deepEqual(expiryFor(10, null, 3_600_000), { ok: true, expiresAt: 3_600_010 });
  assert.deepEqual(expiryFor(10, 60_000, 3_600_000), { ok: true, expiresAt: 60_010 });
  const past = expiryFor(10, 7_200_000, 3_600_000);
  assert.equal(past.ok, false);
  if (!past.ok) assert.equal(past.message, "invalid_request: requested duration 2h is past the policy maximum of 1h; ask for at most 1h");
  assert.equal(expiryFor(10, 0, 3_600_000).ok, false);
  assert.equal(expiryFor(10, -5, 3_600_000).ok, false);
});
