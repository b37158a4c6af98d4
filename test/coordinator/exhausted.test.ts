/**
 * `pool_exhausted` says what ends the wait: a borrow's end when machines are
 * lent, a cleanup's end when the only holders are machines being cleaned.
 */
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator } from "../helpers/env.js";
import { ApiError, type Api } from "../../src/cli/api.js";
import { whyShort } from "../../src/coordinator/actions/exhausted.js";
import { readPool } from "../../src/store/pools.js";

type Claim = { id: string; token: string; expiresAt: number };

async function exhaustedMessage(api: Api): Promise<string> {
  try {
    await api.call("POST", "/v1/pools/ci/borrow", {});
  } catch (e) {
    assert.ok(e instanceof ApiError, String(e));
    assert.equal(e.code, "pool_exhausted", e.message);
    return e.message;
  }
  assert.fail("the borrow was served");
}

describe("what a pool at its maximum says ends the wait", () => {
  test("every machine lent: a borrow's end; machines only being cleaned: a cleanup's end", async () => {
    const t = await startTestCoordinator({ engine: "sqlite", reconcile: false });
    try {
      const admin = await t.api("admin");
      const e = await admin.call<{ claims: Claim[] }>("POST", "/v1/pools/ci/ensure", { compatibilityKey: "linux-x64", minReady: 1, maxReady: 1 });
      await admin.call("POST", "/v1/pools/ci/machines", { claimToken: e.claims[0]!.token, resourceId: "vm-1", ssh: { host: "10.0.0.1", port: 22, user: "ci" } });
      const member = await t.api("member");
      const b = await member.call<{ borrowId: string; borrowToken: string }>("POST", "/v1/pools/ci/borrow", {});

      const lent = await exhaustedMessage(member);
      assert.match(lent, /at its maximum of 1 machine\(s\) and none is ready: 1 lent, 0 being cleaned after a return; one is ready again when a borrow ends/);

      // A keeper pool without fencing returns straight to ready; the counts of a
      // pool whose machines are all being cleaned (a fencing provider's return)
      // are given to the same function the borrow reads its message from.
      const pool = await t.store.transaction((tx) => readPool(tx, "acme", "ci"));
      assert.ok(pool);
      const counts = (lent: number, cleanup: number) => ({ ready: 0, lent, cleanup, openClaims: 0 });
      const cleaning = await t.store.transaction((tx) => whyShort(tx, pool, counts(0, 1), true));
      assert.match(cleaning, /0 lent, 1 being cleaned after a return; one is ready again when a cleanup ends/);
      assert.doesNotMatch(cleaning, /borrow ends/);
      const both = await t.store.transaction((tx) => whyShort(tx, { ...pool, maxReady: 2 }, counts(1, 1), true));
      assert.match(both, /1 lent, 1 being cleaned after a return; one is ready again when a borrow or a cleanup ends/);
      await member.call("POST", `/v1/borrows/${b.borrowId}/return`, { token: b.borrowToken });
    } finally {
      await t.close();
    }
  });
});
