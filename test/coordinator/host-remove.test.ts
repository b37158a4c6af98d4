/**
 * `POST /v1/hosts/{host}/remove` over real HTTP against a coordinator on a
 * SQLite file, with a live allocation on the host: refused `host_busy`
 * without force and nothing written; admin only; with force the allocation
 * is released through the normal path and the host's row goes once nothing
 * of it is live, audited.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { startTestCoordinator } from "../helpers/env.js";
import { dumpAll } from "../helpers/serve.js";
import { Api, ApiError } from "../../src/cli/api.js";

test("host remove: a live allocation refuses it unless forced; forced, the allocation is released and the host removed", async () => {
  const t = await startTestCoordinator({});
  try {
    const admin = await t.token("admin");
    const operator = await t.token("operator");
    const member = await t.token("member");
    const agent = await t.token("agent");
    const enrolled = await new Api(t.coord.url, agent.token).call<{ hostId: string }>("POST", "/v1/hosts/enroll", {
      name: "host-a",
      url: "http://127.0.0.1:1",
      runtime: "process",
      capacity: { vcpu: 8, memoryMb: 16384, slots: 4 },
      ssh: { host: "127.0.0.1", port: 2222, hostKey: "ssh-ed25519 AAAA", fingerprint: "SHA256:x" },
    });
    const adm = new Api(t.coord.url, admin.token);
    await adm.call("POST", `/v1/owners/${member.id}/admit`, { vcpu: 4, memoryMib: 8192, count: 2 });
    const a = await new Api(t.coord.url, member.token).call<{ id: string; hostId: string }>("POST", "/v1/allocations", { id: "rm-1", size: "small", durationMs: 3_600_000 });
    assert.equal(a.hostId, enrolled.hostId);

    const before = await dumpAll(t.store);
    const busy = await adm.call("POST", "/v1/hosts/host-a/remove", {}).then(() => null, (e: unknown) => e);
    assert.ok(busy instanceof ApiError, String(busy));
    assert.equal(busy.code, "host_busy");
    assert.match(busy.message, /allocation rm-1/);
    const notAdmin = await new Api(t.coord.url, operator.token).call("POST", "/v1/hosts/host-a/remove", { force: true }).then(() => null, (e: unknown) => e);
    assert.ok(notAdmin instanceof ApiError && notAdmin.status === 403, String(notAdmin));
    assert.deepEqual(await dumpAll(t.store), before, "a refused removal writes nothing");

    const r = await adm.call<{ state: string; allocations: number }>("POST", "/v1/hosts/host-a/remove", { force: true });
    const alloc = await t.store.transaction((tx) => tx.get<{ state: string }>("SELECT state FROM allocations WHERE id = ?", ["rm-1"]));
    assert.ok(alloc && ["releasing", "released"].includes(alloc.state), `the allocation is released by the normal path: ${JSON.stringify(alloc)}`);
    if (alloc.state === "released") assert.equal(r.state, "removed");
    else assert.deepEqual([r.state, r.allocations], ["removing", 1]);
    const audit = await t.store.transaction((tx) => tx.all<{ event: string }>("SELECT event FROM audit WHERE machine_id = ? ORDER BY at, event", [enrolled.hostId]));
    assert.ok(audit.some((e) => e.event === "host_removing"));
    const hosts = await adm.call<{ hosts: Array<{ id: string }> }>("GET", "/v1/hosts");
    assert.equal(hosts.hosts.some((h) => h.id === enrolled.hostId), r.state !== "removed");
    // Placement takes nothing new on a host being removed (or gone).
    const next = await new Api(t.coord.url, member.token).call("POST", "/v1/allocations", { id: "rm-2", size: "small", durationMs: 3_600_000 }).then(() => null, (e: unknown) => e);
    assert.ok(next instanceof ApiError, "no allocation is placed on the removed host");
  } finally {
    await t.close();
  }
});
