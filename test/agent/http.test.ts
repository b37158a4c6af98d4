/* eslint-disable @typescript-eslint/no-explicit-any -- the tests read JSON answers loosely and assert their exact shape */
/**
 * The agent's HTTP API over a real loopback socket (startAgent in this
 * process, real store, process runtime), and enrollment against a small real
 * HTTP server that plays the coordinator's enroll route (the outermost
 * boundary).
 */
import { strict as assert } from "node:assert";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";
import type { RunningAgent } from "../../src/agent/agent.js";
import { AgentHarness, type Enroller } from "../helpers/agent.js";
import { newToken } from "../../src/core/tokens.js";

const harness = new AgentHarness("berth-http-");
after(() => harness.close());

async function call(
  url: string,
  path: string,
  opts: { method?: string; token?: string | null; body?: unknown; raw?: string } = {},
): Promise<{ status: number; json: any; text: string }> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (opts.token) headers.authorization = `Bearer ${opts.token}`;
  const res = await fetch(url + path, {
    method: opts.method ?? (opts.body !== undefined || opts.raw !== undefined ? "POST" : "GET"),
    headers,
    body: opts.raw ?? (opts.body !== undefined ? JSON.stringify(opts.body) : undefined),
  });
  const text = await res.text();
  let json: any = null;
  try {
    json = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, json, text };
}

describe("agent HTTP API", () => {
  const token = newToken("host-call", randomBytes);
  let agent: RunningAgent;
  before(async () => {
    agent = await harness.agent({ hostCallToken: token, name: "http-test", slots: 3 });
  });

  it("refuses every route without a token, with a wrong token, and with a token of another kind", async () => {
    for (const path of ["/v1/agent/health", "/v1/agent/machines", "/v1/agent/ops/op_1"]) {
      for (const t of [null, newToken("host-call", randomBytes), newToken("api", randomBytes), "garbage"]) {
        const r = await call(agent.url, path, { token: t });
        assert.equal(r.status, 401, `${path} with ${t === null ? "no" : "a wrong"} token`);
        assert.equal(r.json.error.code, "unauthorized");
        if (t !== null) assert.equal(r.text.includes(t), false, "the presented token is never echoed");
      }
    }
    const post = await call(agent.url, "/v1/agent/ops", { body: { opId: "op_x", kind: "provision", machineId: "m_x", generation: 0 } });
    assert.equal(post.status, 401);
    assert.deepEqual(agent.store.machines.list(), [], "an unauthenticated operation changed nothing");
  });

  it("refuses every call before enrollment, even one carrying a token", async () => {
    const a = await harness.agent();
    const r = await call(a.url, "/v1/agent/health", { token });
    assert.equal(r.status, 401);
    assert.equal(r.json.error.code, "unauthorized");
  });

  it("answers health with the agent's identity", async () => {
    const r = await call(agent.url, "/v1/agent/health", { token });
    assert.equal(r.status, 200);
    assert.deepEqual(
      { ...r.json, version: typeof r.json.version },
      { hostId: null, name: "http-test", runtime: "process", machines: 0, slots: 3, version: "string", mismatched: 0, unrecorded: 0, identity: null },
    );
  });

  it("refuses a bad id in a path or a body with 400 invalid_id", async () => {
    for (const path of ["/v1/agent/machines/bad.id", "/v1/agent/machines/" + "x".repeat(129), "/v1/agent/ops/a%20b"]) {
      const r = await call(agent.url, path, { token });
      assert.equal(r.status, 400, path);
      assert.equal(r.json.error.code, "invalid_id");
    }
    for (const body of [
      { opId: "../etc", kind: "provision", machineId: "m_1", generation: 0 },
      { opId: "op_1", kind: "provision", machineId: "m 1", generation: 0 },
      { opId: "op_2", kind: "remove_key", machineId: "m_1", generation: 0, args: { grantId: "g/1" } },
    ]) {
      const r = await call(agent.url, "/v1/agent/ops", { token, body });
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(r.json.error.code, "invalid_id");
    }
    assert.deepEqual(agent.store.machines.list(), []);
  });

  it("refuses a body over the limit with 413 body_too_large", async () => {
    const big = JSON.stringify({ opId: "op_big", kind: "provision", machineId: "m_big", generation: 0, args: { pad: "x".repeat(200_000) } });
    const r = await call(agent.url, "/v1/agent/ops", { token, raw: big });
    assert.equal(r.status, 413);
    assert.equal(r.json.error.code, "body_too_large");
    assert.equal(agent.store.operations.get("op_big"), null);
  });

  it("refuses malformed requests with 400 invalid_request, unknown routes 404, wrong methods 405", async () => {
    const bad = await call(agent.url, "/v1/agent/ops", { token, raw: "{not json" });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.code, "invalid_request");
    const kind = await call(agent.url, "/v1/agent/ops", { token, body: { opId: "op_k", kind: "reboot", machineId: "m_1", generation: 0 } });
    assert.equal(kind.status, 400);
    assert.equal(kind.json.error.code, "invalid_request");
    const gen = await call(agent.url, "/v1/agent/ops", { token, body: { opId: "op_g", kind: "provision", machineId: "m_1", generation: -1 } });
    assert.equal(gen.json.error.code, "invalid_request");
    const key = await call(agent.url, "/v1/agent/ops", {
      token,
      body: { opId: "op_pk", kind: "install_key", machineId: "m_1", generation: 0, args: { publicKey: "ssh-ed25519 AAAA", mode: "grant", grantId: "g_1", expiresAt: Date.now() + 1000 } },
    });
    assert.equal(key.json.error.code, "invalid_request");
    assert.equal((await call(agent.url, "/v1/agent/nothing", { token })).status, 404);
    assert.equal((await call(agent.url, "/v1/agent/health", { token, method: "DELETE" })).status, 405);
  });

  it("runs an operation, answers its retry with the first result, and shows the machine", async () => {
    const body = { opId: "op_create_h", kind: "provision", machineId: "m_h", generation: 0 };
    const first = await call(agent.url, "/v1/agent/ops", { token, body });
    assert.equal(first.status, 200, first.text);
    assert.equal(first.json.status, "done");
    assert.deepEqual((await call(agent.url, "/v1/agent/ops", { token, body })).json, first.json);
    const badArgs = await call(agent.url, "/v1/agent/ops", { token, body: { opId: "op_conf", kind: "provision", machineId: "m_h", generation: 0, args: "x" } });
    assert.equal(badArgs.status, 400);
    assert.equal(badArgs.json.error.code, "invalid_request");
    const op = await call(agent.url, "/v1/agent/ops/op_create_h", { token });
    assert.deepEqual(op.json, { ...first.json, error: null });
    const machines = await call(agent.url, "/v1/agent/machines", { token });
    assert.deepEqual(machines.json, {
      machines: [{ machineId: "m_h", state: "running", generation: 0, incarnation: first.json.result.incarnation, mismatch: null, keys: [], sessions: 0 }],
      unrecorded: [],
    });
    const one = await call(agent.url, "/v1/agent/machines/m_h", { token });
    assert.deepEqual(one.json, machines.json.machines[0]);
    assert.equal((await call(agent.url, "/v1/agent/machines/m_none", { token })).status, 404);
    const gm = await call(agent.url, "/v1/agent/ops", { token, body: { opId: "op_fence_old", kind: "fence", machineId: "m_h", generation: 0 } });
    assert.equal(gm.status, 200);
  });
});

describe("enrollment", () => {
  let enroller: Enroller;
  let coordinator: string;
  let enrollToken: string;
  /** Every request the enroll route saw, and the host-call tokens it issued. */
  const seen = () => enroller.requests;
  const issued = () => enroller.issued.map((e) => e.hostCallToken);
  const answer = (hostId: string) => (enroller.answer = () => ({ hostId, hostCallToken: newToken("host-call", randomBytes) }));

  before(async () => {
    enroller = await harness.enroller();
    answer("h_first");
    coordinator = enroller.url;
    enrollToken = enroller.token;
  });

  it("enrolls with the exact shape, keeps the host id across a restart, and accepts only the newest host-call token", async () => {
    const dir = harness.dir();
    let a = await harness.agent({ stateDir: dir, coordinatorUrl: coordinator, enrollToken, name: "enr", slots: 2, vcpu: 4, memoryMib: 4096, diskMib: 10240 });
    assert.equal(a.hostId, "h_first");
    const first = seen().at(-1)!;
    assert.equal(first.auth, `Bearer ${enrollToken}`);
    assert.deepEqual(first.body, {
      name: "enr",
      url: a.url,
      runtime: "process",
      runtimeDetail: {},
      capacity: { vcpu: 4, memoryMib: 4096, diskMib: 10240, slots: 2 },
      ssh: { host: "127.0.0.1", port: a.ssh.port, hostKey: a.ssh.hostKey, fingerprint: a.ssh.fingerprint },
    });
    assert.match(a.ssh.hostKey, /^ssh-ed25519 /);
    const t1 = issued().at(-1)!;
    assert.equal((await call(a.url, "/v1/agent/health", { token: t1 })).json.hostId, "h_first");
    assert.notEqual(a.store.meta.get("hostCallTokenHash"), null);
    assert.equal(JSON.stringify(a.store.db.prepare("SELECT * FROM meta").all()).includes(t1), false, "only the hash is stored");
    await a.stop();

    a = await harness.agent({ stateDir: dir, coordinatorUrl: coordinator, enrollToken, name: "enr" });
    assert.equal(seen().at(-1)!.body.name, "enr", "re-enrollment under the same name (the coordinator keeps that host)");
    assert.equal("hostId" in seen().at(-1)!.body, false, "the body keeps the coordinator's exact shape");
    assert.equal(a.hostId, "h_first");
    const t2 = issued().at(-1)!;
    assert.equal((await call(a.url, "/v1/agent/health", { token: t2 })).status, 200);
    assert.equal((await call(a.url, "/v1/agent/health", { token: t1 })).status, 401, "the previous token no longer works");
    await a.stop();

    // A coordinator that answers with another host id for this state directory is refused.
    answer("h_other");
    await assert.rejects(
      harness.agent({ stateDir: dir, coordinatorUrl: coordinator, enrollToken, name: "enr" }),
      /belongs to host h_first/,
    );
  });

  it("[I8] stops the start when the coordinator refuses the enroll token, without echoing it", async () => {
    const bad = newToken("enroll", randomBytes);
    await assert.rejects(
      harness.agent({ coordinatorUrl: coordinator, enrollToken: bad }),
      (e: Error) => {
        assert.match(e.message, /refused the enrollment \(401 unauthorized\)/);
        assert.equal(e.message.includes(bad), false);
        return true;
      },
    );
  });
});
