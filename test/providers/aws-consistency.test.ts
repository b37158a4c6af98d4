/**
 * The aws provider against what AWS really answers, as the emulator models
 * it: eventual consistency (a new instance not listed yet, an invocation not
 * visible right after SendCommand), SSM's real statuses (Delayed, TimedOut,
 * Cancelling), a reboot whose old boot goes on answering, list calls in
 * sparse pages, IdempotentParameterMismatch, and a spot interruption. Each
 * operation is run as the executor runs it: again with the same op id while
 * it is ambiguous.
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { CancelCommandCommand } from "@aws-sdk/client-ssm";
import { RunInstancesCommand } from "@aws-sdk/client-ec2";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { parseGuestOutput } from "../../src/providers/aws/guest.js";
import { commentFor } from "../../src/providers/aws/ssm.js";
import type { OperationOutcome } from "../../src/providers/provider.js";
import { awsWorld, done, guestKeys, machine, op, untilSettled, type AwsWorld } from "../helpers/aws.js";
import { grantArgs, ssh } from "./contract.js";

const REGION = "eu-west-1";

async function provisioned(w: AwsWorld, id: string) {
  const m = machine(id);
  const r = done((await untilSettled(w.provider, op("provision", m, 0))).outcome);
  return { m, instanceId: String(r.instanceId), target: { host: String(r.sshHost), port: Number(r.sshPort), user: m.id, hostKey: String(r.hostKey) }, boot: String(r.incarnation) };
}

function invocationsFor(w: AwsWorld, opId: string, step: string) {
  return [...w.emu.invocations.values()].filter((i) => i.comment === commentFor(opId, step as never));
}

function count(w: AwsWorld, action: string): number {
  return w.emu.calls.filter((c) => c === action).length;
}

function ambiguous(o: OperationOutcome, what: string): string {
  assert.equal(o.kind, "ambiguous", `${what}: expected ambiguous, got ${JSON.stringify(o)}`);
  return (o as { error: string }).error;
}

/** As untilSettled, with a pause between attempts (an ambiguous answer here can come back at once, and the lag is in wall time). */
async function settled(p: AwsWorld["provider"], req: ReturnType<typeof op>): Promise<OperationOutcome> {
  for (let i = 0; ; i++) {
    const o = await p.run(req);
    if (o.kind !== "ambiguous" || i >= 100) return o;
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function until(what: string, ok: () => boolean): Promise<void> {
  for (let i = 0; i < 400 && !ok(); i++) await new Promise((r) => setTimeout(r, 25));
  assert.ok(ok(), `timed out waiting for ${what}`);
}

describe("aws provider against AWS's consistency and statuses (emulator)", { timeout: 120_000 }, () => {
  test("DescribeInstances lag: a just-launched instance not listed yet is waited for in the same call, not relaunched", async () => {
    const w = await awsWorld();
    try {
      w.emu.faults.describeLagMs = 1_500;
      const m = machine("m_lag");
      const r = await untilSettled(w.provider, op("provision", m, 0));
      done(r.outcome);
      assert.equal(r.attempts, 1, "InvalidInstanceID.NotFound right after RunInstances is 'not listed yet', not an ambiguous attempt");
      assert.equal(count(w, "RunInstances"), 1, "one RunInstances call");
      assert.equal(w.emu.instances.size, 1);
      assert.ok(w.emu.errors.includes("DescribeInstances InvalidInstanceID.NotFound"), "EC2 did answer NotFound for the new id");
    } finally {
      await w.close();
    }
  });

  test("DescribeInstances lag: neither the ready check nor destroy takes an instance not listed yet for gone", async () => {
    const w = await awsWorld({ stepBudgetMs: 400 });
    try {
      w.emu.faults.describeLagMs = 2_500;
      const m = machine("m_unlisted");
      ambiguous(await w.provider.run(op("provision", m, 0)), "launched, not listed yet");
      const [inst] = w.emu.instances.values();
      assert.ok(inst && !w.emu.visible(inst), "the instance exists and is not listed yet");
      assert.deepEqual(await w.provider.checkMachines([{ ...m, state: "ready" }]), [], "not reported gone while EC2 does not list it yet");
      const destroy = op("destroy", m, 0);
      assert.match(ambiguous(await w.provider.run(destroy), "destroy while not listed"), /not listed by EC2 yet/);
      assert.equal(inst.state !== "terminated" && inst.state !== "shutting-down", true);
      done(await settled(w.provider, destroy));
      assert.equal(w.emu.calls.filter((c) => c === "TerminateInstances").length, 1, "terminated once it was listed");
      assert.equal(inst.state, "terminated");
      assert.deepEqual(w.emu.live(), [], "nothing left running");
    } finally {
      await w.close();
    }
  });

  test("DescribeInstances lag after a lost RunInstances reply: destroy at once does not take 'nothing by this token' for 'nothing launched'", async () => {
    const w = await awsWorld({ stepBudgetMs: 400 });
    try {
      w.emu.faults.describeLagMs = 2_000;
      w.emu.faults.lose.set("RunInstances", 1);
      const m = machine("m_lostunlisted");
      ambiguous(await w.provider.run(op("provision", m, 0)), "reply lost");
      const [inst] = w.emu.instances.values();
      assert.ok(inst && !w.emu.visible(inst), "launched, not listed yet");
      const destroy = op("destroy", m, 0);
      assert.match(ambiguous(await w.provider.run(destroy), "destroy while nothing is listed for the token"), /client token .* not listed by EC2 yet/);
      done(await settled(w.provider, destroy));
      assert.equal(inst.state, "terminated");
      assert.deepEqual(w.emu.live(), [], "nothing left running");
    } finally {
      await w.close();
    }
  });

  test("InvocationDoesNotExist right after SendCommand is still pending, not a failure and not a second send", async () => {
    const w = await awsWorld();
    try {
      const { m, target } = await provisioned(w, "m_invlag");
      w.emu.faults.invocationLagMs = 600;
      const k = generateSshKeyPair("i");
      const req = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_i", Date.now() + 600_000));
      done(await w.provider.run(req));
      assert.equal(invocationsFor(w, req.opId, "install_key").length, 1, "one command");
      assert.ok(w.emu.errors.includes("GetCommandInvocation InvocationDoesNotExist"), "the invocation was asked for while it did not exist yet");
      assert.equal((await ssh(target, k.privateKey, "echo ok")).out, "ok\n");
    } finally {
      await w.close();
    }
  });

  test("a Delayed invocation is still in progress: waited for, not sent again", async () => {
    const w = await awsWorld();
    try {
      const { m, instanceId } = await provisioned(w, "m_delayed");
      w.emu.faults.ssmDelayed.push(1_000);
      const k = generateSshKeyPair("d");
      const req = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_d", Date.now() + 600_000));
      const running = w.provider.run(req);
      await until("the invocation to be Delayed", () => invocationsFor(w, req.opId, "install_key")[0]?.status === "Delayed");
      done(await running);
      assert.equal(invocationsFor(w, req.opId, "install_key").length, 1, "one command");
      assert.equal(guestKeys(w.emu, instanceId, m.id).length, 1);
    } finally {
      await w.close();
    }
  });

  test("TimedOut (DeliveryTimedOut) ends that command: sent again once the agent answers, the key installed once", async () => {
    const w = await awsWorld({ stepBudgetMs: 1_500 });
    try {
      const { m, instanceId, target } = await provisioned(w, "m_timedout");
      const inst = w.emu.instances.get(instanceId)!;
      w.emu.faults.deliveryTimeoutMs = 300;
      inst.ssmOnline = false; // the agent lost its connection: commands queue, then time out
      const k = generateSshKeyPair("t");
      const req = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_t", Date.now() + 600_000));
      ambiguous(await w.provider.run(req), "agent offline");
      const first = invocationsFor(w, req.opId, "install_key");
      assert.ok(first.length >= 2, `a timed-out command was sent again within the call (${first.length})`);
      assert.ok(first.some((i) => i.status === "TimedOut" && i.details === "DeliveryTimedOut"), "TimedOut with StatusDetails DeliveryTimedOut");
      w.emu.faults.deliveryTimeoutMs = 0;
      inst.ssmOnline = true;
      done((await untilSettled(w.provider, req)).outcome);
      assert.equal(guestKeys(w.emu, instanceId, m.id).length, 1);
      assert.equal((await ssh(target, k.privateKey, "echo ok")).out, "ok\n");
    } finally {
      await w.close();
    }
  });

  test("TimedOut (ExecutionTimedOut): a run killed at its execution timeout is sent again and acts once", async () => {
    const w = await awsWorld({ stepBudgetMs: 6_000 });
    try {
      const { m, instanceId, target } = await provisioned(w, "m_exectimeout");
      w.emu.faults.executionTimeoutMs = 400;
      w.emu.faults.ssmSlowRuns.push(3_000);
      const k = generateSshKeyPair("x");
      const req = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_x", Date.now() + 600_000));
      done((await untilSettled(w.provider, req)).outcome);
      const runs = invocationsFor(w, req.opId, "install_key");
      assert.equal(runs.length, 2, "the killed run was followed by one more");
      assert.deepEqual([runs[0]!.status, runs[0]!.details], ["TimedOut", "ExecutionTimedOut"]);
      assert.equal(guestKeys(w.emu, instanceId, m.id).length, 1);
      assert.equal((await ssh(target, k.privateKey, "echo ok")).out, "ok\n");
    } finally {
      await w.close();
    }
  });

  test("a command cancelled by someone else (Cancelling, then Cancelled) ends that run; the step runs again and acts once", async () => {
    const w = await awsWorld({ stepBudgetMs: 6_000 });
    try {
      const { m, instanceId, target } = await provisioned(w, "m_cancel");
      w.emu.faults.ssmSlowRuns.push(2_000);
      w.emu.faults.cancelLagMs = 400;
      const k = generateSshKeyPair("c");
      const req = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_c", Date.now() + 600_000));
      const running = w.provider.run(req);
      await until("the command to run", () => invocationsFor(w, req.opId, "install_key")[0]?.status === "InProgress");
      const inv = invocationsFor(w, req.opId, "install_key")[0]!;
      await w.provider.clientsFor(REGION).ssm.send(new CancelCommandCommand({ CommandId: inv.commandId, InstanceIds: [instanceId] }));
      assert.equal(inv.status, "Cancelling");
      // Cancelling ends that run for the provider (it may still act; the guest lock keeps the two apart): it runs the step again.
      done(await running);
      assert.equal(invocationsFor(w, req.opId, "install_key").length, 2, "the cancelled run was followed by one more");
      await until("the cancelled run to end", () => inv.status === "Cancelled");
      assert.equal(guestKeys(w.emu, instanceId, m.id).length, 1);
      assert.equal((await ssh(target, k.privateKey, "echo ok")).out, "ok\n");
    } finally {
      await w.close();
    }
  });

  test("a reboot whose old boot goes on answering is not taken for the new boot", async () => {
    const w = await awsWorld({ stepBudgetMs: 4_000 });
    try {
      const { m, instanceId, boot } = await provisioned(w, "m_grace");
      w.emu.faults.rebootGraceMs = 1_200;
      w.emu.faults.rebootMs = 300;
      const req = op("fence", { ...m, generation: 1 }, 1);
      const r = done((await untilSettled(w.provider, req)).outcome);
      assert.equal(r.incarnationBefore, boot);
      assert.notEqual(r.incarnation, boot);
      assert.equal(r.incarnation, w.emu.instances.get(instanceId)!.bootId(), "the boot id reported is the instance's current one");
      const oldAnswers = invocationsFor(w, req.opId, "boot_id").filter((i) => {
        const g = parseGuestOutput(i.stdout);
        return g.kind === "result" && String(g.value.boot) === boot;
      });
      assert.ok(oldAnswers.length >= 1, "the old boot answered at least one boot id read after RebootInstances");
    } finally {
      await w.close();
    }
  });

  test("list calls in sparse pages (filters applied to each page): every instance is found; destroy ends only its own", async () => {
    const w = await awsWorld();
    try {
      const a = await provisioned(w, "m_page_a");
      const b = await provisioned(w, "m_page_b");
      const c = await provisioned(w, "m_page_c");
      w.emu.faults.pageSize = 1;
      const describes = count(w, "DescribeInstances");
      const r = done((await untilSettled(w.provider, op("destroy", b.m, 0))).outcome);
      assert.deepEqual(r.terminated, [b.instanceId]);
      assert.ok(count(w, "DescribeInstances") - describes >= 6, "the lookups went page by page");
      for (const x of [a, c]) assert.equal(w.emu.instances.get(x.instanceId)!.state, "running");
      assert.deepEqual(w.emu.errors.filter((e) => e.includes("InvalidParameterCombination")), [], "no call combines MaxResults with instance ids");
      const k = generateSshKeyPair("p");
      done((await untilSettled(w.provider, op("install_key", { ...c.m, generation: 1 }, 1, grantArgs(k.publicKey, "g_p", Date.now() + 600_000)))).outcome);
      assert.equal((await ssh(c.target, k.privateKey, "echo ok")).out, "ok\n");
    } finally {
      await w.close();
    }
  });

  test("IdempotentParameterMismatch (a retry under an edited config before the first instance is listed) launches nothing more", async () => {
    const w = await awsWorld({ stepBudgetMs: 400 });
    try {
      w.emu.faults.describeLagMs = 2_000;
      w.emu.faults.lose.set("RunInstances", 1);
      const m = machine("m_mismatch");
      const req = op("provision", m, 0);
      ambiguous(await w.provider.run(req), "reply lost");
      const edited = w.providerWith({ pool: { instanceType: "t3.small" } });
      assert.match(ambiguous(await edited.run(req), "token reused with other parameters"), /IdempotentParameterMismatch/);
      done(await settled(edited, req));
      assert.equal(w.emu.instances.size, 1, "one instance, the first launch's");
      assert.equal([...w.emu.instances.values()][0]!.instanceType, "t3.micro");
    } finally {
      await w.close();
    }
  });

  test("a spot interruption: the notice is readable on the instance, then it is terminated and the ready check names the cause", async () => {
    const w = await awsWorld();
    try {
      // Launched directly, to show the emulator's fault itself (aws-spot.test.ts launches spot pools through berth).
      const ec2 = w.provider.clientsFor(REGION).ec2;
      const out = await ec2.send(new RunInstancesCommand({ ImageId: "ami-0abc1234", InstanceType: "t3.micro", MinCount: 1, MaxCount: 1, InstanceMarketOptions: { MarketType: "spot" } }));
      const id = out.Instances![0]!.InstanceId!;
      assert.equal(out.Instances![0]!.InstanceLifecycle, "spot");
      const m = machine("m_spot");
      await w.provider.records.intend({ clientToken: "op_spot", machineId: m.id, org: m.org, pool: m.pool, region: REGION, deployment: "test", requestedAt: Date.now() });
      await w.provider.records.launched("op_spot", id, null);
      const inst = w.emu.instances.get(id)!;
      await until("the spot instance to run", () => inst.state === "running");
      w.emu.interruptSpot(inst, 300);
      assert.equal(inst.interruption?.action, "terminate");
      assert.equal(JSON.parse((await inst.run("cat latest/meta-data/spot/instance-action")).stdout).action, "terminate");
      await until("the interruption to terminate it", () => inst.state === "terminated");
      const lost = await w.provider.checkMachines([{ ...m, state: "ready" }]);
      assert.equal(lost.length, 1);
      assert.equal(lost[0]!.verdict, "gone");
      assert.match(lost[0]!.cause, /Server\.SpotInstanceTermination/);
    } finally {
      await w.close();
    }
  });
});
