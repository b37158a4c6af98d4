/** The one capacity rule (fillDecision, invariant 7) and the TTL rotation margin, arm by arm. */
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { fillDecision, rotationMarginMs, type CapacityCounts, type FillDecision } from "../../src/core/pool.js";

const counts = (c: Partial<CapacityCounts>): CapacityCounts => ({ ready: 0, lent: 0, cleanup: 0, openClaims: 0, ...c });
const hold = (why: string): FillDecision => ({ kind: "hold", why });
const MEETS = "ready capacity (with claims under way) meets minReady";
const FULL = "maxReady reached";

describe("fillDecision", () => {
  const cases: Array<{ title: string; min: number; max: number; c: Partial<CapacityCounts>; expect: FillDecision }> = [
    { title: "[I7] empty pool: claims for all of minReady", min: 3, max: 5, c: {}, expect: { kind: "issue", claims: 3 } },
    { title: "[I7] ready alone meets minReady: hold", min: 2, max: 5, c: { ready: 2 }, expect: hold(MEETS) },
    { title: "[I7] ready above minReady: hold", min: 2, max: 5, c: { ready: 3 }, expect: hold(MEETS) },
    { title: "[I7] open claims count as ready-to-be: ready + claims meet minReady, hold", min: 3, max: 5, c: { ready: 1, openClaims: 2 }, expect: hold(MEETS) },
    { title: "[I7] short by one with room: one claim", min: 3, max: 5, c: { ready: 1, openClaims: 1 }, expect: { kind: "issue", claims: 1 } },
    { title: "[I7] lent and cleanup machines fill maxReady: hold", min: 2, max: 4, c: { lent: 3, cleanup: 1 }, expect: hold(FULL) },
    { title: "[I7] total exactly at maxReady: hold", min: 3, max: 3, c: { ready: 1, lent: 1, openClaims: 1 }, expect: hold(FULL) },
    { title: "[I7] total over maxReady (a lowered maxReady): hold, nothing negative", min: 5, max: 2, c: { lent: 4 }, expect: hold(FULL) },
    { title: "[I7] room smaller than the shortfall: claims limited to the room", min: 4, max: 4, c: { lent: 3 }, expect: { kind: "issue", claims: 1 } },
    { title: "[I7] shortfall smaller than the room: claims for the shortfall", min: 2, max: 10, c: { lent: 3 }, expect: { kind: "issue", claims: 2 } },
    { title: "minReady 0: never a claim", min: 0, max: 10, c: {}, expect: hold(MEETS) },
  ];
  for (const c of cases) {
    it(c.title, () => {
      const cc = counts(c.c);
      const d = fillDecision({ minReady: c.min, maxReady: c.max }, cc);
      assert.deepEqual(d, c.expect);
      if (d.kind === "issue") {
        assert.ok(cc.ready + cc.lent + cc.cleanup + cc.openClaims + d.claims <= c.max, "after issuing, the total stays within maxReady");
        assert.ok(cc.ready + cc.openClaims < c.min, "a claim is issued only below minReady");
      }
    });
  }
});

describe("rotationMarginMs", () => {
  const cases: Array<{ title: string; ttl: number; expect: number }> = [
    { title: "a short TTL: a tenth of it", ttl: 600_000, expect: 60_000 },
    { title: "a long TTL: capped at 5 minutes", ttl: 24 * 3_600_000, expect: 300_000 },
    { title: "exactly 50 minutes: both rules agree on 5 minutes", ttl: 3_000_000, expect: 300_000 },
    { title: "a tenth is rounded down to whole milliseconds", ttl: 1_005, expect: 100 },
  ];
  for (const c of cases) {
    it(c.title, () => {
      assert.equal(rotationMarginMs(c.ttl), c.expect);
    });
  }
});
