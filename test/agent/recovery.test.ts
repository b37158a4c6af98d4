/* eslint-disable @typescript-eslint/no-explicit-any -- the tests read JSON answers loosely and assert their exact shape */
/**
 * Crash recovery with real processes: a real `bin/berth agent` (process
 * runtime) enrolled with a small real HTTP server that plays the
 * coordinator's enroll route, SIGKILLed with machines, keys and machine
 * processes live, then started again on the same state directory.
 */
import { strict as assert } from "node:assert";
import { randomBytes } from "node:crypto";
import type { ChildProcess } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import Database from "better-sqlite3";
import { argsHashOf } from "../../src/protocol/operations.js";
import { AgentStore } from "../../src/agent/store/store.js";
import { ProcessRuntime } from "../../src/agent/runtime/process.js";
import type { ExecHandle } from "../../src/agent/runtime/types.js";
import { newToken } from "../../src/core/tokens.js";
import { AgentHarness, sshKey, type Enroller } from "../helpers/agent.js";

const harness = new AgentHarness("berth-recovery-");
const strays: ExecHandle[] = [];
after(async () => {
  for (const s of strays) {
    await s.signalGroup("SIGKILL").catch(() => false);
    s.killClient("SIGKILL");
  }
  await harness.close();
});

function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) [ZX]/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

interface Agent {
  child: ChildProcess;
  url: string;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

async function startAgentProcess(stateDir: string, coordinator: string, tokenFile: string): Promise<Agent> {
  const p = harness.spawnAgent({ stateDir, coordinator, enrollTokenFile: tokenFile, name: "rec-host", logLevel: "info" });
  return { child: p.child, url: (await p.ready).url, exit: p.exit };
}

describe("agent crash recovery", () => {
  let enroller: Enroller;
  let coordinator: string;
  let enrollToken: string;
  /** Successful enrollments: the body sent and the host-call token answered. */
  const enrollments = () => enroller.issued.map((e) => ({ body: e.body, token: e.hostCallToken }));

  before(async () => {
    enroller = await harness.enroller();
    // Like the coordinator: one host per name.
    enroller.answer = (body) => ({ hostId: body.name === "rec-host" ? "h_rec" : "h_unexpected", hostCallToken: newToken("host-call", randomBytes) });
    coordinator = enroller.url;
    enrollToken = enroller.token;
  });

  async function call(agent: Agent, path: string, body?: unknown): Promise<{ status: number; json: any }> {
    const token = enrollments().at(-1)!.token;
    const res = await fetch(agent.url + path, {
      method: body === undefined ? "GET" : "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.status, json: await res.json() };
  }

  it("[I9] after SIGKILL: a retried op returns its first result, a matching machine is re-attached, a mismatched one is never signalled", async () => {
    const root = harness.dir();
    const stateDir = join(root, "state");
    const tokenFile = join(root, "enroll-token");
    writeFileSync(tokenFile, enrollToken + "\n", { mode: 0o600 });

    // --- first life -------------------------------------------------------
    let agent = await startAgentProcess(stateDir, coordinator, tokenFile);
    assert.equal(enrollments().length, 1);
    const live = sshKey();
    const short = sshKey();
    const createM1 = { opId: "op_c1", kind: "provision", machineId: "m_kept", generation: 1 };
    const installLive = {
      opId: "op_i1", kind: "install_key", machineId: "m_kept", generation: 1,
      args: { publicKey: live.line, mode: "grant", grantId: "grant_live", expiresAt: Date.now() + 600_000 },
    };
    // Its expiry is set when it is installed (below), so a slow first life cannot make it expired already.
    let shortExpiry = 0;
    const installShort = () => ({
      opId: "op_i2", kind: "install_key", machineId: "m_kept", generation: 1,
      args: { publicKey: short.line, mode: "keeper", grantId: "keeper_short", expiresAt: (shortExpiry = Date.now() + 1500) },
    });
    const createM2 = { opId: "op_c2", kind: "provision", machineId: "m_forged", generation: 1 };
    const c1 = await call(agent, "/v1/agent/ops", createM1);
    assert.equal(c1.status, 200, JSON.stringify(c1.json));
    const i1 = await call(agent, "/v1/agent/ops", installLive);
    assert.equal(i1.status, 200, JSON.stringify(i1.json));
    assert.equal((await call(agent, "/v1/agent/ops", installShort())).status, 200);
    assert.equal((await call(agent, "/v1/agent/ops", createM2)).status, 200);

    agent.child.kill("SIGKILL");
    assert.equal((await agent.exit).signal, "SIGKILL");

    // --- while no agent runs ----------------------------------------------
    // A process in each machine (started through the same runtime code).
    const runtime = new ProcessRuntime({ stateDir });
    const inKept = await runtime.exec("m_kept", { argv: ["sleep", "1000"], env: {} });
    const inForged = await runtime.exec("m_forged", { argv: ["sleep", "1000"], env: {} });
    strays.push(inKept, inForged);
    // The agent's record of m_forged no longer matches what the runtime has
    // there (something else now occupies that machine id).
    const db = new Database(join(stateDir, "agent.db"));
    db.prepare("UPDATE machines SET incarnation = 'inc_not_this_one' WHERE id = 'm_forged'").run();
    db.close();
    // The short key's expiry passes while no agent runs.
    while (Date.now() <= shortExpiry) await new Promise((r) => setTimeout(r, 100));

    // --- second life ------------------------------------------------------
    agent = await startAgentProcess(stateDir, coordinator, tokenFile);
    assert.equal(enrollments().length, 2);
    assert.deepEqual(Object.keys(enrollments()[1]!.body).sort(), ["capacity", "name", "runtime", "runtimeDetail", "ssh", "url"]);
    assert.equal((await call(agent, "/v1/agent/health")).json.hostId, "h_rec", "the same host after the restart");

    // The retried operations answer with their first results, acting on nothing.
    assert.deepEqual(await call(agent, "/v1/agent/ops", createM1), c1);
    assert.deepEqual(await call(agent, "/v1/agent/ops", installLive), i1);

    const machines = (await call(agent, "/v1/agent/machines")).json;
    const kept = machines.machines.find((m: any) => m.machineId === "m_kept");
    const forged = machines.machines.find((m: any) => m.machineId === "m_forged");
    assert.equal(kept.state, "running");
    assert.equal(kept.incarnation, c1.json.result.incarnation, "re-attached with its recorded incarnation");
    assert.deepEqual(kept.keys.map((k: any) => k.fingerprint), [live.fingerprint], "the key that expired meanwhile was dropped");
    assert.equal(forged.state, "mismatch");
    assert.match(forged.mismatch, /^incarnation: recorded inc_not_this_one/);
    assert.equal((await call(agent, "/v1/agent/health")).json.mismatched, 1);

    assert.ok(alive(inKept.leader.pid), "a re-attached machine's process is left alone");
    assert.ok(alive(inForged.leader.pid), "a mismatched machine's process is never signalled");
    for (const kind of ["fence", "destroy", "scrub"]) {
      const r = await call(agent, "/v1/agent/ops", { opId: `op_${kind}_forged`, kind, machineId: "m_forged", generation: 1 });
      assert.equal(r.status, 409, `${kind} of a mismatched machine is refused`);
      assert.equal(r.json.error.code, "conflict");
    }
    assert.ok(alive(inForged.leader.pid), "still never signalled after the refused operations");

    // The re-attached machine is fully usable: a fence finds the process a
    // previous agent life never knew about.
    const fence = await call(agent, "/v1/agent/ops", { opId: "op_f1", kind: "fence", machineId: "m_kept", generation: 1 });
    assert.equal(fence.status, 200, JSON.stringify(fence.json));
    assert.equal(fence.json.result.processesRemaining, 0);
    assert.equal(alive(inKept.leader.pid), false);

    agent.child.kill("SIGTERM");
    assert.equal((await agent.exit).code, 0);
  });
});

describe("agent recovery of an operation cut short", () => {
  it("[I9] a create whose process died after its intent record is left pending, and its retry (same opId) finishes it once", async () => {
    const stateDir = harness.dir();
    // What an agent leaves when it dies right after writing the create's
    // intent and the runtime created the machine, before recording the result.
    const store = AgentStore.open(stateDir);
    store.transaction(() => {
      store.operations.insert({ opId: "op_mid", kind: "provision", machineId: "m_mid", generation: 4, argsHash: argsHashOf("provision", undefined), now: Date.now() });
      store.machines.put({
        id: "m_mid", generation: 4, state: "creating", incarnation: null, workspace: null, identity: null,
        mismatch: null, createdAt: Date.now(), updatedAt: Date.now(),
      });
    });
    store.close();
    const made = await new ProcessRuntime({ stateDir }).create("m_mid");

    const agent = await harness.agent({ stateDir });
    try {
      assert.deepEqual(agent.recovery.pending, [{ machineId: "m_mid", ops: ["op_mid"] }]);
      assert.deepEqual(agent.recovery.mismatched, []);
      assert.deepEqual(agent.recovery.unrecorded, []);
      const done = await agent.ops.run({ opId: "op_mid", kind: "provision", machineId: "m_mid", generation: 4 });
      assert.equal((done.result as { incarnation: string }).incarnation, made.incarnation, "the runtime's machine, not a second one");
      assert.equal(agent.store.machines.get("m_mid")?.state, "running");
      assert.deepEqual(await agent.runtime.list(), ["m_mid"]);
      assert.deepEqual(await agent.ops.run({ opId: "op_mid", kind: "provision", machineId: "m_mid", generation: 4 }), done);
    } finally {
      await agent.stop();
    }
  });
});
