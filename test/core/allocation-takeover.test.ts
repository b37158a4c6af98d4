import { test } from "node:test";
import assert from "node:assert/strict";
import { actorLiveness, fenceFloor, takeoverDecision, type ActorRecord, type ActorStanding, type Desire, type HoldObservation } from "../../src/core/allocation-takeover.js";

const rec: ActorRecord = { allocationId: "a1", generation: 3, actor: "c-old", kind: "actor" };
const tomb: ActorRecord = { ...rec, kind: "tombstone" };
const recorded = (liveness: "running" | "terminal" | "unreadable", record = rec): ActorStanding => ({ kind: "recorded", record, liveness });
const none: ActorStanding = { kind: "none" };
const absent: HoldObservation = { kind: "absent" };
const matching: HoldObservation = { kind: "present", allocationId: "a1", generation: 3 };
const stale: HoldObservation = { kind: "present", allocationId: "a1", generation: 2 };
const foreign: HoldObservation = { kind: "present", allocationId: "other", generation: 3 };
const unreadable: HoldObservation = { kind: "unreadable", why: "agent did not answer" };

const table: Array<[string, ActorStanding, HoldObservation, Desire, string]> = [
  ["matching hold, actor terminal: recover", recorded("terminal"), matching, "wanted", "recover"],
  ["matching hold, actor running: recover (publish, never a second hold)", recorded("running"), matching, "wanted", "recover"],
  ["matching hold while retired: recover (then release it normally)", recorded("terminal"), matching, "retired", "recover"],
  ["no hold, actor terminal, wanted: CAS to a new actor", recorded("terminal"), absent, "wanted", "cas_new_actor"],
  ["no hold, actor terminal, retired: tombstone", recorded("terminal"), absent, "retired", "tombstone"],
  ["no hold, no actor yet, wanted: first actor", none, absent, "wanted", "cas_new_actor"],
  ["no hold, no actor yet, retired: tombstone", none, absent, "retired", "tombstone"],
  ["no hold, actor running: retain", recorded("running"), absent, "wanted", "retain"],
  ["hold unreadable: retain", recorded("terminal"), unreadable, "wanted", "retain"],
  ["hold unreadable, retired: retain", recorded("terminal"), unreadable, "retired", "retain"],
  ["actor unreadable: retain", recorded("unreadable"), absent, "retired", "retain"],
  // No actor owns these holds: never adopted, never retained forever either (fenced and cleaned).
  ["hold of another generation, wanted: stale hold", recorded("terminal"), stale, "wanted", "stale_hold"],
  ["hold of another generation, retired: stale hold", recorded("terminal"), stale, "retired", "stale_hold"],
  ["hold of another allocation: retain", recorded("terminal"), foreign, "wanted", "retain"],
  ["hold without any actor record: stale hold", none, matching, "wanted", "stale_hold"],
  ["tombstone and no hold: settled", recorded("terminal", tomb), absent, "wanted", "settled"],
  ["tombstone and a hold: stale hold (the cleanup releases it)", recorded("terminal", tomb), matching, "retired", "stale_hold"],
  ["tombstone and another allocation's hold: retain", recorded("terminal", tomb), foreign, "retired", "retain"],
];

for (const [name, prior, hold, desire, want] of table) {
  test(`takeover: ${name}`, () => {
    const d = takeoverDecision("a1", prior, hold, desire);
    assert.equal(d.kind, want);
    if (d.kind === "cas_new_actor" || d.kind === "tombstone") {
      // The CAS names the exact record it replaces, and moves the generation on.
      const expected = prior.kind === "recorded" ? prior.record : null;
      assert.deepEqual(d.expected, expected);
      assert.equal(d.next.generation, (expected?.generation ?? 0) + 1);
    }
    if (d.kind === "recover") assert.equal(d.generation, 3);
    if (d.kind === "retain") assert.ok(d.why.length > 0);
  });
}

test("an actor's lease: running before recordedAt + lease, terminal at equality and after", () => {
  assert.equal(actorLiveness(1_000, 1_999, 1_000), "running");
  assert.equal(actorLiveness(1_000, 2_000, 1_000), "terminal");
  assert.equal(actorLiveness(1_000, 5_000, 1_000), "terminal");
});

test("the observation fences (raises the agent's floor) exactly when it can decide a compare-and-set", () => {
  assert.equal(fenceFloor(recorded("terminal")), 4, "lapsed actor at 3: the floor is the generation a replacement takes");
  assert.equal(fenceFloor(none), 1);
  assert.equal(fenceFloor(recorded("running")), null, "a running actor may still take its hold: a plain read");
  assert.equal(fenceFloor(recorded("unreadable")), null);
  assert.equal(fenceFloor(recorded("terminal", tomb)), null, "a tombstone is final; the release fences");
  // Every decision that writes a new generation was made on a fenced observation of that generation.
  for (const prior of [recorded("terminal"), none]) {
    for (const desire of ["wanted", "retired"] as const) {
      const d = takeoverDecision("a1", prior, absent, desire);
      assert.ok(d.kind === "cas_new_actor" || d.kind === "tombstone");
      assert.equal(d.next.generation, fenceFloor(prior));
    }
  }
});
