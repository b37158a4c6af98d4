/**
 * Readiness evidence that is true when a machine is lent (issue items 1-4,
 * agent side), on both runtimes, against real network namespaces, veth
 * pairs and nftables tables, with targets in a namespace of the test's own
 * (test/helpers/netns-target.ts): nothing leaves this machine.
 *
 *   - rules deleted while the machine waits: the lend-time check refuses and
 *     retires it (keys dropped, only destroy accepted); a return (scrub)
 *     does not silently load them again;
 *   - a rule inserted during a lend: the return reports what changed
 *     (network_tampered, the diff) and the machine is retired;
 *   - a probe cannot pass when the rules are not in force: the agent's API
 *     listens on a host address that is not the machine's gateway, and an
 *     `accept` put in front of the rules opens it — the evidence fails;
 *   - a restart after a table was deleted: recovery reports a mismatch,
 *     never a reattached machine;
 *   - `0.0.0.0/0` means every public address: provisioned, private
 *     ranges still refused.
 * Needs root, `ip` and `nft` (skipped with the reason otherwise); every
 * namespace and table the test makes is removed in `after`, failed or not.
 */
import { strict as assert } from "node:assert";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";
import type { RunningAgent } from "../../src/agent/agent.js";
import { MachineNetworks } from "../../src/agent/network/manager.js";
import { holdNextCommand, networkAvailability } from "../../src/agent/network/host.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { makePolicy } from "../../src/core/network-policy.js";
import type { ReadinessEvidence } from "../../src/core/network-evidence.js";
import type { RuntimeKind } from "../../src/agent/runtime/types.js";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { AgentHarness } from "../helpers/agent.js";
import { startNetnsTarget, type NetnsTarget } from "../helpers/netns-target.js";

const avail = networkAvailability();
const skip = avail.ok ? false : `network policies unavailable here: ${avail.why}`;
const harness = new AgentHarness("berth-netev-");
let target: NetnsTarget;
type NetAgent = RunningAgent & { network: MachineNetworks };
const agents: NetAgent[] = [];
const stateDirs = new Map<NetAgent, string>();

function id(prefix: string): string {
  return `${prefix}_${randomBytes(6).toString("hex")}`;
}

function nft(...args: string[]): string {
  return execFileSync("nft", args, { encoding: "utf8" });
}

async function agentFor(runtime: RuntimeKind, stateDir = harness.dir()): Promise<NetAgent> {
  const a = await harness.agent({
    runtime,
    stateDir,
    // The API listens on a real host address that is not any machine's gateway.
    listen: `${target.hostIp}:0`,
    networkCheck: { intervalMs: 0 },
    network: {
      resolve: (n) => target.resolve(n),
      probe: { deny: [{ host: target.ip, port: target.deniedPort, why: "test server outside the policy" }] },
    },
  });
  assert.ok(a.network instanceof MachineNetworks, "the agent has machine networks");
  agents.push(a as NetAgent);
  stateDirs.set(a as NetAgent, stateDir);
  return a as NetAgent;
}

function evidenceOf(result: unknown): ReadinessEvidence {
  const e = (result as { network?: ReadinessEvidence }).network;
  assert.ok(e, "the result carries readiness evidence");
  return e;
}

async function provision(a: NetAgent, allow = [`${target.ip}:${target.allowedPort}`]): Promise<string> {
  const m = id("m");
  const prov = await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 0, args: { network: makePolicy("egress", allow) } });
  const e = evidenceOf(prov.result);
  assert.equal(e.result, "pass", JSON.stringify(e.checks));
  return m;
}

async function installKeeperKey(a: NetAgent, m: string): Promise<void> {
  const key = generateSshKeyPair();
  await a.ops.run({ opId: id("op"), kind: "install_key", machineId: m, generation: 0, args: { publicKey: key.publicKey, mode: "keeper", grantId: "keeper-test", expiresAt: null } });
  assert.equal(a.keys.list(m).length, 1);
}

describe("readiness evidence bound to the rules in force", { skip }, () => {
  before(async () => {
    target = await startNetnsTarget();
  });
  after(async () => {
    for (const a of agents) {
      for (const m of a.store.machines.list()) await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m.id, generation: m.generation }).catch(() => undefined);
      await a.network.sweep(() => false).catch(() => undefined);
    }
    await harness.close();
    await target?.close();
  });

  for (const runtime of ["process", "gvisor"] as const) {
    const rtSkip = runtime === "gvisor" && !gvisorAvailability().ok ? "gvisor unavailable" : false;

    it(`${runtime}: a table deleted while the machine waits is found by the lend-time check; the machine is retired, never lent, destroyable`, { skip: rtSkip }, async () => {
      const a = await agentFor(runtime);
      const m = await provision(a);
      await installKeeperKey(a, m);
      const ok = await a.guard!.lendCheck(m);
      assert.equal(ok.ok, true, JSON.stringify(ok));
      const rec = a.network.get(m)!;
      nft("delete", "table", "inet", rec.table);
      const c = await a.guard!.lendCheck(m);
      assert.equal(c.ok, false, "a deleted table is never lent");
      assert.match((c as { why: string }).why, /table .* is gone/);
      const after = a.store.machines.get(m)!;
      assert.equal(after.state, "mismatch");
      assert.match(after.mismatch ?? "", /^network: /);
      assert.deepEqual(a.keys.list(m), [], "no key of a retired machine authenticates");
      await assert.rejects(a.ops.run({ opId: id("op"), kind: "scrub", machineId: m, generation: 1 }), /does not match its record/, "no return repairs it");
      await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 1 });
      assert.deepEqual(await a.network.inventory(), { netns: [], links: [], tables: [] });
    });

    it(`${runtime}: a table deleted before a return: the return fails with network_tampered instead of loading the rules again`, { skip: rtSkip }, async () => {
      const a = await agentFor(runtime);
      const m = await provision(a);
      nft("delete", "table", "inet", a.network.get(m)!.table);
      await assert.rejects(a.ops.run({ opId: id("op"), kind: "scrub", machineId: m, generation: 2 }), (e: Error) => {
        assert.match(e.message, /network_tampered/);
        assert.match(e.message, /is gone/);
        return true;
      });
      assert.equal(a.store.machines.get(m)!.state, "mismatch", "retired, not repaired");
      assert.equal((await a.network.inventory()).tables.length, 0, "the rules were not silently loaded again");
      await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 2 });
    });

    it(`${runtime}: a rule inserted during a lend is recorded at the return (the diff) and the machine retired`, { skip: rtSkip }, async () => {
      const a = await agentFor(runtime);
      const m = await provision(a);
      const rec = a.network.get(m)!;
      nft("insert", "rule", "inet", rec.table, "machine_forward", "accept");
      await assert.rejects(a.ops.run({ opId: id("op"), kind: "scrub", machineId: m, generation: 1 }), (e: Error) => {
        assert.match(e.message, /network_tampered: the network rules of machine/);
        assert.match(e.message, /\+ rule .*machine_forward.*"accept"/, "the diff names the inserted rule");
        return true;
      });
      assert.equal(a.store.machines.get(m)!.state, "mismatch");
      // The inserted rule is still there: the evidence is kept, not repaired.
      assert.match(nft("list", "chain", "inet", rec.table, "machine_forward"), /^\s+accept$/m);
      await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 1 });
      assert.deepEqual(await a.network.inventory(), { netns: [], links: [], tables: [] });
    });

    it(`${runtime}: a probe cannot pass while the host is open to the machine (the agent listens on a host address, not the gateway)`, { skip: rtSkip }, async () => {
      const a = await agentFor(runtime);
      const m = await provision(a);
      const rec = a.network.get(m)!;
      const apiPort = Number(new URL(a.url).port);
      const e0 = a.network.get(m)!.evidence!;
      const api = e0.checks.find((c) => c.kind === "deny" && c.target === `${target.hostIp}:${apiPort}`);
      assert.ok(api, `the agent API is probed where it listens: ${JSON.stringify(e0.checks)}`);
      assert.match(api.witness ?? "", /^refuse counter \+[1-9]/, "refused by the machine's own rule");
      assert.ok(e0.checks.some((c) => c.kind === "deny" && /canary/.test(c.why) && c.ok), "the canary on the host is refused");
      // Everything the machine sends to the host is let in ahead of the rules.
      nft("insert", "rule", "inet", rec.table, "machine_input", "accept");
      const e1 = await a.network.probe(m, a.runtime, 0);
      assert.equal(e1.result, "fail", JSON.stringify(e1));
      assert.equal(a.network.get(m)!.evidence?.result, "fail", "the recorded evidence is the failed one");
      await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 0 });
    });

    it(`${runtime}: restart after a table was deleted: recovery reports a mismatch, not a reattached machine`, { skip: rtSkip }, async () => {
      const stateDir = harness.dir();
      const a = await agentFor(runtime, stateDir);
      const m = await provision(a);
      const table = a.network.get(m)!.table;
      await a.stop();
      agents.splice(agents.indexOf(a), 1);
      nft("delete", "table", "inet", table);
      const b = await agentFor(runtime, stateDir);
      assert.ok(!b.recovery.reattached.includes(m), JSON.stringify(b.recovery));
      const mm = b.recovery.mismatched.find((x) => x.machineId === m);
      assert.ok(mm, JSON.stringify(b.recovery));
      assert.match(mm.why, /^network: .*table .* is gone/);
      await b.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 0 });
      assert.deepEqual(await b.network.inventory(), { netns: [], links: [], tables: [] });
    });
  }

  it("process: a lend check completes while a sibling's re-probe is held starting a host command (the re-probe's nft/ip commands never hold the agent's event loop)", async () => {
    const a = await agentFor("process");
    const [m1, m2] = [await provision(a), await provision(a)];
    // The returned sibling's reload (`nft -f -`) is held where its spawn would wait for the child to exec.
    const state = new Int32Array(new SharedArrayBuffer(8));
    holdNextCommand({ file: "nft", args: ["-f", "-"], state, boundMs: 30_000 });
    const scrub = a.ops.run({ opId: id("op"), kind: "scrub", machineId: m2, generation: 1 });
    while (Atomics.load(state, 0) === 0) await new Promise((r) => setTimeout(r, 5));
    let answeredWhileHeld = 0;
    const check = await a.guard!.lendCheck(m1);
    if (Atomics.load(state, 0) === 1) answeredWhileHeld++;
    Atomics.store(state, 1, 1);
    Atomics.notify(state, 1);
    assert.equal(check.ok, true, JSON.stringify(check));
    assert.equal(evidenceOf((await scrub).result).result, "pass", "the held re-probe completes and passes");
    assert.equal(answeredWhileHeld, 1, "the lend check was answered while the sibling's re-probe was still held");
    for (const m of [m1, m2]) await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 1 });
  });

  it("process: 0.0.0.0/0 means every public address: provisioned, private ranges still refused", async () => {
    const a = await agentFor("process");
    const m = id("m");
    const prov = await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 0, args: { network: makePolicy("egress", ["0.0.0.0/0"]) } });
    const e = evidenceOf(prov.result);
    assert.equal(e.result, "pass", JSON.stringify(e));
    const priv = e.checks.find((c) => c.kind === "deny" && c.target === `${target.ip}:${target.deniedPort}`);
    assert.ok(priv && priv.ok && priv.got === "refused", "a private address is still refused under 0.0.0.0/0");
    await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 0 });
  });
});
