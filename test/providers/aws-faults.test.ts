/**
 * The aws provider under each fault the EC2/SSM emulator injects: lost
 * replies, throttling, delayed, held and duplicated SSM deliveries, reboots
 * accepted but not performed, slow reboots, terminations that lag, and the
 * guest's own expiry with no coordinator involved. Each operation is run the
 * way the executor runs it: again with the same op id while it is ambiguous.
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { generateSshKeyPair } from "../../src/core/ssh-keys.js";
import { connect, execStreaming } from "../../src/cli/ssh-client.js";
import { guestProgram, parseGuestOutput } from "../../src/providers/aws/guest.js";
import { sweepOrphans } from "../../src/providers/aws/sweep.js";
import { commentFor } from "../../src/providers/aws/ssm.js";
import type { OperationOutcome } from "../../src/providers/provider.js";
import { awsWorld, done, guestKeys, machine, op, untilSettled, type AwsWorld } from "../helpers/aws.js";
import { grantArgs, ssh } from "./contract.js";
import { Writable } from "node:stream";

async function provisioned(w: AwsWorld, id: string, pool = "ci") {
  const m = machine(id, pool);
  const r = done((await untilSettled(w.provider, op("provision", m, 0))).outcome);
  return { m, instanceId: String(r.instanceId), target: { host: String(r.sshHost), port: Number(r.sshPort), user: m.id, hostKey: String(r.hostKey) }, boot: String(r.incarnation) };
}

function sendsFor(w: AwsWorld, opId: string, step: string): number {
  return [...w.emu.invocations.values()].filter((i) => i.comment === commentFor(opId, step as never)).length;
}

const quiet = () =>
  new Writable({
    write(_c, _e, cb) {
      cb();
    },
  });

function ambiguous(o: OperationOutcome, what: string): void {
  assert.equal(o.kind, "ambiguous", `${what}: expected ambiguous, got ${JSON.stringify(o)}`);
}

describe("aws provider under injected faults (emulator)", { timeout: 120_000 }, () => {
  test("a lost RunInstances reply is resolved by looking up the client token: one instance, one launch", async () => {
    const w = await awsWorld();
    try {
      w.emu.faults.lose.set("RunInstances", 1);
      const m = machine("m_lostlaunch");
      const req = op("provision", m, 0);
      ambiguous(await w.provider.run(req), "first attempt (reply lost)");
      assert.equal(w.emu.instances.size, 1, "the launch did happen");
      done(await w.provider.run(req));
      assert.equal(w.emu.calls.filter((c) => c === "RunInstances").length, 1, "no second launch: the retry found the instance by its ClientToken");
      assert.equal(w.emu.instances.size, 1);
    } finally {
      await w.close();
    }
  });

  test("throttled EC2 and SSM calls are ambiguous, then succeed on retry with one key installed", async () => {
    const w = await awsWorld();
    try {
      const { m } = await provisioned(w, "m_throttle");
      const k = generateSshKeyPair("t");
      w.emu.faults.throttle.set("DescribeInstances", 2);
      w.emu.faults.throttle.set("SendCommand", 1);
      const req = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_t", Date.now() + 600_000));
      const r = await untilSettled(w.provider, req);
      done(r.outcome);
      assert.ok(r.attempts >= 3, `throttling made earlier attempts ambiguous (${r.attempts})`);
      assert.equal(guestKeys(w.emu, [...w.emu.instances.keys()][0]!, m.id).filter((l) => l.includes("berth:g1:")).length, 1);
    } finally {
      await w.close();
    }
  });

  test("a lost SendCommand reply: the retry finds the command by its comment instead of sending another", async () => {
    const w = await awsWorld();
    try {
      const { m, instanceId, target } = await provisioned(w, "m_lostsend");
      const k = generateSshKeyPair("l");
      w.emu.faults.lose.set("SendCommand", 1);
      const req = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_l", Date.now() + 600_000));
      ambiguous(await w.provider.run(req), "reply lost");
      done(await w.provider.run(req));
      assert.equal(sendsFor(w, req.opId, "install_key"), 1, "one command for the op");
      assert.equal(guestKeys(w.emu, instanceId, m.id).length, 1);
      assert.equal((await ssh(target, k.privateKey, "echo in")).out, "in\n");
    } finally {
      await w.close();
    }
  });

  test("a duplicated SSM delivery acts once: the guest answers the op id from its record", async () => {
    const w = await awsWorld();
    try {
      const { m, instanceId } = await provisioned(w, "m_dup");
      const k = generateSshKeyPair("d");
      w.emu.faults.ssmDuplicates.push(0);
      const req = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_d", Date.now() + 600_000));
      done(await w.provider.run(req));
      await new Promise((r) => setTimeout(r, 500)); // the duplicate has run
      assert.deepEqual(guestKeys(w.emu, instanceId, m.id).length, 1, "one key line after two deliveries");
    } finally {
      await w.close();
    }
  });

  test("ambiguous SSM completion: a delivery slower than the budget is ambiguous, and the retry learns its answer", async () => {
    const w = await awsWorld({ stepBudgetMs: 1_000 });
    try {
      const { m, target } = await provisioned(w, "m_slow");
      const k = generateSshKeyPair("s");
      w.emu.faults.ssmDelays.push(1_500);
      const req = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_s", Date.now() + 600_000));
      const first = await w.provider.run(req);
      ambiguous(first, "still pending at the budget");
      assert.match((first as { error: string }).error, /still Pending/);
      done((await untilSettled(w.provider, req)).outcome);
      assert.equal(sendsFor(w, req.opId, "install_key"), 1);
      assert.equal((await ssh(target, k.privateKey, "echo ok")).out, "ok\n");
    } finally {
      await w.close();
    }
  });

  test("delayed SSM work of an old generation is refused by the guest: no key comes back", async () => {
    const w = await awsWorld({ stepBudgetMs: 800 });
    try {
      const { m, instanceId, target } = await provisioned(w, "m_stale");
      const k1 = generateSshKeyPair("old");
      const release = w.emu.holdNextSsm();
      const install = op("install_key", { ...m, generation: 1 }, 1, grantArgs(k1.publicKey, "g_old", Date.now() + 600_000));
      ambiguous(await w.provider.run(install), "install held in SSM");
      // The coordinator gives up on the install and cleans up generation 1 while the command is still queued.
      done((await untilSettled(w.provider, op("remove_key", { ...m, generation: 1 }, 1, { grantId: "g_old" }))).outcome);
      release();
      const inv = [...w.emu.invocations.values()].find((i) => i.comment === commentFor(install.opId, "install_key"))!;
      for (let i = 0; i < 200 && (inv.status === "Pending" || inv.status === "InProgress"); i++) await new Promise((r) => setTimeout(r, 50));
      assert.equal(inv.status, "Failed");
      assert.deepEqual(parseGuestOutput(inv.stdout), { kind: "refused", code: "generation_sealed", message: "the keys of generation 1 were already removed; a late install restores nothing" });
      assert.deepEqual(guestKeys(w.emu, instanceId, m.id), []);
      assert.equal((await ssh(target, k1.privateKey, "true")).ok, false);

      // And after generation 2 is installed, a held generation-1 command is refused as older.
      const k2 = generateSshKeyPair("new");
      done((await untilSettled(w.provider, op("install_key", { ...m, generation: 2 }, 2, grantArgs(k2.publicKey, "g_new", Date.now() + 600_000)))).outcome);
      const late = await untilSettled(w.provider, op("install_key", { ...m, generation: 1 }, 1, grantArgs(k1.publicKey, "g_old", Date.now() + 600_000), "op_lateinstall"));
      assert.equal(late.outcome.kind, "failed");
      assert.match((late.outcome as { error: string }).error, /generation_(mismatch|sealed)/);
      assert.equal(guestKeys(w.emu, instanceId, m.id).length, 1);
    } finally {
      await w.close();
    }
  });

  test("a reboot accepted but not performed is never reported fenced; the retry reboots and observes a new boot id", async () => {
    const w = await awsWorld({ stepBudgetMs: 3_000 });
    try {
      const { m, instanceId, boot } = await provisioned(w, "m_noreboot");
      w.emu.faults.rebootsIgnored = 1;
      const req = op("fence", { ...m, generation: 1 }, 1);
      const first = await w.provider.run(req);
      ambiguous(first, "reboot ignored");
      assert.match((first as { error: string }).error, /no new boot id observed/);
      assert.equal(w.emu.instances.get(instanceId)!.bootId(), boot, "the instance really did not reboot");
      const r = done((await untilSettled(w.provider, req)).outcome);
      assert.equal(r.incarnationBefore, boot);
      assert.notEqual(r.incarnation, boot);
      assert.equal(r.incarnation, w.emu.instances.get(instanceId)!.bootId());
    } finally {
      await w.close();
    }
  });

  test("a slow reboot: ambiguous while the instance is down, fenced once the new boot id is read", async () => {
    const w = await awsWorld({ stepBudgetMs: 3_000 });
    try {
      const { m, boot } = await provisioned(w, "m_slowreboot");
      w.emu.faults.rebootMs = 7_000;
      const req = op("fence", { ...m, generation: 1 }, 1);
      const r = await untilSettled(w.provider, req);
      const result = done(r.outcome);
      assert.ok(r.attempts >= 2, `the reboot outlasted one budget (${r.attempts} attempts)`);
      assert.notEqual(result.incarnation, boot);
      assert.equal(w.emu.calls.filter((c) => c === "RebootInstances").length, 1, "a retry after the reboot happened does not reboot again");
    } finally {
      await w.close();
    }
  });

  test("a termination that lags is ambiguous until the instance is observed terminated", async () => {
    const w = await awsWorld({ stepBudgetMs: 800 });
    try {
      const { m, instanceId } = await provisioned(w, "m_lag");
      w.emu.faults.terminateLagMs = 2_000;
      const req = op("destroy", m, 0);
      ambiguous(await w.provider.run(req), "still shutting-down");
      assert.equal(w.emu.instances.get(instanceId)!.state, "shutting-down");
      const r = done((await untilSettled(w.provider, req)).outcome);
      assert.deepEqual(r.terminated, [instanceId]);
      assert.equal(w.emu.instances.get(instanceId)!.state, "terminated");
      assert.deepEqual(w.emu.live(), []);
    } finally {
      await w.close();
    }
  });

  test("guest-side expiry: at the grant's expiry the guest removes the key and ends the session, with no coordinator call", async () => {
    const w = await awsWorld();
    try {
      const { m, instanceId, target } = await provisioned(w, "m_expiry");
      const k = generateSshKeyPair("e");
      done(await w.provider.run(op("install_key", { ...m, generation: 1 }, 1, grantArgs(k.publicKey, "g_e", Date.now() + 3_000))));
      const c = await connect({ ...target, privateKey: k.privateKey }, 5_000);
      const open = execStreaming(c, "sleep 300", { stdout: quiet(), stderr: quiet() });
      const calls = w.emu.calls.length;
      // A bound, not a timing check: it resolves as soon as the session ends (a loaded machine took over 10 s).
      let bound: NodeJS.Timeout | undefined;
      const ended = await Promise.race([open.then(() => "ended"), new Promise((r) => (bound = setTimeout(() => r("still open"), 60_000)))]);
      clearTimeout(bound);
      c.end();
      assert.equal(ended, "ended", "the open session ended at expiry");
      assert.equal(w.emu.calls.length, calls, "nothing called the cloud APIs meanwhile");
      assert.deepEqual(guestKeys(w.emu, instanceId, m.id), []);
      assert.equal((await ssh(target, k.privateKey, "true")).ok, false);
    } finally {
      await w.close();
    }
  });

  test("a guest program refuses to run on any instance but its own", async () => {
    const w = await awsWorld();
    try {
      const { m, instanceId } = await provisioned(w, "m_wrong");
      const inst = w.emu.instances.get(instanceId)!;
      const r = await inst.run(guestProgram({ opId: "op_wrong", instanceId: "i-0other", machineId: m.id, pool: "ci", generation: 1 }, { kind: "scrub" }));
      assert.equal(r.code, 3);
      assert.equal(parseGuestOutput(r.stdout).kind === "refused" && (parseGuestOutput(r.stdout) as { code: string }).code, "wrong_instance");
      const r2 = await inst.run(guestProgram({ opId: "op_wrong2", instanceId, machineId: "m_someoneelse", pool: "ci", generation: 1 }, { kind: "scrub" }));
      assert.equal((parseGuestOutput(r2.stdout) as { code: string }).code, "wrong_machine");
    } finally {
      await w.close();
    }
  });

  test("the sweep terminates instances of this deployment with no live machine record, and nothing else", async () => {
    const w = await awsWorld();
    try {
      const a = await provisioned(w, "m_keep");
      const b = await provisioned(w, "m_orphan");
      const report = await sweepOrphans(w.provider, async (ids) => new Set(ids.filter((id) => id === a.m.id)));
      assert.deepEqual(report.terminated, [b.instanceId]);
      assert.equal(w.emu.instances.get(a.instanceId)!.state, "running");
      assert.notEqual(w.emu.instances.get(b.instanceId)!.state, "running");
      const again = await sweepOrphans(w.provider, async () => new Set([a.m.id]));
      assert.deepEqual(again.terminated, []);
    } finally {
      await w.close();
    }
  });
});
