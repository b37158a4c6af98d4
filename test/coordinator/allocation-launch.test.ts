/**
 * Allocation launch, expiry and doubtful cleanup, in process: a coordinator
 * (SQLite) and a real agent (process runtime) enrolled with it over loopback
 * HTTP. Launch → ready with access and the create→ready metric; expiry
 * releases a ready allocation through the cleanup (refund only then); an
 * agent that cannot be reached keeps the cleanup in doubt: quarantined with
 * slot and budget charged, resolved (and refunded once) when it is back.
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { AgentHarness } from "../helpers/agent.js";
import { startTestCoordinator, type TestCoordinator } from "../helpers/env.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import type { Api } from "../../src/cli/api.js";
import type { RunningAgent } from "../../src/agent/agent.js";

interface View {
  state: string;
  reason: string | null;
  launch: { readyAt: number | null; release: { volume: string } | null } | null;
  access: { user: string; port: number; hostKey: string } | null;
}

describe("allocation launch, expiry and quarantine (in process)", { timeout: 60_000 }, () => {
  const h = new AgentHarness("berth-alloc-launch-");
  let c: TestCoordinator;
  let api: Api;
  let owner = "";
  let agent: RunningAgent;
  const agentDir = h.dir();
  const key = generateSshKeyPair("launch-test");
  const startAgent = async () => {
    const t = await c.token("agent");
    agent = await h.agent({ stateDir: agentDir, coordinatorUrl: c.coord.url, enrollToken: t.token, vcpu: 8, memoryMib: 16384, slots: 4, name: "h1" });
    await agent.enrolled;
  };
  const get = (id: string) => api.call<View>("GET", `/v1/allocations/${id}`);
  const until = async (id: string, state: string) => {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const v = await get(id);
      if (v.state === state) return v;
      if (Date.now() > deadline) throw new Error(`${id} is ${v.state} (${v.reason}), not ${state}`);
      await new Promise((r) => setTimeout(r, 25));
    }
  };
  const used = async () => (await api.call<{ owners: Array<{ owner: string; used: { count: number } }> }>("GET", "/v1/owners")).owners.find((o) => o.owner === owner)!.used.count;

  before(async () => {
    c = await startTestCoordinator({ config: { allocationActorLeaseMs: 200 } });
    const t = await c.token("admin");
    owner = t.id;
    const { Api: ApiClass } = await import("../../src/cli/api.js");
    api = new ApiClass(c.coord.url, t.token);
    await startAgent();
    await api.call("POST", `/v1/owners/${owner}/admit`, { vcpu: 8, memoryMib: 16384, count: 4 });
  });
  after(async () => {
    await api.close();
    await c.close();
    await h.close();
  });

  test("launch: ready with access to the sandbox, create→ready observed", async () => {
    await api.call("POST", "/v1/allocations", { id: "l1", size: "small", publicKey: key.publicKey });
    const v = await until("l1", "ready");
    assert.equal(v.access?.user, "a-l1");
    assert.equal(v.access?.hostKey, agent.ssh.hostKey);
    assert.ok(v.launch?.readyAt);
    const metrics = await (await fetch(`${c.coord.url}/metrics`, { headers: { authorization: `Bearer ${(await c.token("admin")).token}` } })).text();
    assert.match(metrics, /berth_allocation_create_to_ready_seconds_count 1\b/);
  });

  test("expiry releases a ready allocation through its cleanup; the budget comes back only then", async () => {
    await api.call("POST", "/v1/allocations", { id: "l2", size: "small", publicKey: key.publicKey, durationMs: 1_500 });
    await until("l2", "ready");
    const before = await used();
    const v = await until("l2", "released");
    assert.equal(v.launch?.release?.volume, "wiped");
    assert.equal(await used(), before - 1);
    assert.equal((await agent.runtime.inspect("a-l2")).exists, false);
  });

  test("an unreachable agent keeps the cleanup in doubt: quarantined, charged; resolved and refunded once when it is back", async () => {
    await api.call("POST", "/v1/allocations", { id: "l3", size: "small", publicKey: key.publicKey });
    await until("l3", "ready");
    const charged = await used();
    await agent.stop();
    await api.call("POST", "/v1/allocations/l3/release", {});
    const q = await until("l3", "quarantined");
    assert.match(q.reason ?? "", /cleanup not proven/);
    assert.equal(await used(), charged, "slot and budget stay charged while in doubt");
    await startAgent();
    // The quarantine retry is a minute away; wake it now as an operator's retry would.
    await c.store.transaction((tx) => tx.run("UPDATE due SET due_at = 0 WHERE kind = 'alloc_cleanup' AND ref = 'l3'"));
    c.coord.ctx.kick();
    const v = await until("l3", "released");
    assert.equal(v.reason, "quarantine resolved");
    assert.equal(await used(), charged - 1);
  });
});
