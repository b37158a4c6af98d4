/**
 * Allocations over real HTTP against a coordinator on a SQLite file: the id
 * round trip through create, show, list and release; ids a route cannot
 * address refused in body and path with nothing written; bad sizes,
 * durations and budgets; owner scoping; the plan; expiry by the reconciler;
 * the refusal metric.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import { startTestCoordinator, TestClock, type TestCoordinator } from "../helpers/env.js";
import { dumpAll } from "../helpers/serve.js";
import { Api, ApiError } from "../../src/cli/api.js";

interface Answer {
  status: number;
  body: { error?: { code: string; message: string } } & Record<string, unknown>;
}

/** One request with the path sent byte for byte (no client-side normalisation). */
function send(base: string, method: string, path: string, token: string, body?: unknown): Promise<Answer> {
  const url = new URL(base);
  const payload = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { authorization: `Bearer ${token}`, connection: "close" };
    if (payload !== undefined) {
      headers["content-type"] = "application/json";
      headers["content-length"] = String(Buffer.byteLength(payload));
    }
    const req = request({ host: url.hostname, port: url.port, method, path, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString("utf8")) }));
    });
    req.on("error", reject);
    req.end(payload);
  });
}

async function setup(clock: TestClock | null = null): Promise<{ t: TestCoordinator; admin: { id: string; token: string }; member: { id: string; token: string }; other: { id: string; token: string }; hostId: string }> {
  const t = await startTestCoordinator({ clock, config: { maxAllocationMs: 8 * 3_600_000 } });
  const admin = await t.token("admin");
  const member = await t.token("member");
  const other = await t.token("member");
  const agent = await t.token("agent");
  const enrolled = await send(t.coord.url, "POST", "/v1/hosts/enroll", agent.token, {
    name: "host-a",
    url: "http://127.0.0.1:1",
    runtime: "process",
    capacity: { vcpu: 8, memoryMb: 16384, slots: 4 },
    ssh: { host: "127.0.0.1", port: 2222, hostKey: "ssh-ed25519 AAAA", fingerprint: "SHA256:x" },
  });
  assert.equal(enrolled.status, 200, JSON.stringify(enrolled.body));
  for (const o of [member, other]) {
    const r = await send(t.coord.url, "POST", `/v1/owners/${o.id}/admit`, admin.token, { vcpu: 4, memoryMib: 8192, count: 2 });
    assert.equal(r.status, 200, JSON.stringify(r.body));
  }
  return { t, admin, member, other, hostId: enrolled.body.hostId as string };
}

test("an admitted id round-trips through create, show, list and release; a retry answers the same allocation", async () => {
  const { t, member, admin, hostId } = await setup();
  try {
    const api = new Api(t.coord.url, member.token);
    try {
      for (const id of ["Az09_-x", "-", "_", "x".repeat(128)]) {
        const created = await api.call<{ id: string; state: string; hostId: string; created: boolean }>("POST", "/v1/allocations", { id, size: "small", durationMs: 3_600_000 });
        assert.deepEqual([created.id, created.state, created.hostId, created.created], [id, "placed", hostId, true]);
        const again = await send(t.coord.url, "POST", "/v1/allocations", member.token, { id, size: "small", durationMs: 3_600_000 });
        assert.equal(again.status, 200);
        assert.equal(again.body.created, false);
        const shown = await send(t.coord.url, "GET", `/v1/allocations/${encodeURIComponent(id)}`, member.token);
        assert.equal(shown.status, 200);
        assert.equal(shown.body.id, id);
        const listed = await api.call<{ allocations: { id: string }[] }>("GET", "/v1/allocations");
        assert.ok(listed.allocations.some((a) => a.id === id));
        const released = await send(t.coord.url, "POST", `/v1/allocations/${encodeURIComponent(id)}/release`, member.token, {});
        assert.equal(released.status, 200);
        assert.equal(released.body.state, "released");
        assert.equal((await api.call<{ allocations: { id: string }[] }>("GET", "/v1/allocations")).allocations.some((a) => a.id === id), false, "released ones are listed only with ?all=true");
        assert.ok((await api.call<{ allocations: { id: string }[] }>("GET", "/v1/allocations?all=true")).allocations.some((a) => a.id === id));
      }
      // The owner's budget is whole again.
      const owners = await send(t.coord.url, "GET", "/v1/owners", admin.token);
      const mine = (owners.body.owners as { owner: string; used: unknown }[]).find((o) => o.owner === member.id)!;
      assert.deepEqual(mine.used, { vcpu: 0, memoryMib: 0, diskMib: 0, count: 0 });
    } finally {
      await api.close();
    }
  } finally {
    await t.close();
  }
});

test("ids a route cannot address are refused in the body and in the path, with nothing written", async () => {
  const { t, member } = await setup();
  try {
    const before = await dumpAll(t.store);
    for (const bad of ["a/b", "a?b", "a b", "é", "x".repeat(129), "..", "", "a.b"]) {
      const r = await send(t.coord.url, "POST", "/v1/allocations", member.token, { id: bad, size: "small" });
      assert.equal(r.status, 400, bad);
      assert.equal(r.body.error?.code, "invalid_id", bad);
    }
    for (const path of ["/v1/allocations/a%2Fb", "/v1/allocations/a%3Fb", "/v1/allocations/a%20b", "/v1/allocations/%C3%A9", `/v1/allocations/${"x".repeat(129)}`, "/v1/allocations/..", "/v1/allocations/a/b"]) {
      const r = await send(t.coord.url, "GET", path, member.token);
      assert.equal(r.body.error?.code, "invalid_id", path);
      const rel = await send(t.coord.url, "POST", `${path}/release`, member.token, {});
      assert.equal(rel.body.error?.code, "invalid_id", `${path}/release`);
    }
    assert.deepEqual(await dumpAll(t.store), before);
  } finally {
    await t.close();
  }
});

test("unknown size, duration past policy, zero or negative budget: a clear refusal and nothing written", async () => {
  const { t, member, admin } = await setup();
  try {
    const before = await dumpAll(t.store);
    const unknown = await send(t.coord.url, "POST", "/v1/allocations", member.token, { id: "x1", size: "huge" });
    assert.deepEqual([unknown.status, unknown.body.error?.message], [400, 'invalid_request: unknown size "huge"; known sizes: small, large']);
    const long = await send(t.coord.url, "POST", "/v1/allocations", member.token, { id: "x1", size: "small", durationMs: 9 * 3_600_000 });
    assert.deepEqual([long.status, long.body.error?.message], [400, "invalid_request: requested duration 9h is past the policy maximum of 8h; ask for at most 8h"]);
    const negative = await send(t.coord.url, "POST", "/v1/allocations", member.token, { id: "x1", size: "small", durationMs: -1 });
    assert.equal(negative.body.error?.code, "invalid_request");
    for (const b of [{ vcpu: 0, memoryMib: 1024, count: 1 }, { vcpu: 2, memoryMib: -4096, count: 1 }, { vcpu: 2, memoryMib: 4096, count: -1 }]) {
      const r = await send(t.coord.url, "POST", `/v1/owners/${member.id}/budget`, admin.token, b);
      assert.equal(r.status, 400);
      assert.match(r.body.error!.message, /^invalid_request: budget (vcpu|memory|count) must be a whole number of at least 1$/);
    }
    const forbidden = await send(t.coord.url, "POST", `/v1/owners/${member.id}/budget`, member.token, { vcpu: 99, memoryMib: 99999, count: 99 });
    assert.equal(forbidden.body.error?.code, "forbidden");
    assert.deepEqual(await dumpAll(t.store), before);
  } finally {
    await t.close();
  }
});

test("owners see only their own allocations; budget refusals are immediate, named, and counted in metrics; plan names per-host reasons", async () => {
  const { t, member, other, admin, hostId } = await setup();
  try {
    const a = await send(t.coord.url, "POST", "/v1/allocations", member.token, { id: "m1", size: "small" });
    assert.equal(a.status, 201);
    const refused = await send(t.coord.url, "POST", "/v1/allocations", member.token, { id: "m2", size: "large" });
    assert.deepEqual([refused.status, refused.body.error?.message], [409, "budget_exhausted: vcpu 2/4 used, large needs 4"]);
    assert.equal((await send(t.coord.url, "GET", "/v1/allocations/m1", other.token)).status, 404);
    assert.equal((await send(t.coord.url, "POST", "/v1/allocations/m1/release", other.token, {})).status, 403);
    assert.deepEqual(((await send(t.coord.url, "GET", "/v1/allocations", other.token)).body.allocations as unknown[]).length, 0);
    assert.deepEqual(((await send(t.coord.url, "GET", "/v1/allocations", admin.token)).body.allocations as { id: string }[]).map((x) => x.id), ["m1"]);
    const forOther = await send(t.coord.url, "POST", "/v1/allocations", member.token, { id: "m3", size: "small", owner: other.id });
    assert.equal(forOther.body.error?.code, "forbidden");
    await send(t.coord.url, "POST", `/v1/hosts/${hostId}/standing`, admin.token, { standing: "withdrawn" });
    const plan = await send(t.coord.url, "POST", "/v1/allocations/plan", member.token, { size: "small" });
    assert.deepEqual(plan.body.decision, { chosen: null, verdicts: [{ hostId, name: "host-a", fits: false, reason: "host is withdrawn" }] });
    const noRoom = await send(t.coord.url, "POST", "/v1/allocations", other.token, { id: "o1", size: "small" });
    assert.deepEqual([noRoom.status, noRoom.body.error?.code], [503, "no_capacity"]);
    const metrics = await (await fetch(`${t.coord.url}/metrics`)).text();
    assert.match(metrics, /berth_allocation_refusals_total\{reason="budget_exhausted"\} 1/);
    assert.match(metrics, /berth_allocation_refusals_total\{reason="no_capacity"\} 1/);
    assert.match(metrics, /berth_allocations\{state="placed"\} 1/);
    // Owners are named by their tokens' label (these have none: one group, 2 of 8 vCPU), never by token id.
    assert.match(metrics, /berth_allocation_budget_used_ratio\{org="acme",owner="unlabelled",dimension="vcpu"\} 0.25/);
    for (const id of [member.id, other.id, admin.id]) assert.equal(metrics.includes(id), false, `no token id in /metrics (${id})`);
  } finally {
    await t.close();
  }
});

test("the reconciler releases an allocation at its expiry and returns the budget", async () => {
  const clock = new TestClock();
  const { t, member } = await setup(clock);
  try {
    const api = new Api(t.coord.url, member.token);
    try {
      await api.call("POST", "/v1/allocations", { id: "short", size: "small", durationMs: 60_000 });
      clock.advance(60_000);
      t.coord.loop.kick();
      let state = "";
      for (let i = 0; i < 200 && state !== "released"; i++) {
        state = (await api.call<{ state: string }>("GET", "/v1/allocations/short")).state;
        if (state !== "released") await new Promise((r) => setTimeout(r, 25));
      }
      assert.equal(state, "released");
      await assert.rejects(api.call("GET", "/v1/allocations/nope"), (e: ApiError) => e.code === "not_found");
    } finally {
      await api.close();
    }
  } finally {
    await t.close();
  }
});
