/** Keeper borrow deadlines, arm by arm: at `now == deadline` the deadline has passed. */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { liveDecision, nextHeartbeatDeadline, type BorrowCore, type LiveDecision } from "../../src/core/borrow.js";

const HB = 1_000;
const EXP = 5_000;

describe("liveDecision", () => {
  const cases: Array<{ title: string; borrow: Partial<BorrowCore>; now: number; expect: LiveDecision }> = [
    { title: "active, before both deadlines: live", borrow: {}, now: HB - 1, expect: { kind: "live" } },
    { title: "[I6] active, at now == heartbeatDeadline: heartbeat_missed", borrow: {}, now: HB, expect: { kind: "heartbeat_missed", at: HB } },
    { title: "[I6] active, past the heartbeat deadline: heartbeat_missed", borrow: {}, now: HB + 1, expect: { kind: "heartbeat_missed", at: HB } },
    { title: "[I3] active, at now == expiresAt: expired", borrow: { heartbeatDeadline: EXP }, now: EXP, expect: { kind: "expired", at: EXP } },
    { title: "[I3] both deadlines passed: expired wins over heartbeat_missed", borrow: {}, now: EXP, expect: { kind: "expired", at: EXP } },
    { title: "[I6] returned: ended, whatever the clock", borrow: { state: "returned" }, now: 0, expect: { kind: "ended", state: "returned" } },
    { title: "[I6] abandoned: ended, whatever the clock", borrow: { state: "abandoned" }, now: 0, expect: { kind: "ended", state: "abandoned" } },
    { title: "[I6] expired: ended, whatever the clock", borrow: { state: "expired" }, now: 0, expect: { kind: "ended", state: "expired" } },
  ];
  for (const c of cases) {
    it(c.title, () => {
      const b: BorrowCore = { state: "active", heartbeatDeadline: HB, expiresAt: EXP, ...c.borrow };
      assert.deepEqual(liveDecision(b, c.now), c.expect);
    });
  }
});

describe("nextHeartbeatDeadline", () => {
  const cases: Array<{ title: string; now: number; expect: number }> = [
    { title: "now + interval while that is before the hard expiry", now: 1_000, expect: 1_000 + HB },
    { title: "[I3] capped at the hard expiry: a heartbeat never reaches past it", now: EXP - 10, expect: EXP },
    { title: "[I3] exactly at the hard expiry when now + interval lands on it", now: EXP - HB, expect: EXP },
  ];
  for (const c of cases) {
    it(c.title, () => {
      assert.equal(nextHeartbeatDeadline(c.now, HB, EXP), c.expect);
    });
  }
});
