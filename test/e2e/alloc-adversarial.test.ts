/**
 * Allocations under adversarial timing, with real processes: `berth serve`
 * coordinators, a real `berth agent`, and between them a loopback proxy
 * (test/helpers/agent-proxy.ts) that holds, delays, drops or reorders chosen
 * agent calls the way a slow network does. Each test is a promise of
 * docs/allocations.md attacked at the point where arrival order decides; the
 * last one rewrites the agent's answers (the coordinator↔agent contract).
 */
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { AllocRig } from "../helpers/alloc-rig.js";
import { startAgentProxy, type AgentProxy } from "../helpers/agent-proxy.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { ApiError } from "../../src/client/http.js";

const key = generateSshKeyPair("adversarial-test");

describe("allocations under adversarial timing (real coordinator and agent, a proxy between)", { timeout: 300_000 }, () => {
  const rig = new AllocRig("sqlite");
  let proxy: AgentProxy;
  before(async () => {
    await rig.start();
    proxy = await startAgentProxy();
    await rig.routeAgentThrough(proxy);
  });
  after(async () => {
    await proxy?.close();
    await rig.close();
  });
  const holdsOf = async (id: string) => (await rig.holds()).filter((h) => h.allocationId === id).map((h) => [h.generation, h.state]);

  test("a late hold from a dead actor (generation 1 arriving after the replacement observed) is refused; generation 2 launches; release ends released", async () => {
    const before = await rig.ownerUse();
    proxy.rule({ match: (c) => c.opId === "a-T1-h1", action: { kind: "hold" }, times: 1 });
    proxy.rule({ match: (c) => c.opId === "a-T1-h2", action: { kind: "hold" }, times: 1 });
    const a = await rig.coordinator();
    await rig.api(a).call("POST", "/v1/allocations", { id: "T1", size: "small", publicKey: key.publicKey });
    const h1 = await proxy.held((c) => c.opId === "a-T1-h1");
    await a.kill("SIGKILL");
    // The replacement finds the actor lapsed and no hold on the agent: generation 2.
    const b = await rig.coordinator();
    const h2 = await proxy.held((c) => c.opId === "a-T1-h2");
    // The dead actor's hold reaches the agent first, then the replacement's.
    const late = await h1.release();
    const won = await h2.release();
    await rig.waitState("T1", "ready", 20_000);
    assert.equal(late.status, 409, `the late generation-1 hold is refused: ${JSON.stringify(late.body)}`);
    assert.equal(won.status, 200, `generation 2 holds: ${JSON.stringify(won.body)}`);
    assert.deepEqual(await holdsOf("T1"), [[2, "held"]], "exactly one hold, the replacement's");
    assert.equal((await rig.actor("T1"))?.generation, 2);
    await rig.api(b).call("POST", "/v1/allocations/T1/release", {});
    await rig.waitState("T1", "released", 20_000);
    assert.deepEqual(await rig.ownerUse(), before, "budget back, once");
    assert.deepEqual(await holdsOf("T1"), [[2, "released"]]);
    await b.kill();
  });

  test("a host withdrawn while its launch is in flight never launches there: the agent refuses the launch decided under the older standing", async () => {
    proxy.rule({ match: (c) => c.opId === "a-W2-l1", action: { kind: "hold" }, times: 1 });
    const a = await rig.coordinator();
    const api = rig.api(a);
    try {
      const before = await rig.ownerUse();
      await api.call("POST", "/v1/allocations", { id: "W2", size: "small", publicKey: key.publicKey });
      const launch = await proxy.held((c) => c.opId === "a-W2-l1");
      const w = await api.call<{ standing: string }>("POST", `/v1/hosts/${rig.hostId}/standing`, { standing: "withdrawn" });
      assert.equal(w.standing, "withdrawn", "acknowledged by the agent before it is reported");
      const late = await launch.release();
      await rig.waitState("W2", "released", 20_000);
      assert.equal(late.status, 409, `the launch is refused: ${JSON.stringify(late.body)}`);
      assert.match(JSON.stringify(late.body), /host_withdrawn/);
      const machine = await rig.agentGet("/v1/agent/machines/a-W2");
      assert.ok(machine.status === 404 || (machine.body as { state?: string }).state === "destroyed", `the sandbox never ran: ${JSON.stringify(machine.body)}`);
      assert.deepEqual(await holdsOf("W2"), [[1, "released"]]);
      assert.deepEqual(await rig.ownerUse(), before, "budget back");
    } finally {
      await api.call("POST", `/v1/hosts/${rig.hostId}/standing`, { standing: "ready" });
      await a.kill();
    }
  });

  test("a withdrawal the agent has not acknowledged is reported withdrawing, and becomes withdrawn once the retried push is acknowledged", async () => {
    proxy.rule({ match: (c) => c.path === "/v1/agent/standing", action: { kind: "drop" } });
    const a = await rig.coordinator();
    const api = rig.api(a);
    const reported = async () => (await api.call<{ hosts: { hostId: string; reported: string }[] }>("GET", "/v1/host-accounts")).hosts.find((h) => h.hostId === rig.hostId)?.reported;
    try {
      const w = await api.call<{ standing: string; requested: string }>("POST", `/v1/hosts/${rig.hostId}/standing`, { standing: "withdrawn" });
      assert.deepEqual([w.requested, w.standing], ["withdrawn", "withdrawing"]);
      assert.equal(await reported(), "withdrawing");
      const plan = await api.call<{ verdicts: { fits: boolean }[] }>("POST", "/v1/allocations/plan", { size: "small" });
      assert.ok(JSON.stringify(plan).includes("withdrawn"), `no placement on a withdrawing host: ${JSON.stringify(plan)}`);
      proxy.clearRules();
      const deadline = Date.now() + 20_000;
      while ((await reported()) !== "withdrawn") {
        assert.ok(Date.now() < deadline, "the push is retried until the agent acknowledges");
        await new Promise((r) => setTimeout(r, 200));
      }
    } finally {
      proxy.clearRules();
      await api.call("POST", `/v1/hosts/${rig.hostId}/standing`, { standing: "ready" });
      await a.kill();
    }
  });

  test("an unrecorded directory at a volume's path is never adopted: moved aside into the quarantine area, the volume made fresh", async () => {
    const stale = join(rig.agentDir, "volumes", "Z9");
    mkdirSync(join(stale, "data"), { recursive: true });
    writeFileSync(join(stale, "data", "stale.txt"), "left by someone else\n");
    writeFileSync(join(stale, "marker"), "Z9 junk\n");
    const a = await rig.coordinator();
    try {
      await rig.api(a).call("POST", "/v1/allocations", { id: "Z9", size: "small", publicKey: key.publicKey });
      await rig.waitState("Z9", "ready", 20_000);
      assert.deepEqual(readdirSync(join(stale, "data")), [], "the workspace starts empty: nothing of the unrecorded directory is inside");
      const aside = readdirSync(join(rig.agentDir, "volumes-quarantine")).filter((n) => n.startsWith("Z9-"));
      assert.equal(aside.length, 1, "moved aside, not deleted");
      assert.equal(readFileSync(join(rig.agentDir, "volumes-quarantine", aside[0]!, "data", "stale.txt"), "utf8"), "left by someone else\n");
      const check = await rig.api(a).call<{ ok: boolean }>("POST", "/v1/volumes/Z9/verify", {});
      assert.equal(check.ok, true);
      await rig.api(a).call("POST", "/v1/allocations/Z9/release", {});
      await rig.waitState("Z9", "released", 20_000);
    } finally {
      await a.kill();
    }
  });

  // model/allocation.pml ARM_RESOLVE (MUTANT_LATE_WIPE): a release delayed in flight reaches the agent after an operator's resolve kept the volume.
  test("a cleanup release delayed past an operator's resolve --keep-volume leaves the kept volume kept (the first release to end decides the volume)", async () => {
    // The first cleanup attempt's release is held in flight; its coordinator dies; the next one's attempts are lost (five unknown outcomes: quarantined).
    proxy.rule({ match: (c) => c.opId === "a-Q1-r", action: { kind: "hold" }, times: 1 });
    proxy.rule({ match: (c) => c.opId === "a-Q1-r", action: { kind: "drop" } });
    const a = await rig.coordinator();
    let b: Awaited<ReturnType<typeof rig.coordinator>> | null = null;
    try {
      const before = await rig.ownerUse();
      await rig.api(a).call("POST", "/v1/allocations", { id: "Q1", size: "small", publicKey: key.publicKey });
      await rig.waitState("Q1", "ready", 20_000);
      const file = join(rig.agentDir, "volumes", "Q1", "data", "kept.txt");
      writeFileSync(file, "the operator keeps this\n");
      await rig.api(a).call("POST", "/v1/allocations/Q1/release", {});
      const late = await proxy.held((c) => c.opId === "a-Q1-r");
      await a.kill("SIGKILL");
      b = await rig.coordinator();
      await rig.waitState("Q1", "quarantined", 60_000);
      const resolved = await rig.api(b).call<{ state: string }>("POST", "/v1/allocations/Q1/resolve", { volume: "keep" });
      assert.equal(resolved.state, "quarantined", "resolution under way");
      await rig.waitState("Q1", "released", 30_000);
      assert.match((await rig.allocation("Q1")).reason ?? "", /volume kept/);
      assert.deepEqual(await rig.ownerUse(), before, "budget back once the resolve's release was proven");
      // Now the first attempt's release arrives (another operation id, keepVolume false).
      const answer = await late.release();
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      assert.match(JSON.stringify(answer.body), /"volume":"kept"/, `the late release leaves the volume as the resolve left it: ${JSON.stringify(answer.body)}`);
      assert.equal(readFileSync(file, "utf8"), "the operator keeps this\n", "the kept volume's data is still there");
      assert.deepEqual(await rig.ownerUse(), before, "nothing charged or returned twice");
    } finally {
      proxy.clearRules();
      await a.kill();
      await b?.kill();
    }
  });

  // model/allocation.pml ARM_HOSTGONE (MUTANT_GONE_UNATTESTED): an acknowledged withdrawal is not the operator's word that the host is gone.
  test("resolve --host-gone is refused on a host withdrawn by its live agent; the cleanup goes on and returns the budget only when proven", async () => {
    const a = await rig.coordinator();
    const api = rig.api(a);
    try {
      const before = await rig.ownerUse();
      await api.call("POST", "/v1/allocations", { id: "G3", size: "small", publicKey: key.publicKey });
      await rig.waitState("G3", "ready", 20_000);
      const charged = await rig.ownerUse();
      const w = await api.call<{ standing: string }>("POST", `/v1/hosts/${rig.hostId}/standing`, { standing: "withdrawn" });
      assert.equal(w.standing, "withdrawn", "acknowledged by the live agent");
      proxy.rule({ match: (c) => c.opId === "a-G3-r", action: { kind: "hold" }, times: 1 });
      await api.call("POST", "/v1/allocations/G3/release", {});
      const release = await proxy.held((c) => c.opId === "a-G3-r");
      const err: unknown = await api.send("POST /v1/allocations/{id}/resolve", { id: "G3" }, { volume: "host_gone" }).then(() => null, (e: unknown) => e);
      assert.ok(err instanceof ApiError, `resolve --host-gone on a live agent's host is refused (it answered ${JSON.stringify(await rig.allocation("G3"))})`);
      assert.equal(err.code, "conflict");
      assert.match(err.message, /not attested gone/);
      assert.equal((await rig.allocation("G3")).state, "releasing");
      assert.deepEqual(await rig.ownerUse(), charged, "slot and budget stay charged while the sandbox may still run");
      const machine = await rig.agentGet("/v1/agent/machines/a-G3");
      assert.equal((machine.body as { state?: string }).state, "running", `the sandbox still runs: ${JSON.stringify(machine.body)}`);
      await release.release();
      await rig.waitState("G3", "released", 20_000);
      assert.deepEqual(await rig.ownerUse(), before, "budget back once the cleanup was proven");
    } finally {
      proxy.clearRules();
      await api.call("POST", `/v1/hosts/${rig.hostId}/standing`, { standing: "ready" });
      await a.kill();
    }
  });

  // The coordinator ↔ agent contract (src/protocol/agent-api.ts, operations.ts): the proxy lets the agent act, then rewrites its answer.
  test("an agent answer off the contract is never taken: a launch result is asked again under the same op id; a volume answer is invalid_agent_reply naming the field", async () => {
    proxy.rule({ match: (x) => x.opId === "a-R1-l1", action: { kind: "rewrite", body: () => ({ status: "done", result: { allocationId: "R1", machineId: 5 } }) }, times: 1 });
    const a = await rig.coordinator();
    const api = rig.api(a);
    try {
      await api.send("POST /v1/allocations", {}, { id: "R1", size: "small", publicKey: key.publicKey });
      await rig.waitState("R1", "ready", 30_000);
      const launches = proxy.seen.filter((x) => x.kind === "alloc_launch" && x.opId?.startsWith("a-R1-"));
      assert.ok(launches.length >= 2, `the rewritten answer was not taken: asked ${launches.length} time(s)`);
      assert.deepEqual([...new Set(launches.map((x) => x.opId))], ["a-R1-l1"], "asked again under the same operation id");
      assert.equal((await api.send("GET /v1/allocations/{id}", { id: "R1" })).launch?.machineId, "a-R1", "the recorded launch is the agent's own");

      assert.equal((await api.send("GET /v1/volumes/{allocation}", { allocation: "R1" })).allocationId, "R1", "the agent's own answer passes");
      proxy.rule({ match: (x) => x.method === "GET" && x.path === "/v1/agent/volumes/R1", action: { kind: "rewrite", body: (v) => ({ ...(v as object), allocationId: 7 }) }, times: 1 });
      const err: unknown = await api.send("GET /v1/volumes/{allocation}", { allocation: "R1" }).then(() => null, (e: unknown) => e);
      assert.ok(err instanceof ApiError, `refused: ${String(err)}`);
      assert.equal(err.code, "invalid_agent_reply");
      assert.equal(err.status, 502);
      assert.match(err.message, /GET \/v1\/agent\/volumes\/\{allocation\}.*field allocationId/);
      await api.send("POST /v1/allocations/{id}/release", { id: "R1" }, {});
      await rig.waitState("R1", "released", 30_000);
    } finally {
      proxy.clearRules();
      await a.kill();
    }
  });
});
