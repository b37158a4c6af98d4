/**
 * Machine networks on a real agent (startAgent in this process), real
 * network namespaces, veth pairs and nftables tables, and a target server in
 * a test namespace (test/helpers/netns-target.ts): nothing leaves this
 * machine. Needs root, `ip` and `nft`; skipped with the reason otherwise.
 */
import { strict as assert } from "node:assert";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";
import type { RunningAgent } from "../../src/agent/agent.js";
import { MachineNetworks } from "../../src/agent/network/manager.js";
import { networkAvailability } from "../../src/agent/network/host.js";
import { gvisorAvailability } from "../../src/agent/runtime/index.js";
import { makePolicy, policyFingerprint, type NetworkPolicy } from "../../src/core/network-policy.js";
import type { ReadinessEvidence } from "../../src/core/network-evidence.js";
import type { RuntimeKind } from "../../src/agent/runtime/types.js";
import { AgentHarness } from "../helpers/agent.js";
import { startNetnsTarget, type NetnsTarget } from "../helpers/netns-target.js";

const avail = networkAvailability();
const skip = avail.ok ? false : `network policies unavailable here: ${avail.why}`;
const harness = new AgentHarness("berth-net-");
let target: NetnsTarget;
const agents: Array<RunningAgent & { network: MachineNetworks }> = [];

function id(prefix: string): string {
  return `${prefix}_${randomBytes(6).toString("hex")}`;
}

async function agentFor(runtime: RuntimeKind): Promise<RunningAgent & { network: MachineNetworks }> {
  const a = await harness.agent({
    runtime,
    network: {
      resolve: (n) => target.resolve(n),
      probe: { deny: [{ host: target.ip, port: target.deniedPort, why: "test server outside the policy" }], refusedResolvers: [target.ip] },
    },
  });
  assert.ok(a.network instanceof MachineNetworks, "the agent has machine networks");
  agents.push(a as RunningAgent & { network: MachineNetworks });
  return a as RunningAgent & { network: MachineNetworks };
}

function evidenceOf(result: unknown): ReadinessEvidence {
  const e = (result as { network?: ReadinessEvidence }).network;
  assert.ok(e, "the result carries readiness evidence");
  return e;
}

function check(e: ReadinessEvidence, kind: string, target: string) {
  const c = e.checks.find((x) => x.kind === kind && x.target === target);
  assert.ok(c, `a ${kind} check of ${target} in ${JSON.stringify(e.checks)}`);
  return c;
}

describe("machine networks", { skip }, () => {
  before(async () => {
    target = await startNetnsTarget();
  });
  after(async () => {
    // Whatever a failed test left: every machine destroyed, every network removed.
    for (const a of agents) {
      for (const m of a.store.machines.list()) await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m.id, generation: m.generation }).catch(() => undefined);
      await a.network.sweep(() => false).catch(() => undefined);
    }
    await harness.close();
    await target?.close();
  });

  for (const runtime of ["process", "gvisor"] as const) {
    const rtSkip = runtime === "gvisor" && !gvisorAvailability().ok ? "gvisor unavailable" : false;
    it(`${runtime}: egress policy enforced from inside, evidence per generation, removed in order on destroy`, { skip: rtSkip }, async () => {
      const a = await agentFor(runtime);
      const policy: NetworkPolicy = makePolicy("egress", [`${target.ip}:${target.allowedPort}`, `target.test:${target.allowedPort}`]);
      const m = id("m");
      const prov = await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 0, args: { network: policy } });
      const e0 = evidenceOf(prov.result);
      assert.equal(e0.result, "pass", JSON.stringify(e0.checks));
      assert.equal(e0.policyFingerprint, policyFingerprint(policy));
      assert.equal(e0.generation, 0);
      assert.equal(check(e0, "permit", `${target.ip}:${target.allowedPort}`).got, "open");
      const denied = check(e0, "deny", `${target.ip}:${target.deniedPort}`);
      assert.equal(denied.got, "refused", "a listening server outside the policy is refused (reset), not reached");
      assert.ok(denied.ms < 50, `refused within 50 ms (took ${denied.ms} ms)`);
      assert.match(check(e0, "deny", "169.254.169.254:80").got, /^(refused|unreachable)$/);
      const rec = a.network.get(m)!;
      const gw = a.network.addresses(rec.slot!).host;
      // The agent's API and gateway listen on loopback here, which no machine can route to: not probed.
      // The canary on every host address stands for the host, refused by the machine's own rule.
      assert.ok(!e0.checks.some((c) => c.target.endsWith(`:${new URL(a.url).port}`)), "a loopback listener is not probed");
      const canary = e0.checks.find((c) => c.kind === "deny" && c.target.startsWith(`${gw}:`) && /canary/.test(c.why));
      assert.ok(canary && canary.ok, JSON.stringify(e0.checks));
      assert.match(canary.witness ?? "", /^refuse counter \+[1-9]/);
      assert.match(check(e0, "dns-refused", `${target.ip}:53`).got, /^(refused|unreachable)$/, "a resolver outside the policy is refused");
      assert.equal(check(e0, "pinned", "target.test").got, `resolved:${target.ip}`, "the name is pinned in the machine's hosts file");
      // Exact identity recorded before readiness.
      assert.equal(rec.state, "up");
      assert.ok(rec.netnsInode && rec.hostIfindex && rec.nftHandle);

      // After a return (scrub at generation 3): rules reloaded, evidence bound to that generation.
      const scrub = await a.ops.run({ opId: id("op"), kind: "scrub", machineId: m, generation: 3 });
      const e3 = evidenceOf(scrub.result);
      assert.equal(e3.result, "pass", JSON.stringify(e3.checks));
      assert.equal(e3.generation, 3);

      // Destroy removes veth, table and namespace.
      const inv = await a.network.inventory();
      assert.ok(inv.netns.includes(rec.netns) && inv.links.includes(rec.hostIf) && inv.tables.includes(rec.table));
      await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 3 });
      const gone = await a.network.inventory();
      assert.deepEqual(gone, { netns: [], links: [], tables: [] });
      assert.equal(a.network.get(m), null);
    });
  }

  it("DNS as the policy says: an allowed resolver answers from inside", async () => {
    const a = await agentFor("process");
    const policy = makePolicy("egress", [`${target.ip}:${target.allowedPort}`], [target.ip]);
    const m = id("m");
    const prov = await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 0, args: { network: policy } });
    const e = evidenceOf(prov.result);
    assert.equal(e.result, "pass", JSON.stringify(e.checks));
    assert.equal(check(e, "dns-answer", `${target.ip}:53`).got, "answered");
    await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 0 });
  });

  it("a probe that cannot reach its permit target fails (evidence fail, not an error)", async () => {
    const a = await agentFor("process");
    // Allowed by policy, but nothing listens there: the permit check fails.
    const policy = makePolicy("egress", [`${target.ip}:7777`]);
    const m = id("m");
    const prov = await a.ops.run({ opId: id("op"), kind: "provision", machineId: m, generation: 0, args: { network: policy } });
    const e = evidenceOf(prov.result);
    assert.equal(e.result, "fail");
    assert.equal(check(e, "permit", `${target.ip}:7777`).ok, false);
    assert.equal(a.network.counters.probes.fail, 1);
    await a.ops.run({ opId: id("op"), kind: "destroy", machineId: m, generation: 0 });
  });
});
